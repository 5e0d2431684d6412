// nfs::Client: the NFSv3 operations the filesystem layer uses, as an
// interface: the seam where network faults enter the filesystem's tests.
//
// The production implementation is Nfs3 (nfs3.h: the codecs of src/proto/
// over the multipath engine). Unit tests drive fs::Filesystem with an in-memory server model
// (test/fakes/fake_nfs.h) that can reorder, delay and drop replies and
// restart, losing UNSTABLE data under a new write verifier.
//
// Contract of every method, for every implementation:
//   - `cb` runs exactly once, with the reply or an Error carrying an errno;
//   - it runs on a thread that must not block (an engine loop thread), or,
//     for errors found before anything is sent, inline on the caller;
//   - pointers inside a reply (ReadReply::data) are valid only during `cb`;
//   - a WRITE's `buf` is kept alive by the implementation until `cb` runs.
// Nothing here orders calls: two calls in flight may execute and answer in
// any order. Ordering rules belong to the caller (fs/write_order.h).
//
// Thread safety: all methods are thread safe.
#pragma once

#include <functional>
#include <string>

#include "engine/cred.h"
#include "mpnfs/result.h"
#include "nfs/types.h"

namespace mpnfs::nfs {

using engine::Cred;

template <class T>
using Cb = std::function<void(Result<T>)>;

class Client {
 public:
  virtual ~Client() = default;

  // How many ways a large request is worth splitting now (idle connections).
  virtual int Parallelism() const = 0;

  virtual void Getattr(const Fh& fh, const Cred& c, Cb<Attr> cb) = 0;
  virtual void Setattr(const Fh& fh, const SetAttr& sa, const Cred& c, Cb<Wcc> cb) = 0;
  virtual void Lookup(const Fh& dir, const std::string& name, const Cred& c,
                      Cb<LookupReply> cb) = 0;
  virtual void Access(const Fh& fh, uint32_t mask, const Cred& c, Cb<AccessReply> cb) = 0;
  virtual void Readlink(const Fh& fh, const Cred& c, Cb<std::string> cb) = 0;
  virtual void Read(const Fh& fh, uint64_t off, uint32_t count, const Cred& c,
                    Cb<ReadReply> cb) = 0;
  // Sends buf[buf_off, buf_off+len) at file offset `off`; `stable`: FILE_SYNC.
  virtual void Write(const Fh& fh, uint64_t off, Buffer buf, size_t buf_off, size_t len,
                     bool stable, const Cred& c, Cb<WriteReply> cb) = 0;
  virtual void Commit(const Fh& fh, const Cred& c, Cb<CommitReply> cb) = 0;
  virtual void Create(const Fh& dir, const std::string& name, CreateMode mode, const SetAttr& sa,
                      uint64_t verf, const Cred& c, Cb<NewObject> cb) = 0;
  virtual void Mkdir(const Fh& dir, const std::string& name, const SetAttr& sa, const Cred& c,
                     Cb<NewObject> cb) = 0;
  virtual void Symlink(const Fh& dir, const std::string& name, const std::string& target,
                       const SetAttr& sa, const Cred& c, Cb<NewObject> cb) = 0;
  virtual void Mknod(const Fh& dir, const std::string& name, Ftype type, const SetAttr& sa,
                     uint32_t major, uint32_t minor, const Cred& c, Cb<NewObject> cb) = 0;
  virtual void Remove(const Fh& dir, const std::string& name, const Cred& c, Cb<Wcc> cb) = 0;
  virtual void Rmdir(const Fh& dir, const std::string& name, const Cred& c, Cb<Wcc> cb) = 0;
  virtual void Rename(const Fh& from_dir, const std::string& from, const Fh& to_dir,
                      const std::string& to, const Cred& c, Cb<RenameReply> cb) = 0;
  virtual void Link(const Fh& fh, const Fh& dir, const std::string& name, const Cred& c,
                    Cb<LinkReply> cb) = 0;
  virtual void Readdir(const Fh& dir, uint64_t cookie, uint64_t verf, uint32_t count,
                       const Cred& c, Cb<DirPage> cb) = 0;
  virtual void Readdirplus(const Fh& dir, uint64_t cookie, uint64_t verf, uint32_t dircount,
                           uint32_t maxcount, const Cred& c, Cb<DirPage> cb) = 0;
  virtual void Fsstat(const Fh& fh, const Cred& c, Cb<FsStat> cb) = 0;
};

}  // namespace mpnfs::nfs
