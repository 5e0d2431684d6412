#include "nfs/local_bind.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <unistd.h>

#include <bitset>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>

#include "common/log.h"

namespace mpnfs::nfs {
namespace {

bool SameAddress(const sockaddr* a, const sockaddr_storage& b) {
  if (a == nullptr || a->sa_family != b.ss_family) return false;
  if (a->sa_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in*>(&b)->sin_addr.s_addr;
  }
  return std::memcmp(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr,
                     &reinterpret_cast<const sockaddr_in6*>(&b)->sin6_addr, sizeof(in6_addr)) == 0;
}

// Whether reserved `port` (512-1023) is one a local service may listen on:
// named in /etc/services (as other NFS clients skip them) or listed in
// /etc/bindresvport.blacklist (as libtirpc's bindresvport does). Looked up
// once per process, not on every connect (a services lookup can go through
// NSS to sssd or LDAP).
bool ServicePort(int port) {
  static const std::bitset<512> skip = [] {
    std::bitset<512> s;
    std::ifstream in("/etc/bindresvport.blacklist");
    std::string line;
    while (std::getline(in, line)) {
      const int p = std::atoi(line.c_str());
      if (p >= 512 && p < 1024) s.set(static_cast<size_t>(p - 512));
    }
    for (int p = 512; p < 1024; ++p) {
      servent se{};
      servent* found = nullptr;
      char buf[1024];
      if (getservbyport_r(htons(static_cast<uint16_t>(p)), "tcp", &se, buf, sizeof buf,
                          &found) == 0 &&
          found != nullptr) {
        s.set(static_cast<size_t>(p - 512));
      }
    }
    return s;
  }();
  return port >= 512 && port < 1024 && skip.test(static_cast<size_t>(port - 512));
}

void SetPort(sockaddr_storage* ss, int port) {
  if (ss->ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(ss)->sin_port = htons(static_cast<uint16_t>(port));
  } else {
    reinterpret_cast<sockaddr_in6*>(ss)->sin6_port = htons(static_cast<uint16_t>(port));
  }
}

}  // namespace

Result<LocalBinding> ResolveLocal(const std::string& local) {
  LocalBinding b;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&b.addr);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&b.addr);
  if (inet_pton(AF_INET, local.c_str(), &v4->sin_addr) == 1) {
    b.addr.ss_family = AF_INET;
    b.addr_len = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, local.c_str(), &v6->sin6_addr) == 1) {
    b.addr.ss_family = AF_INET6;
    b.addr_len = sizeof(sockaddr_in6);
  } else {
    if (local.empty() || local.size() >= IFNAMSIZ || if_nametoindex(local.c_str()) == 0) {
      return Error::Errno(ENODEV, "local=" + local + ": no such interface, and not a numeric address");
    }
    b.ifname = local;
    return b;
  }
  // An address: find the interface that holds it.
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return Error::Errno(errno, "getifaddrs: " + std::string(strerror(errno)));
  for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
    if (SameAddress(i->ifa_addr, b.addr)) {
      b.ifname = i->ifa_name;
      break;
    }
  }
  freeifaddrs(ifs);
  if (b.ifname.empty()) {
    return Error::Errno(EADDRNOTAVAIL, "local=" + local + ": address not assigned to any interface");
  }
  return b;
}

namespace {

// A socket of `type` toward host:port (numeric), bound to `b`'s interface
// (not yet to an address); `server` gets host:port.
Result<int> SocketToward(const LocalBinding& b, const std::string& host, int port, int type,
                         sockaddr_storage* server, socklen_t* server_len) {
  addrinfo hints{};
  hints.ai_flags = AI_NUMERICHOST;
  hints.ai_socktype = type;
  addrinfo* ai = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &ai) != 0 || ai == nullptr) {
    return Error::Errno(EINVAL, "not a numeric address: " + host);
  }
  *server = sockaddr_storage{};
  std::memcpy(server, ai->ai_addr, ai->ai_addrlen);
  *server_len = ai->ai_addrlen;
  freeaddrinfo(ai);
  SetPort(server, port);
  if (b.addr_len != 0 && b.addr.ss_family != server->ss_family) {
    return Error::Errno(EAFNOSUPPORT, "local address and server address " + host +
                                          " are of different families");
  }
  int fd = socket(server->ss_family, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return Error::Errno(errno, std::string("socket: ") + strerror(errno));
  if (!b.ifname.empty() && setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, b.ifname.c_str(),
                                      static_cast<socklen_t>(b.ifname.size())) != 0) {
    const int e = errno;
    close(fd);
    return Error::Errno(e, "cannot bind to interface " + b.ifname + ": " + strerror(e));
  }
  return fd;
}

}  // namespace

