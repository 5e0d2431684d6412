// NFSv3 values in the gateway's own types.
//
// The filesystem layer works with these, never with wire structs. The
// protocol codecs (src/proto/) encode and decode them directly.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mpnfs::nfs {

using Fh = std::string;  // opaque file handle bytes (<= 64)

// Data of a WRITE: a heap buffer that is not zero-filled on creation (it is
// filled at once), shared so that the call can be resent after a failure.
class Bytes {
 public:
  explicit Bytes(size_t n) : data_(new char[n]), size_(n) {}
  char* data() { return data_.get(); }
  const char* data() const { return data_.get(); }
  size_t size() const { return size_; }

 private:
  std::unique_ptr<char[]> data_;
  size_t size_;
};
using Buffer = std::shared_ptr<const Bytes>;

enum class Ftype : uint8_t { kNone = 0, kReg, kDir, kBlk, kChr, kLnk, kSock, kFifo };

struct Time {
  uint32_t sec = 0;
  uint32_t nsec = 0;
  bool operator==(const Time&) const = default;
  auto operator<=>(const Time&) const = default;
};

struct Attr {
  Ftype type = Ftype::kNone;
  uint32_t mode = 0;  // permission bits incl. suid/sgid/sticky (no type bits)
  uint32_t nlink = 0;
  uint32_t uid = 0, gid = 0;
  uint64_t size = 0, used = 0;
  uint32_t rdev_major = 0, rdev_minor = 0;
  uint64_t fsid = 0, fileid = 0;
  Time atime, mtime, ctime;
  bool operator==(const Attr&) const = default;
};

// What a SETATTR changes; unset members are left alone.
struct SetAttr {
  std::optional<uint32_t> mode, uid, gid;
  std::optional<uint64_t> size;
  enum class TimeHow { kDontChange, kServer, kClient };
  TimeHow atime_how = TimeHow::kDontChange, mtime_how = TimeHow::kDontChange;
  Time atime, mtime;
  bool operator==(const SetAttr&) const = default;
};

// Weak cache consistency data: attributes before and after an operation.
struct Wcc {
  struct Before {
    uint64_t size;
    Time mtime, ctime;
    bool operator==(const Before&) const = default;
  };
  std::optional<Before> before;
  std::optional<Attr> after;
  bool operator==(const Wcc&) const = default;
};

struct NewObject {  // CREATE, MKDIR, SYMLINK, MKNOD
  std::optional<Fh> fh;
  std::optional<Attr> attr;
  Wcc dir;
  // What the name held when a reissued call was answered EEXIST
  // (nfs/reissue.h): made by our first call, or there before it.
  bool looked_up = false;
  bool operator==(const NewObject&) const = default;
};

struct LookupReply {
  Fh fh;
  std::optional<Attr> attr;
  std::optional<Attr> dir;
  bool operator==(const LookupReply&) const = default;
};

struct ReadReply {  // data points into the RPC receive buffer: valid only inside the callback
  const char* data = nullptr;
  size_t len = 0;
  bool eof = false;
  std::optional<Attr> attr;
};

struct WriteReply {
  uint32_t count = 0;
  bool stable = false;  // committed FILE_SYNC/DATA_SYNC by the server
  uint64_t verf = 0;
  Wcc wcc;
};

struct CommitReply {
  uint64_t verf = 0;
  Wcc wcc;
};

// The rule for data written UNSTABLE (RFC 1813, 3.3.21): it is on stable
// storage once a COMMIT answers with the verifier its WRITE got. Any other
// verifier means the server restarted in between and may have lost it:
// whoever holds the data writes it again at once, FILE_SYNC (the
// filesystem's kept writes: fs/file_writes.h, Lost; the write-back cache's
// flusher: fs/flusher.cc).
inline bool CommitCovers(const WriteReply& w, const CommitReply& c) { return w.verf == c.verf; }
inline bool CommitCovers(uint64_t write_verf, const CommitReply& c) { return write_verf == c.verf; }

struct DirEntry {
  uint64_t fileid = 0;
  std::string name;
  uint64_t cookie = 0;
  std::optional<Attr> attr;  // READDIRPLUS only
  std::optional<Fh> fh;      // READDIRPLUS only
  bool operator==(const DirEntry&) const = default;
};

struct DirPage {
  uint64_t verf = 0;
  bool eof = false;
  std::vector<DirEntry> entries;
  std::optional<Attr> dir;
  bool operator==(const DirPage&) const = default;
};

struct FsStat {
  uint64_t tbytes = 0, fbytes = 0, abytes = 0, tfiles = 0, ffiles = 0, afiles = 0;
  bool operator==(const FsStat&) const = default;
};

struct FsInfo {
  uint32_t rtmax = 0, rtpref = 0, wtmax = 0, wtpref = 0, dtpref = 0;
  uint64_t maxfilesize = 0;
  Time time_delta;
  bool operator==(const FsInfo&) const = default;
};

struct PathConf {
  uint32_t linkmax = 0, name_max = 255;
  bool operator==(const PathConf&) const = default;
};

struct RenameReply {
  Wcc from, to;
  bool operator==(const RenameReply&) const = default;
};

struct LinkReply {
  std::optional<Attr> attr;
  Wcc dir;
  bool operator==(const LinkReply&) const = default;
};

struct AccessReply {
  uint32_t access = 0;
  std::optional<Attr> attr;
  bool operator==(const AccessReply&) const = default;
};

enum class CreateMode { kUnchecked, kGuarded, kExclusive };

// NFSv3 ACCESS bits (RFC 1813).
inline constexpr uint32_t kAccessRead = 0x01, kAccessLookup = 0x02, kAccessModify = 0x04,
                          kAccessExtend = 0x08, kAccessDelete = 0x10, kAccessExecute = 0x20;

}  // namespace mpnfs::nfs
