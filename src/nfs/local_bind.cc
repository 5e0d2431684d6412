#include "nfs/local_bind.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
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

// Whether `port` is one a local service may listen on.
bool ServicePort(int port) {
  static const std::set<int> blacklist = [] {
    std::set<int> s;
    std::ifstream in("/etc/bindresvport.blacklist");
    std::string line;
    while (std::getline(in, line)) {
      const int p = std::atoi(line.c_str());
      if (p > 0) s.insert(p);
    }
    return s;
  }();
  if (blacklist.count(port) != 0) return true;
  servent se{};
  servent* found = nullptr;
  char buf[1024];
  return getservbyport_r(htons(static_cast<uint16_t>(port)), "tcp", &se, buf, sizeof buf,
                         &found) == 0 &&
         found != nullptr;
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

Result<int> ConnectFrom(const LocalBinding& b, const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_flags = AI_NUMERICHOST;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* ai = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &ai) != 0 || ai == nullptr) {
    return Error::Errno(EINVAL, "not a numeric address: " + host);
  }
  sockaddr_storage server{};
  std::memcpy(&server, ai->ai_addr, ai->ai_addrlen);
  const socklen_t server_len = ai->ai_addrlen;
  freeaddrinfo(ai);
  SetPort(&server, port);
  if (b.addr_len != 0 && b.addr.ss_family != server.ss_family) {
    return Error::Errno(EAFNOSUPPORT, "local address and server address " + host +
                                          " are of different families");
  }
  int fd = socket(server.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return Error::Errno(errno, std::string("socket: ") + strerror(errno));
  auto fail = [fd](const std::string& what) {
    int e = errno;
    close(fd);
    return Error::Errno(e, what + ": " + strerror(e));
  };
  if (!b.ifname.empty() && setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, b.ifname.c_str(),
                                      static_cast<socklen_t>(b.ifname.size())) != 0) {
    return fail("cannot bind to interface " + b.ifname);
  }
  // Prefer a reserved port (as the kernel client, libnfs and bindresvport
  // do): servers exporting with `secure` insist on one. Each of 512-1023 is
  // tried once from a random start, skipping those a local service may want
  // (named in /etc/services, or in /etc/bindresvport.blacklist): holding
  // one for the mount's life would keep that service from starting. Only if
  // none is free (or the process may not bind one): any port.
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
  bool bound = false, denied = false;
  for (int i = 0; i < 512 && !bound && !denied; ++i) {
    const int port = 512 + (start + i) % 512;
    if (ServicePort(port)) continue;
    SetPort(&src, port);
    if (bind(fd, reinterpret_cast<sockaddr*>(&src), src_len) == 0) {
      bound = true;
    } else if (errno == EACCES) {
      denied = true;  // not privileged: no reserved port for this process
    }
  }
  if (!bound && !denied) {
    static RateLimit limit(std::chrono::minutes(1));
    uint64_t suppressed = 0;
    if (limit.Allow(&suppressed)) {
      Log("nfs")->warn("no reserved port (512-1023) is free: connecting to {} from another; a "
                       "server exporting with `secure` refuses such calls", host);
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
