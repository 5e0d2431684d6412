// Binding a path's client side: `local=` (mount option) / `local:` (mpnfstab).
//
// libnfs 4.0 creates and connects its socket itself and offers no hook to
// bind it. So the transport lets libnfs start its connect, then puts a socket
// of its own in place under the same descriptor number (the dup2 pattern
// libnfs documents for rpc_set_fd): bound to the interface (SO_BINDTODEVICE,
// so the traffic leaves by that interface whatever the routing table says)
// and, for an address, also to that source address. libnfs's own attempt is
// closed before it completes; the server sees at most a SYN that goes nowhere.
//
// Thread safety: plain functions.
#pragma once

#include <sys/socket.h>

#include <string>

#include "mpnfs/result.h"

namespace mpnfs::nfs {

struct LocalBinding {
  std::string ifname;          // the device to bind to
  sockaddr_storage addr{};     // the source address, when one was given
  socklen_t addr_len = 0;      // 0: interface only
};

// `local` is an interface name or a numeric address assigned to one.
Result<LocalBinding> ResolveLocal(const std::string& local);

// A non-blocking TCP socket bound as `b` says, connecting to host:port (numeric).
Result<int> ConnectFrom(const LocalBinding& b, const std::string& host, int port);

}  // namespace mpnfs::nfs
