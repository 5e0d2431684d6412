#include "nfs/libnfs_api.h"
#include "nfs/libnfs_transport.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "nfs/local_bind.h"

namespace mpnfs::nfs {

LibnfsTransport::LibnfsTransport(engine::TransportSink* sink, int tcp_user_timeout_ms)
    : sink_(sink), tcp_user_timeout_ms_(tcp_user_timeout_ms) {}

LibnfsTransport::~LibnfsTransport() { Close(); }

bool LibnfsTransport::StartConnect(const engine::Endpoint& ep, std::string* error) {
  rpc_ = rpc_init_context();
  if (rpc_ == nullptr) {
    *error = "cannot create an RPC context";
    return false;
  }
  if (rpc_connect_port_async(rpc_, ep.host.c_str(), ep.port, NFS_PROGRAM, NFS_V3, &ConnectCb,
                             this) != 0) {
    *error = rpc_get_error(rpc_);
    last_error_ = *error;
    return false;
  }
  int fd = rpc_get_fd(rpc_);
  if (!ep.local.empty()) {
    // See nfs/local_bind.h: our bound socket replaces libnfs's under its number.
    auto b = ResolveLocal(ep.local);
    Result<int> mine = b ? ConnectFrom(*b, ep.host, ep.port) : Result<int>(b.error());
    if (!mine || dup2(*mine, fd) < 0) {
      *error = mine ? std::string("dup2: ") + strerror(errno) : mine.error().what;
      if (mine) close(*mine);
      last_error_ = *error;
      return false;
    }
    close(*mine);
  }
  if (fd >= 0 && tcp_user_timeout_ms_ > 0) {
    unsigned int t = static_cast<unsigned int>(tcp_user_timeout_ms_);
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &t, sizeof(t));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    int idle = std::max(1, tcp_user_timeout_ms_ / 3000);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &idle, sizeof(idle));
  }
  return true;
}

int LibnfsTransport::IssueProbe(uint32_t xid, engine::CallToken* token) {
  if (rpc_ == nullptr) return -1;
  rpc_set_next_xid(rpc_, xid);
  if (rpc_nfs3_null_async(rpc_, &ReplyCb, token) != 0) {
    last_error_ = rpc_get_error(rpc_);
    return -1;
  }
  return 0;
}

int64_t LibnfsTransport::SilentMs() const {
  if (rpc_ == nullptr) return -1;
  tcp_info ti{};
  socklen_t len = sizeof(ti);
  if (getsockopt(rpc_get_fd(rpc_), IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) return -1;
  // Any segment from the peer (data or a bare ACK of ours) counts.
  return std::min(ti.tcpi_last_ack_recv, ti.tcpi_last_data_recv);
}

void LibnfsTransport::ConnectCb(struct rpc_context* /*rpc*/, int status, void* data, void* priv) {
  auto* self = static_cast<LibnfsTransport*>(priv);
  if (status == RPC_STATUS_SUCCESS) {
    self->sink_->OnConnected(true, {});
  } else {
    self->last_error_ = data != nullptr ? static_cast<const char*>(data) : "connect failed";
    self->sink_->OnConnected(false, self->last_error_);
  }
}

int LibnfsTransport::Fd() const { return rpc_ != nullptr ? rpc_get_fd(rpc_) : -1; }

int LibnfsTransport::Events() const { return rpc_ != nullptr ? rpc_which_events(rpc_) : 0; }

bool LibnfsTransport::Service(int revents) {
  if (rpc_ == nullptr) return false;
  if (rpc_service(rpc_, revents) < 0) {
    const char* e = rpc_get_error(rpc_);
    last_error_ = e != nullptr && *e != '\0' ? e : "connection broken";
    return false;
  }
  return true;
}

int LibnfsTransport::Issue(engine::RpcCall& call, uint32_t xid, const engine::Cred& cred,
                           engine::CallToken* token) {
  if (rpc_ == nullptr) return -1;
  if (!have_cred_ || !(cred == cred_)) {
    std::vector<uint32_t> groups = cred.groups;
    struct AUTH* auth = libnfs_authunix_create("mpnfs", cred.uid, cred.gid,
                                               static_cast<uint32_t>(groups.size()),
                                               groups.empty() ? nullptr : groups.data());
    if (auth == nullptr) {
      last_error_ = "cannot create AUTH_SYS credentials";
      return -1;
    }
    rpc_set_auth(rpc_, auth);  // takes ownership, frees the previous one
    cred_ = cred;
    have_cred_ = true;
  }
  rpc_set_next_xid(rpc_, xid);
  int rc = call.Issue(rpc_, &ReplyCb, token);
  if (rc < 0) last_error_ = rpc_get_error(rpc_);
  return rc;
}

void LibnfsTransport::ReplyCb(struct rpc_context* /*rpc*/, int status, void* data, void* priv) {
  auto* token = static_cast<engine::CallToken*>(priv);
  engine::ReplyStatus st;
  const char* err = nullptr;
  switch (status) {
    case RPC_STATUS_SUCCESS:
      st = engine::ReplyStatus::kSuccess;
      break;
    case RPC_STATUS_CANCEL:
      st = engine::ReplyStatus::kCancel;
      break;
    default:
      st = engine::ReplyStatus::kError;
      err = static_cast<const char*>(data);
      break;
  }
  token->sink->OnReply(token, st, st == engine::ReplyStatus::kSuccess ? data : nullptr, err);
}

void LibnfsTransport::Close() {
  if (rpc_ == nullptr) return;
  struct rpc_context* rpc = rpc_;
  // Aborted, not closed: a graceful close leaves the kernel retransmitting
  // what the socket still holds (for up to tcp_timeout), so a call the
  // engine has given up on and resends elsewhere could still reach the
  // server after the resend, once the link is back. A reset drops it.
  if (const int fd = rpc_get_fd(rpc); fd >= 0) {
    const linger abort_on_close{1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &abort_on_close, sizeof(abort_on_close));
  }
  // Destroying the context fires the callbacks of every pending call
  // (kCancel); the sink must not queue new calls on this transport from them.
  rpc_destroy_context(rpc);
  rpc_ = nullptr;
}

std::string LibnfsTransport::LastError() const { return last_error_; }

}  // namespace mpnfs::nfs
