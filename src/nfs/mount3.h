// The calls made outside the mount's NFS engine: MountExport asks the
// server's MOUNT v3 service for an export's root file handle (at mount
// time); LockManagerPort finds the server's lock manager (at mount time, and
// again while it cannot be reached: cli/lock_service.h); NotifyRestart tells
// the server's status monitor that this client restarted.
//
// Each call goes over an engine of its own (engine/engine.h) with one
// connection to the service's port, made as the mount's paths make theirs
// (RpcTransport: bound to the path's `local=`, from a reserved port when
// allowed; TCP_USER_TIMEOUT at the engine's default), encoded and decoded by proto/mount3.h and
// proto/nsm.h. The engine retransmits a call left unanswered (same XID,
// same connection) after a quarter of the time given, and ends it at the
// deadline; a connection refused or lost ends it at once, so the caller
// can try its next address. Their connections log to the "setup" layer
// (common/log.h); the callers log what failed.
//
// Errors carry a message meant for the command line: ECONNREFUSED (refused,
// closed before the reply, or not registered with the portmapper),
// EHOSTUNREACH (no connection otherwise), ETIMEDOUT, EIO (an RPC-level
// rejection or a reply that does not decode), EAGAIN (out of threads or
// descriptors for the call's engine), ENODEV/EADDRNOTAVAIL (a bad
// `local`), or MOUNT's own status as an errno.
//
// Each call, and how it ended, is counted in `counters` if given
// (nfs/service_stats.h: PORTMAP, MOUNT, NSM).
//
// Thread safety: plain blocking functions, from any thread but an engine
// loop thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "mpnfs/result.h"
#include "nfs/service_stats.h"
#include "nfs/types.h"

namespace mpnfs::nfs {

// mount_port 0: ask the server's portmapper (port 111) where MOUNT listens.
// `local`: the path's local= (an interface or address), or empty.
Result<Fh> MountExport(const std::string& host, int mount_port, const std::string& export_path,
                       std::chrono::milliseconds timeout, const std::string& local = "",
                       ServiceCounters* counters = nullptr);

// The TCP port of the server's NLM v4 service (ENOENT: none registered);
// `local_addr`, if given, gets this client's address toward the server.
Result<int> LockManagerPort(const std::string& host, std::chrono::milliseconds timeout,
                            const std::string& local = "", std::string* local_addr = nullptr,
                            ServiceCounters* counters = nullptr);

// SM_NOTIFY to the server's status monitor: the host at this client's
// address toward the server (what the server's lock manager knows it by)
// restarted, its NSM state now `state`; the server then drops the locks it
// held for that address. Returns that address.
Result<std::string> NotifyRestart(const std::string& host, int32_t state, std::chrono::milliseconds timeout,
                                  const std::string& local = "", ServiceCounters* counters = nullptr);

}  // namespace mpnfs::nfs
