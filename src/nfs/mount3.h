// MountExport: asks the server's MOUNT v3 service for an export's root file
// handle. Used once, at mount time, from the mounting thread, before the
// engine starts; it drives its own short-lived RPC context with poll() and
// gives up at the deadline. Errors carry a message meant for the command line.
#pragma once

#include <chrono>
#include <string>

#include "mpnfs/result.h"
#include "nfs/types.h"

namespace mpnfs::nfs {

// mount_port 0: ask the server's portmapper (port 111) where MOUNT listens.
Result<Fh> MountExport(const std::string& host, int mount_port, const std::string& export_path,
                       std::chrono::milliseconds timeout);

}  // namespace mpnfs::nfs
