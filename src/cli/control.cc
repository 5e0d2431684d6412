#include "cli/control.h"

#include <fmt/format.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

namespace mpnfs::cli {

Result<std::string> ControlPathFor(const std::string& mountpoint) {
  char real[PATH_MAX];
  if (realpath(mountpoint.c_str(), real) == nullptr) {
    return Error::Errno(errno, mountpoint + ": " + strerror(errno));
  }
  std::string name;
  for (const char* p = real; *p != '\0'; ++p) {
    if (*p == '/') {
      name += "%2F";
    } else if (*p == '%') {
      name += "%25";
    } else {
      name += *p;
    }
  }
  std::string path = "/run/mpnfs/" + name + ".sock";
  if (path.size() >= sizeof(sockaddr_un::sun_path)) {
    return Error::Errno(ENAMETOOLONG, "mountpoint path too long for a control socket");
  }
  return path;
}

namespace {

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += static_cast<char>(ch);
    } else if (ch < 0x20) {
      out += fmt::format("\\u{:04x}", ch);
    } else {
      out += static_cast<char>(ch);
    }
  }
  return out + "\"";
}

}  // namespace

std::string StatsJson(const std::string& source, const std::string& mountpoint,
                      const std::vector<engine::ConnectionStats>& conns,
                      const cache::CacheStats* cache) {
  std::string out = fmt::format("{{\"source\": {}, \"mountpoint\": {}, \"connections\": [",
                                JsonString(source), JsonString(mountpoint));
  for (size_t i = 0; i < conns.size(); ++i) {
    const auto& c = conns[i];
    out += fmt::format(
        "{}\n  {{\"endpoint\": {}, \"state\": \"{}\", \"calls\": {}, \"replies\": {}, "
        "\"errors\": {}, \"retransmits\": {}, \"reissues\": {}, \"reconnects\": {}, "
        "\"failovers\": {}, \"probes\": {}, "
        "\"bytes_out\": {}, \"bytes_in\": {}, \"inflight\": {}, \"queued\": {}, "
        "\"outstanding_bytes\": {}, \"rate_bps\": {}, "
        "\"latency_mean_us\": {}, \"latency_p99_us\": {}}}",
        i == 0 ? "" : ",", JsonString(c.endpoint), c.state, c.calls, c.replies, c.errors, c.retransmits,
        c.reissues, c.reconnects, c.failovers, c.probes, c.bytes_out, c.bytes_in, c.inflight,
        c.queued, c.outstanding_bytes, c.rate_bps, c.latency_mean_us, c.latency_p99_us);
  }
  out += "\n]";
  if (cache != nullptr) {
    const auto& k = *cache;
    auto ratio = [](uint64_t a, uint64_t b) { return b == 0 ? 0.0 : static_cast<double>(a) / b; };
    out += fmt::format(
        ",\n\"cache\": {{\"mode\": \"{}\", \"state\": \"{}\", \"capacity_bytes\": {}, "
        "\"used_bytes\": {}, \"slots\": {}, \"slots_used\": {}, \"read_hits\": {}, "
        "\"read_misses\": {}, \"read_bypasses\": {}, \"read_hit_ratio\": {:.4f}, \"writes\": {}, "
        "\"write_hits\": {}, \"write_bypasses\": {}, \"write_hit_ratio\": {:.4f}, "
        "\"pages_filled\": {}, \"evictions\": {}, \"invalidations\": {}, \"files_dropped\": {}, "
        "\"checksum_failures\": {}, \"device_errors\": {}, \"dirty_bytes\": {}, "
        "\"dirty_blocks\": {}, \"flushed_bytes\": {}, \"flush_errors\": {}, \"copies\": {}, "
        "\"writes_around\": {}}}",
        k.mode, k.state, k.capacity_bytes, k.used_bytes, k.slots, k.slots_used, k.read_hits,
        k.read_misses, k.read_bypasses, ratio(k.read_hits, k.read_hits + k.read_misses), k.writes,
        k.write_hits, k.write_bypasses, ratio(k.write_hits, k.writes - k.write_bypasses),
        k.pages_filled, k.evictions, k.invalidations, k.files_dropped, k.checksum_failures,
        k.device_errors, k.dirty_bytes, k.dirty_blocks, k.flushed_bytes, k.flush_errors, k.copies,
        k.wb_arounds);
  }
  out += "}\n";
  return out;
}

ControlSocket::ControlSocket(std::string path, Handler handler)
    : path_(std::move(path)), handler_(std::move(handler)) {}

ControlSocket::~ControlSocket() {
  if (fd_ >= 0) {
    shutdown(fd_, SHUT_RDWR);  // wakes accept()
  }
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) {
    close(fd_);
    unlink(path_.c_str());
  }
}

Status ControlSocket::Start() {
  mkdir("/run/mpnfs", 0755);
  fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) return Error::Errno(errno, std::string("socket: ") + strerror(errno));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
  unlink(path_.c_str());  // a socket left by a mount that died
  if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd_, 8) != 0) {
    Error e = Error::Errno(errno, path_ + ": " + strerror(errno));
    close(fd_);
    fd_ = -1;
    return e;
  }
  chmod(path_.c_str(), 0666);  // statistics for any local user; changes for root (Serve)
  thread_ = std::thread([this] { Serve(); });
  return Ok{};
}

void ControlSocket::Serve() {
  for (;;) {
    int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // shut down
    }
    // One command line; a client that says nothing within a second gets the statistics.
    timeval tv{1, 0};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    std::string cmd;
    char ch;
    while (cmd.size() < 256 && recv(c, &ch, 1, 0) == 1 && ch != '\n') cmd += ch;
    if (cmd.empty()) cmd = "stats";
    ucred cred{};
    socklen_t len = sizeof(cred);
    const bool privileged =
        getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.uid == 0;
    const std::string doc = handler_(cmd, privileged);
    size_t off = 0;
    while (off < doc.size()) {
      ssize_t n = send(c, doc.data() + off, doc.size() - off, MSG_NOSIGNAL);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
    close(c);
  }
}

}  // namespace mpnfs::cli
