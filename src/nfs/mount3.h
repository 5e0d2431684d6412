// MountExport: asks the server's MOUNT v3 service for an export's root file
// handle. Used once, at mount time, from the mounting thread, before the
// engine starts: one blocking call over its own TCP connection (made as the
// engine's are: ConnectFrom, bound to the path's `local=`, from a reserved
// port when allowed), encoded and decoded by proto/mount3.h, given up at the
// deadline. Errors carry a message meant for the command line.
#pragma once

#include <chrono>
#include <string>

#include "mpnfs/result.h"
#include "nfs/types.h"

namespace mpnfs::nfs {

// mount_port 0: ask the server's portmapper (port 111) where MOUNT listens.
// `local`: the path's local= (an interface or address), or empty.
Result<Fh> MountExport(const std::string& host, int mount_port, const std::string& export_path,
                       std::chrono::milliseconds timeout, const std::string& local = "");

}  // namespace mpnfs::nfs