Result<std::string> SourceAddress(const LocalBinding& b, const std::string& host) {
  sockaddr_storage server{};
  socklen_t server_len = 0;
  auto s = SocketToward(b, host, 111, SOCK_DGRAM, &server, &server_len);
  if (!s) return s.error();
  const int fd = *s;
  auto fail = [fd](const std::string& what) {
    const int e = errno;
    close(fd);
    return Error::Errno(e, what + ": " + strerror(e));
  };
  if (b.addr_len != 0 && bind(fd, reinterpret_cast<const sockaddr*>(&b.addr), b.addr_len) != 0) {
    return fail("cannot bind to the local address");
  }
  // A datagram socket's connect() sends nothing: it only picks the route.
  if (connect(fd, reinterpret_cast<sockaddr*>(&server), server_len) != 0) return fail("no route to " + host);
  sockaddr_storage me{};
  socklen_t me_len = sizeof me;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&me), &me_len) != 0) return fail("getsockname");
  close(fd);
  char text[INET6_ADDRSTRLEN] = "";
  const void* a = me.ss_family == AF_INET6 ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&me)->sin6_addr)
                                           : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&me)->sin_addr);
  if (inet_ntop(me.ss_family, a, text, sizeof text) == nullptr) return Error::Errno(EIO, "no local address toward " + host);
  return std::string(text);
}

Result<int> ConnectFrom(const LocalBinding& b, const std::string& host, int port) {
  sockaddr_storage server{};
  socklen_t server_len = 0;
  auto s = SocketToward(b, host, port, SOCK_STREAM, &server, &server_len);
  if (!s) return s.error();
  const int fd = *s;
  auto fail = [fd](const std::string& what) {
    int e = errno;
    close(fd);
    return Error::Errno(e, what + ": " + strerror(e));
  };
  // Prefer a reserved port (as the kernel client does): servers
  // exporting with `secure` insist on one. Each of 512-1023 is tried once
  // from a random start, skipping those named for a local service (see
  // ServicePort): holding one for the mount's life would keep that service
  // from starting. Any other port only if none is free, or if the process
  // may not bind one (EACCES), or binding fails otherwise (the address is
  // gone: the last bind below then reports it).
  sockaddr_storage src{};
  socklen_t src_len = server_len;
  if (b.addr_len != 0) {
    src = b.addr;
    src_len = b.addr_len;
  } else {
    src.ss_family = server.ss_family;  // the wildcard address
  }
  std::minstd_rand rnd(std::random_device{}());
  const int start = static_cast<int>(rnd() % 512);
  bool bound = false, in_use = true;  // in_use: every reserved port tried was taken
  for (int i = 0; i < 512 && !bound && in_use; ++i) {
    const int port = 512 + (start + i) % 512;
    if (ServicePort(port)) continue;
    SetPort(&src, port);
    if (bind(fd, reinterpret_cast<sockaddr*>(&src), src_len) == 0) {
      bound = true;
    } else if (errno != EADDRINUSE) {
      in_use = false;  // not allowed (EACCES), or the address itself fails
    }
  }
  if (!bound && in_use) {
    static RateLimit limit(std::chrono::minutes(1));
    uint64_t suppressed = 0;
    if (limit.Allow(&suppressed)) {
      Log("nfs")->warn("no reserved port (512-1023) is free: connecting to {} from another; a "
                       "server exporting with `secure` refuses such calls ({} more like this "
                       "not logged)", host, suppressed);
    }
  }
  if (!bound) {
    SetPort(&src, 0);
    if (bind(fd, reinterpret_cast<sockaddr*>(&src), src_len) != 0) {
      return fail("cannot bind to the local address");
    }
  }
  if (connect(fd, reinterpret_cast<sockaddr*>(&server), server_len) != 0 && errno != EINPROGRESS) {
    return fail("connect to " + host);
  }
  return fd;
}

}  // namespace mpnfs::nfs
