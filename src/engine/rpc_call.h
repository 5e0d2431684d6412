// RpcCall: one NFS procedure call as the engine sees it.
//
// The engine never looks inside a call. It owns where and when a call is
// sent (connection choice, in-flight limit, timeouts, retransmission,
// reconnect) and tells the call, exactly once, how it ended. The NFS layer
// (src/nfs/) implements RpcCall; it alone knows the argument and result
// types and their codecs (src/proto/); the engine sees only the XDR
// streams.
// The transport frames a call (RPC header, credentials) and hands its
// argument encoding and reply decoding to the call. For the
// statistics a call says which procedure it is (Procedure(), WRITE's
// Stability()) and sums up a decoded reply (Summarize()); the engine counts
// per procedure from that, nothing more.
//
// Thread safety: EncodeArgs(), DecodeResult() and Complete() run on the loop
// thread that owns the connection (EncodeArgs() also on a submitting thread
// in a direct section, event_loop.h). One call may be encoded on one loop
// while another decodes a late reply to it (a call sent again after
// NFS3ERR_JUKEBOX): both must only read the call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace mpnfs::proto {
class XdrIn;
class XdrOut;
}  // namespace mpnfs::proto

namespace mpnfs::engine {

// The room a transport gives RpcCall::DecodeResult().
inline constexpr size_t kMaxResultSize = 1024;

// The NFSv3 procedures (RFC 1813 numbers), plus kOther for a call that does
// not say. Indexes the engine's per-procedure statistics.
enum class Proc : uint8_t {
  kNull = 0, kGetattr, kSetattr, kLookup, kAccess, kReadlink, kRead, kWrite, kCreate, kMkdir,
  kSymlink, kMknod, kRemove, kRmdir, kRename, kLink, kReaddir, kReaddirplus, kFsstat, kFsinfo,
  kPathconf, kCommit, kOther,
};
inline constexpr int kProcCount = static_cast<int>(Proc::kOther) + 1;

// Whether a call of `p` changes the server's state (so that executing it
// late, after newer calls, could undo what they did). COMMIT only makes
// durable what is there; kOther is not an NFS procedure.
inline constexpr bool ChangesState(Proc p) {
  switch (p) {
    case Proc::kSetattr: case Proc::kWrite: case Proc::kCreate: case Proc::kMkdir:
    case Proc::kSymlink: case Proc::kMknod: case Proc::kRemove: case Proc::kRmdir:
    case Proc::kRename: case Proc::kLink:
      return true;
    default:
      return false;
  }
}

// "READ", "WRITE", ... ("OTHER" for kOther).
inline const char* ProcName(Proc p) {
  static constexpr const char* kNames[kProcCount] = {
      "NULL", "GETATTR", "SETATTR", "LOOKUP", "ACCESS", "READLINK", "READ", "WRITE",
      "CREATE", "MKDIR", "SYMLINK", "MKNOD", "REMOVE", "RMDIR", "RENAME", "LINK",
      "READDIR", "READDIRPLUS", "FSSTAT", "FSINFO", "PATHCONF", "COMMIT", "OTHER"};
  const int i = static_cast<int>(p);
  return i >= 0 && i < kProcCount ? kNames[i] : "OTHER";
}

// WRITE's stable_how (RFC 1813 values).
enum class Stability : uint8_t { kUnstable = 0, kDataSync = 1, kFileSync = 2 };
inline constexpr int kStabilityCount = 3;

// What the statistics take from a decoded reply.
struct ReplySummary {
  int nfs_status = 0;        // nfsstat3; 0 is NFS3_OK
  int64_t data_bytes = -1;   // READ: bytes the reply carries; -1: take BytesIn()
};

enum class CallStatus {
  kOk,        // the server replied; `result` is the decoded reply
  kTimedOut,  // soft mount: no reply within timeo x (retrans + 1)
  kFailed,    // the RPC layer rejected the call (garbage args, program unavailable, ...)
  kShutdown,  // the engine is stopping
};

struct CallOutcome {
  CallStatus status;
  void* result = nullptr;   // valid only during Complete() (points into the receive buffer)
  bool reissued = false;    // sent again on a new connection: it may have executed before
  std::string_view error;   // detail for kFailed / kTimedOut
};

class RpcCall {
 public:
  virtual ~RpcCall() = default;

  virtual const char* Name() const = 0;
  // The procedure, for the statistics (kOther if not told).
  virtual Proc Procedure() const { return Proc::kOther; }
  // A call of a program other than NFSv3 (the lock manager) says what it
  // is sent as; an NFSv3 call is sent as Procedure() says.
  struct Program {
    uint32_t prog = 0, vers = 0, proc = 0;
  };
  virtual std::optional<Program> OtherProgram() const { return std::nullopt; }
  // WRITE only: how the data is to be committed.
  virtual Stability WriteStability() const { return Stability::kUnstable; }
  // The status (and data size) of a decoded reply; `result` as Complete()
  // will get it, valid for this call only. Must not keep or change it.
  virtual ReplySummary Summarize(const void* /*result*/) const { return {}; }
  // Data bytes the call sends (WRITE payload) and asks for (READ count).
  virtual size_t BytesOut() const { return 0; }
  virtual size_t BytesIn() const { return 0; }
  // Encodes the procedure's arguments (RFC 1813) at the stream's position.
  // A call with a Payload() encodes everything before it, up to and
  // including the payload's length word. false: they do not fit.
  virtual bool EncodeArgs(proto::XdrOut& x) = 0;
  // WRITE only: the data, sent after the encoded arguments straight from the
  // call's own buffer (no copy), then padded to 4 bytes. It must stay
  // unchanged and alive as long as a transport holds the call (Transport::
  // Issue), which may be after Complete(): a retransmission still queued.
  virtual std::span<const char> Payload() const { return {}; }
  // Decodes a reply's result from `x` (positioned after the RPC reply
  // header) into `result`: kMaxResultSize bytes of the transport's, aligned
  // for any type, where it constructs its result object. false: the reply
  // does not decode (nothing is left constructed). `result` is what
  // Summarize() and Complete() get; data it decodes in place points into
  // the receive buffer. Once they ran, the transport calls DestroyResult()
  // and reuses the buffer. Called for every reply the transport matches,
  // also one that comes after the call completed; it must touch nothing of
  // the call's but its arguments.
  virtual bool DecodeResult(proto::XdrIn& x, void* result) = 0;
  // Destroys what a DecodeResult() that returned true constructed.
  virtual void DestroyResult(void* /*result*/) {}
  // The final outcome, exactly once.
  virtual void Complete(const CallOutcome& outcome) = 0;
};

}  // namespace mpnfs::engine
