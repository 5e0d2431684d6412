// Nfs3: typed, asynchronous NFSv3 procedures on top of the path engine.
//
// Each method builds one RpcCall (arguments owned by the call, so the engine
// can retransmit it), submits it, and later calls `cb` exactly once on a loop
// thread with the converted reply or an Error carrying an errno. Callbacks
// must not block: they run on the thread that drives the connection.
//
// Non-idempotent calls sent again after their connection broke (the engine
// flags them `reissued`) may have executed the first time: what their
// answer then means is the table in nfs/reissue.h, applied here where the
// reply is decoded.
//
// Thread safety: all methods are thread safe.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "mpnfs/result.h"
#include "nfs/client.h"
#include "nfs/types.h"

namespace mpnfs::proto::nfs3 {
struct NewObjectRes;
}  // namespace mpnfs::proto::nfs3

namespace mpnfs::nfs {

class Nfs3 final : public Client {
 public:
  // `defaults`: the SubmitOptions of every call made through the Client
  // interface (e.g. a path pin: an Nfs3 whose calls all go over one path).
  // The methods with an explicit `so` parameter (Null, Fsinfo, Pathconf and
  // the Getattr/Fsstat overloads taking one) use the `so` given instead.
  explicit Nfs3(engine::Engine& engine, engine::SubmitOptions defaults = {});

  // How many ways a large request is worth splitting now (see Engine::IdleConnections).
  int Parallelism() const override { return engine_.IdleConnections(); }

  void Null(const Cred& c, Cb<Ok> cb, engine::SubmitOptions so = {});
  void Getattr(const Fh& fh, const Cred& c, Cb<Attr> cb) override {
    Getattr(fh, c, std::move(cb), defaults_);
  }
  void Getattr(const Fh& fh, const Cred& c, Cb<Attr> cb, engine::SubmitOptions so);
  void Setattr(const Fh& fh, const SetAttr& sa, const Cred& c, Cb<Wcc> cb) override;
  void Lookup(const Fh& dir, const std::string& name, const Cred& c, Cb<LookupReply> cb) override;
  void Access(const Fh& fh, uint32_t mask, const Cred& c, Cb<AccessReply> cb) override;
  void Readlink(const Fh& fh, const Cred& c, Cb<std::string> cb) override;
  // ReadReply::data is valid only during the callback.
  void Read(const Fh& fh, uint64_t off, uint32_t count, const Cred& c, Cb<ReadReply> cb) override;
  void Write(const Fh& fh, uint64_t off, Buffer buf, size_t buf_off, size_t len, bool stable,
             const Cred& c, Cb<WriteReply> cb) override;
  void Commit(const Fh& fh, const Cred& c, Cb<CommitReply> cb) override;
  void Create(const Fh& dir, const std::string& name, CreateMode mode, const SetAttr& sa,
              uint64_t verf, const Cred& c, Cb<NewObject> cb) override;
  void Mkdir(const Fh& dir, const std::string& name, const SetAttr& sa, const Cred& c,
             Cb<NewObject> cb) override;
  void Symlink(const Fh& dir, const std::string& name, const std::string& target,
               const SetAttr& sa, const Cred& c, Cb<NewObject> cb) override;
  void Mknod(const Fh& dir, const std::string& name, Ftype type, const SetAttr& sa,
             uint32_t major, uint32_t minor, const Cred& c, Cb<NewObject> cb) override;
  void Remove(const Fh& dir, const std::string& name, const Cred& c, Cb<Wcc> cb) override;
  void Rmdir(const Fh& dir, const std::string& name, const Cred& c, Cb<Wcc> cb) override;
  void Rename(const Fh& from_dir, const std::string& from, const Fh& to_dir,
              const std::string& to, const Cred& c, Cb<RenameReply> cb) override;
  void Link(const Fh& fh, const Fh& dir, const std::string& name, const Cred& c,
            Cb<LinkReply> cb) override;
  void Readdir(const Fh& dir, uint64_t cookie, uint64_t verf, uint32_t count, const Cred& c,
               Cb<DirPage> cb) override;
  void Readdirplus(const Fh& dir, uint64_t cookie, uint64_t verf, uint32_t dircount,
                   uint32_t maxcount, const Cred& c, Cb<DirPage> cb) override;
  void Fsstat(const Fh& fh, const Cred& c, Cb<FsStat> cb) override {
    Fsstat(fh, c, std::move(cb), defaults_);
  }
  void Fsstat(const Fh& fh, const Cred& c, Cb<FsStat> cb, engine::SubmitOptions so);
  void Fsinfo(const Fh& fh, const Cred& c, Cb<FsInfo> cb, engine::SubmitOptions so = {});
  void Pathconf(const Fh& fh, const Cred& c, Cb<PathConf> cb, engine::SubmitOptions so = {});

  engine::Engine& engine() { return engine_; }

 private:
  std::function<void(const engine::CallOutcome&, proto::nfs3::NewObjectRes*)> NewObjectDone(
      const char* op, Cb<NewObject> cb, const Fh& dir, const std::string& name, const Cred& c,
      bool lookup_on_reissued_exist);
  void NewObjectOrLookup(const Fh& dir, const std::string& name, const Cred& c,
                         Cb<NewObject> cb);
  engine::Engine& engine_;
  const engine::SubmitOptions defaults_;
};

}  // namespace mpnfs::nfs
