// Binding a path's client side: `local=` (mount option) / `local:` (mpnfstab).
//
// Every connection of the engine is made here (RpcTransport::StartConnect):
// non-blocking, from a reserved port when the process may bind one (servers
// exporting with `secure` insist), and, for a path with `local=`, bound to
// the interface (SO_BINDTODEVICE, so the traffic leaves by that interface
// whatever the routing table says) and, for an address, to that source
// address too.
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

// A non-blocking TCP socket bound as `b` says (a default LocalBinding: no
// interface, any address), connecting to host:port (numeric).
Result<int> ConnectFrom(const LocalBinding& b, const std::string& host, int port);

// The address a connection bound as `b` would leave from toward `host`
// (numeric), as the routing table picks it; nothing is sent.
Result<std::string> SourceAddress(const LocalBinding& b, const std::string& host);

}  // namespace mpnfs::nfs
