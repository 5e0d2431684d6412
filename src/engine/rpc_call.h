// RpcCall: one NFS procedure call as the engine sees it.
//
// The engine never looks inside a call. It owns where and when a call is
// sent (connection choice, in-flight limit, timeouts, retransmission,
// reconnect) and tells the call, exactly once, how it ended. The NFS layer
// (src/nfs/) implements RpcCall; it alone knows the libnfs argument and
// result types, so the engine compiles without libnfs headers.
//
// Thread safety: Issue() and Complete() run on the loop thread that owns the
// connection, never concurrently for one call.
#pragma once

#include <cstddef>
#include <string_view>

struct rpc_context;  // libnfs; opaque here

namespace mpnfs::engine {

// libnfs's rpc_cb signature.
using NativeCb = void (*)(struct rpc_context* rpc, int status, void* data, void* private_data);

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
  // Data bytes the call sends (WRITE payload) and asks for (READ count).
  virtual size_t BytesOut() const { return 0; }
  virtual size_t BytesIn() const { return 0; }
  // Queues the call on `ctx`; `cb(token)` must fire exactly once if this returns >= 0.
  virtual int Issue(struct rpc_context* ctx, NativeCb cb, void* token) = 0;
  // The final outcome, exactly once.
  virtual void Complete(const CallOutcome& outcome) = 0;
};

}  // namespace mpnfs::engine
