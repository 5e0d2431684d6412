#include "nfs/mount3.h"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "nfs/local_bind.h"
#include "proto/mount3.h"
#include "proto/nlm4.h"
#include "proto/nsm.h"
#include "proto/rpc.h"

namespace mpnfs::nfs {
namespace {

using Clock = std::chrono::steady_clock;

// A reply record larger than this is not a MOUNT or GETPORT reply.
constexpr size_t kMaxReply = 64 * 1024;

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ < 0) return;
    // A reset, not a close: the reserved port is free again at once (no
    // TIME_WAIT), as the engine's connections do.
    linger l{1, 0};
    setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Waits for `events` on `fd` until the deadline: false when it passed.
bool WaitFor(int fd, short events, Clock::time_point deadline) {
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int n = poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return true;  // (the read or write says what)
  }
}

// One call to prog/vers/proc at host:port from the binding `b`, its
// arguments encoded by `args`, its result decoded by `res`; before the
// deadline. The errors: EHOSTUNREACH/ECONNREFUSED (no connection, or one
// closed before the reply), ETIMEDOUT, EIO (a malformed or rejected
// reply).
template <class Args, class Res>
Result<Ok> CallOnce(const LocalBinding& b, const std::string& host, int port, uint32_t prog, uint32_t vers,
                    uint32_t proc, Args& args, Res& res, Clock::time_point deadline, const char* what,
                    std::string* local_addr = nullptr) {
  auto s = ConnectFrom(b, host, port);
  if (!s) return Error::Errno(EHOSTUNREACH, std::string("cannot reach the ") + what + ": " + s.error().what);
  Fd fd(*s);
  if (!WaitFor(fd.get(), POLLOUT, deadline)) {
    return Error::Errno(ETIMEDOUT, "server unreachable (no connection within the mount timeout)");
  }
  int soerr = 0;
  socklen_t len = sizeof soerr;
  getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &soerr, &len);
  if (soerr != 0) {
    return Error::Errno(soerr == ECONNREFUSED ? ECONNREFUSED : EHOSTUNREACH,
                        std::string("cannot reach the ") + what + ": " + std::strerror(soerr));
  }
  if (local_addr != nullptr) {
    sockaddr_storage ss{};
    socklen_t sl = sizeof ss;
    char text[INET6_ADDRSTRLEN] = "";
    if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &sl) == 0) {
      const void* a = ss.ss_family == AF_INET6 ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr)
                                               : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&ss)->sin_addr);
      inet_ntop(ss.ss_family, a, text, sizeof text);
    }
    *local_addr = text;
  }
  static uint32_t xid_base = static_cast<uint32_t>(Clock::now().time_since_epoch().count());
  proto::CallHeader h;
  h.xid = ++xid_base;
  h.prog = prog;
  h.vers = vers;
  h.proc = proc;
  h.cred.machine = "mpnfs";
  std::vector<char> out(4 + 2048);
  proto::XdrOut x(std::span<char>(out.data() + 4, out.size() - 4));
  using proto::Xdr;  // (the arguments' and result's own, by argument-dependent lookup)
  if (!Xdr(x, h) || !Xdr(x, args)) return Error::Errno(EINVAL, std::string(what) + ": arguments too long");
  out.resize(4 + x.size());
  const uint32_t mark = htonl(0x80000000u | static_cast<uint32_t>(x.size()));
  std::memcpy(out.data(), &mark, 4);
  for (size_t at = 0; at < out.size();) {
    if (!WaitFor(fd.get(), POLLOUT, deadline)) return Error::Errno(ETIMEDOUT, std::string("the ") + what + " did not answer in time");
    const ssize_t n = send(fd.get(), out.data() + at, out.size() - at, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) return Error::Errno(ECONNREFUSED, std::string("cannot reach the ") + what + ": " + std::strerror(errno));
    at += static_cast<size_t>(n);
  }
  // The reply record, fragments joined.
  std::vector<char> in;
  auto read_exact = [&](char* p, size_t n) -> Result<Ok> {
    while (n > 0) {
      if (!WaitFor(fd.get(), POLLIN, deadline)) {
        return Error::Errno(ETIMEDOUT, std::string("the ") + what + " did not answer in time");
      }
      const ssize_t r = recv(fd.get(), p, n, 0);
      if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (r <= 0) {
        // Closed or reset before its reply was whole: as unreachable (the
        // next address is tried), not as an answer.
        return Error::Errno(ECONNREFUSED, std::string("the ") + what + " closed the connection" +
                                              (r < 0 ? std::string(": ") + std::strerror(errno) : ""));
      }
      p += r;
      n -= static_cast<size_t>(r);
    }
    return Ok{};
  };
  for (bool last = false; !last;) {
    char m[4];
    if (auto r = read_exact(m, 4); !r) return r.error();
    uint32_t v;
    std::memcpy(&v, m, 4);
    v = ntohl(v);
    last = (v & 0x80000000u) != 0;
    const size_t n = v & 0x7fffffffu;
    if (in.size() + n > kMaxReply) return Error::Errno(EIO, std::string("the ") + what + "'s reply is too long");
    const size_t at = in.size();
    in.resize(at + n);
    if (auto r = read_exact(in.data() + at, n); !r) return r.error();
  }
  proto::XdrIn y(in);
  proto::ReplyHeader rh;
  if (!Xdr(y, rh) || rh.xid != h.xid) return Error::Errno(EIO, std::string("the ") + what + "'s reply is malformed");
  if (!rh.accepted || rh.accept != proto::AcceptStat::kSuccess) {
    return Error::Errno(EIO, std::string(what) + ": " + proto::Describe(rh));
  }
  if (!Xdr(y, res)) return Error::Errno(EIO, std::string("the ") + what + "'s reply does not decode");
  return Ok{};
}

