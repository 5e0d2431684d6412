// The calls made once at mount time, from the mounting thread: MountExport
// asks the server's MOUNT v3 service for an export's root file handle;
// LockManagerPort finds the server's lock manager; NotifyRestart tells the
// server's status monitor that this client restarted. Each is a blocking
// call over its own TCP connection (made as the
// engine's are: ConnectFrom, bound to the path's `local=`, from a reserved
// port when allowed), encoded and decoded by proto/mount3.h, given up at the
// deadline. Errors carry a message meant for the command line.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "mpnfs/result.h"
#include "nfs/types.h"

namespace mpnfs::nfs {

// mount_port 0: ask the server's portmapper (port 111) where MOUNT listens.
// `local`: the path's local= (an interface or address), or empty.
Result<Fh> MountExport(const std::string& host, int mount_port, const std::string& export_path,
                       std::chrono::milliseconds timeout, const std::string& local = "");

// The TCP port of the server's NLM v4 service (ENOENT: none registered);
// `local_addr`, if given, gets this client's address toward the server.
Result<int> LockManagerPort(const std::string& host, std::chrono::milliseconds timeout,
                            const std::string& local = "", std::string* local_addr = nullptr);

// SM_NOTIFY to the server's status monitor: the host at this client's
// address toward the server (what the server's lock manager knows it by)
// restarted, its NSM state now `state`; the server then drops the locks it
// held for that address. Returns that address.
Result<std::string> NotifyRestart(const std::string& host, int32_t state, std::chrono::milliseconds timeout,
                                  const std::string& local = "");

}  // namespace mpnfs::nfs
