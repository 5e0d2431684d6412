// LibnfsTransport: engine::Transport over one libnfs 4.0 rpc_context.
//
// Every libnfs call of the gateway lives in this directory. This class uses
// only the raw async API: rpc_connect_port_async (no portmapper: the NFS port
// is known; see local_bind.h for binding the client side), rpc_service driven by the engine's loop, and the calls' own
// rpc_nfs3_*_async. libnfs's auto-reconnect is off (it would replay
// non-idempotent calls); so are its timeouts: the engine owns both.
//
// Credentials: before each call whose Cred differs from the previous one the
// context gets a fresh AUTH_SYS authenticator (rpc_set_auth), so each call
// carries its caller's uid, gid and groups. The XID is set per call
// (rpc_set_next_xid) so that a retransmission reuses its XID.
//
// Thread safety: used by one loop thread only, like the context it wraps.
#pragma once

#include <string>

#include "engine/transport.h"

namespace mpnfs::nfs {

class LibnfsTransport final : public engine::Transport {
 public:
  LibnfsTransport(engine::TransportSink* sink, int tcp_user_timeout_ms);
  ~LibnfsTransport() override;

  bool StartConnect(const engine::Endpoint& ep, std::string* error) override;
  int Fd() const override;
  int Events() const override;
  bool Service(int revents) override;
  int Issue(engine::RpcCall& call, uint32_t xid, const engine::Cred& cred,
            engine::CallToken* token) override;
  int IssueProbe(uint32_t xid, engine::CallToken* token) override;
  int64_t SilentMs() const override;
  void Close() override;
  std::string LastError() const override;

 private:
  static void ConnectCb(struct rpc_context* rpc, int status, void* data, void* priv);
  static void ReplyCb(struct rpc_context* rpc, int status, void* data, void* priv);

  engine::TransportSink* const sink_;
  const int tcp_user_timeout_ms_;
  struct rpc_context* rpc_ = nullptr;
  engine::Cred cred_;
  bool have_cred_ = false;
  std::string last_error_;
};

}  // namespace mpnfs::nfs
