#include "nfs/libnfs_api.h"
#include "nfs/mount3.h"
#include "nfs/xdr_bounds.h"

#include <poll.h>

#include <memory>

namespace mpnfs::nfs {
namespace {

struct MountState {
  bool connected = false;
  bool done = false;
  Result<Fh> result = Error::Errno(EIO, "no answer");
};

std::string MountStatText(int st) {
  switch (st) {
    case MNT3ERR_NOENT: return "the server does not export this path (no such export)";
    // NFS-Ganesha answers ACCES for a path it does not export at all.
    case MNT3ERR_ACCES: return "not exported to this client, or access denied by the export list";
    case MNT3ERR_PERM: return "not permitted by the server";
    case MNT3ERR_NOTDIR: return "export path is not a directory";
    default: return mountstat3_to_str(st);
  }
}

int MountStatErrno(int st) {
  switch (st) {
    case MNT3ERR_NOENT: return ENOENT;
    case MNT3ERR_ACCES: return EACCES;
    case MNT3ERR_PERM: return EPERM;
    case MNT3ERR_NOTDIR: return ENOTDIR;
    default: return EIO;
  }
}

void MntCb(struct rpc_context* /*rpc*/, int status, void* data, void* priv) {
  auto* s = static_cast<MountState*>(priv);
  s->done = true;
  if (status != RPC_STATUS_SUCCESS) {
    s->result = Error::Errno(EIO, std::string("MOUNT call failed: ") +
                                      (data != nullptr ? static_cast<const char*>(data) : "?"));
    return;
  }
  auto* res = static_cast<mountres3*>(data);
  if (res->fhs_status != MNT3_OK) {
    s->result = Error::Errno(MountStatErrno(res->fhs_status), MountStatText(res->fhs_status));
    return;
  }
  const auto& fh = res->mountres3_u.mountinfo.fhandle;
  s->result = Fh(fh.fhandle3_val, fh.fhandle3_len);
}

struct ConnectCtx {
  MountState* state;
  std::string export_path;
};

void ConnectCb(struct rpc_context* rpc, int status, void* data, void* priv) {
  auto* c = static_cast<ConnectCtx*>(priv);
  if (status != RPC_STATUS_SUCCESS) {
    c->state->done = true;
    c->state->result = Error::Errno(
        EHOSTUNREACH, std::string("cannot reach the MOUNT service: ") +
                          (data != nullptr ? static_cast<const char*>(data) : "connect failed"));
    return;
  }
  c->state->connected = true;
  if (rpc_mount3_mnt_async(rpc, &MntCb, c->export_path.data(), c->state) != 0) {
    c->state->done = true;
    c->state->result = Error::Errno(EIO, std::string("MOUNT: ") + rpc_get_error(rpc));
  }
}

}  // namespace

Result<Fh> MountExport(const std::string& host, int mount_port, const std::string& export_path,
                       std::chrono::milliseconds timeout) {
  CheckXdrBounds();  // libnfs decodes the MOUNT reply with the bounded primitives
  // Declared before the context: destroying the context calls back what is
  // still pending (a timed-out connect or MOUNT), and those callbacks write
  // here, so this must outlive it.
  MountState state;
  ConnectCtx ctx{&state, export_path};
  std::unique_ptr<struct rpc_context, void (*)(struct rpc_context*)> rpc(rpc_init_context(),
                                                                         &rpc_destroy_context);
  if (!rpc) return Error::Errno(ENOMEM, "cannot create an RPC context");
  int rc = mount_port > 0 ? rpc_connect_port_async(rpc.get(), host.c_str(), mount_port,
                                                   MOUNT_PROGRAM, MOUNT_V3, &ConnectCb, &ctx)
                          : rpc_connect_program_async(rpc.get(), host.c_str(), MOUNT_PROGRAM,
                                                      MOUNT_V3, &ConnectCb, &ctx);
  if (rc != 0) return Error::Errno(EHOSTUNREACH, rpc_get_error(rpc.get()));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!state.done) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return Error::Errno(ETIMEDOUT, state.connected
                                         ? "the MOUNT service did not answer in time"
                                         : "server unreachable (no connection within the "
                                           "mount timeout)");
    }
    pollfd p{rpc_get_fd(rpc.get()), static_cast<short>(rpc_which_events(rpc.get())), 0};
    int n = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 100)));
    if (n < 0 && errno != EINTR) return Error::Errno(errno, "poll");
    if (rpc_service(rpc.get(), n > 0 ? p.revents : 0) < 0 && !state.done) {
      return Error::Errno(ECONNREFUSED, std::string("cannot reach the server: ") +
                                            rpc_get_error(rpc.get()));
    }
  }
  Result<Fh> out = std::move(state.result);
  return out;
}

}  // namespace mpnfs::nfs