// The port `prog` (version `vers`, TCP) is registered on at `host`'s
// portmapper; ENOENT when it is not registered.
Result<int> PortOf(const LocalBinding& b, const std::string& host, uint32_t prog, uint32_t vers,
                   Clock::time_point deadline, const char* what, std::string* local_addr = nullptr) {
  proto::portmap::GetportArgs ga{prog, vers, proto::portmap::kTcp, 0};
  proto::portmap::GetportRes gr;
  auto r = CallOnce(b, host, static_cast<int>(proto::portmap::kPort), proto::portmap::kProgram,
                    proto::portmap::kVersion, proto::portmap::kProcGetport, ga, gr, deadline, "portmapper",
                    local_addr);
  if (!r) return r.error();
  if (gr.port == 0 || gr.port > 65535) {
    return Error::Errno(ENOENT, std::string("the server's portmapper knows no ") + what + " over TCP");
  }
  return static_cast<int>(gr.port);
}

Result<LocalBinding> Binding(const std::string& local) {
  if (local.empty()) return LocalBinding{};
  return ResolveLocal(local);
}

}  // namespace

Result<int> LockManagerPort(const std::string& host, std::chrono::milliseconds timeout, const std::string& local,
                            std::string* local_addr) {
  auto b = Binding(local);
  if (!b) return b.error();
  return PortOf(*b, host, proto::nlm4::kProgram, proto::nlm4::kVersion, Clock::now() + timeout,
                "lock manager (NLM v4)", local_addr);
}

Result<std::string> NotifyRestart(const std::string& host, int32_t state, std::chrono::milliseconds timeout,
                                  const std::string& local) {
  auto b = Binding(local);
  if (!b) return b.error();
  const auto deadline = Clock::now() + timeout;
  std::string me;
  auto port = PortOf(*b, host, proto::nsm::kProgram, proto::nsm::kVersion, deadline, "status monitor (NSM)", &me);
  if (!port) return port.error();
  if (me.empty()) return Error::Errno(EIO, "no local address toward the server");
  proto::nsm::StatChge args{me, state};
  proto::nsm::Void res;
  auto r = CallOnce(*b, host, *port, proto::nsm::kProgram, proto::nsm::kVersion, proto::nsm::kNotify, args, res,
                    deadline, "status monitor (NSM)");
  if (!r) return r.error();
  return me;
}

Result<Fh> MountExport(const std::string& host, int mount_port, const std::string& export_path,
                       std::chrono::milliseconds timeout, const std::string& local) {
  const auto deadline = Clock::now() + timeout;
  auto bound = Binding(local);
  if (!bound) return bound.error();
  const LocalBinding& b = *bound;
  if (mount_port <= 0) {
    auto port = PortOf(b, host, proto::mount3::kProgram, proto::mount3::kVersion, deadline, "MOUNT v3 service");
    if (!port) {
      // (Unregistered: as unreachable, so the next address is tried.)
      return port.error().err == ENOENT ? Error::Errno(ECONNREFUSED, port.error().what) : port.error();
    }
    mount_port = *port;
  }
  proto::mount3::MntArgs a{export_path};
  proto::mount3::MntRes res;
  auto r = CallOnce(b, host, mount_port, proto::mount3::kProgram, proto::mount3::kVersion, proto::mount3::kProcMnt,
                    a, res, deadline, "MOUNT service");
  if (!r) return r.error();
  if (res.status != proto::mount3::kOk) {
    return Error::Errno(proto::mount3::ErrnoOf(res.status), proto::mount3::Explain(res.status));
  }
  return Fh(res.fh);
}

}  // namespace mpnfs::nfs
