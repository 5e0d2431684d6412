#include "cli/control.h"

#include <fmt/format.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <ctime>
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

std::string IsoTime(std::chrono::system_clock::time_point t) {
  using std::chrono::milliseconds;
  const auto ms = std::chrono::duration_cast<milliseconds>(t.time_since_epoch()).count();
  const time_t sec = static_cast<time_t>(ms / 1000);
  struct tm tm {};
  gmtime_r(&sec, &tm);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", tm.tm_year + 1900, tm.tm_mon + 1,
                     tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms % 1000);
}

// The procedures called so far, each an object (see mpnfs(8)).
std::string OpsJson(const std::array<engine::OpStats, engine::kProcCount>& ops,
                    const std::array<engine::StabilityStats, engine::kStabilityCount>& stab) {
  std::string out = "{";
  bool first = true;
  for (int p = 0; p < engine::kProcCount; ++p) {
    const auto& o = ops[p];
    if (o.ops == 0 && o.transmissions == 0) continue;
    out += fmt::format(
        "{}\"{}\": {{\"ops\": {}, \"transmissions\": {}, \"retransmits\": {}, \"errors\": {}, "
        "\"nfs_errors\": {}, \"bytes_out\": {}, \"bytes_in\": {}, \"rtt_count\": {}, "
        "\"rtt_total_us\": {}, \"rtt_mean_us\": {}, \"rtt_p50_us\": {}, \"rtt_p99_us\": {}, "
        "\"exe_total_us\": {}, \"exe_mean_us\": {}",
        first ? "" : ", ", engine::ProcName(static_cast<engine::Proc>(p)), o.ops, o.transmissions,
        o.retransmits, o.errors, o.nfs_errors, o.bytes_out, o.bytes_in, o.rtt.count, o.rtt.sum_us,
        o.rtt.MeanUs(), o.rtt.PercentileUs(50), o.rtt.PercentileUs(99), o.exe_us,
        o.ops == 0 ? 0 : o.exe_us / o.ops);
    if (p == static_cast<int>(engine::Proc::kWrite)) {
      out += fmt::format(
          ", \"unstable_ops\": {}, \"unstable_bytes\": {}, \"data_sync_ops\": {}, "
          "\"data_sync_bytes\": {}, \"file_sync_ops\": {}, \"file_sync_bytes\": {}",
          stab[0].ops, stab[0].bytes, stab[1].ops, stab[1].bytes, stab[2].ops, stab[2].bytes);
    }
    out += "}";
    first = false;
  }
  return out + "}";
}

std::string HistoryJson(const std::vector<engine::StateChange>& h) {
  std::string out = "[";
  for (size_t i = 0; i < h.size(); ++i) {
    const auto& c = h[i];
    out += fmt::format(
        "{}\n    {{\"time\": \"{}\", \"from\": \"{}\", \"to\": \"{}\", \"reason\": {}, "
        "\"count\": {}, \"last\": \"{}\"}}",
        i == 0 ? "" : ",", IsoTime(c.time), c.from, c.to, JsonString(c.reason), c.count,
        IsoTime(c.last));
  }
  return out + "]";
}

}  // namespace

std::string StatsJson(const std::string& source, const std::string& mountpoint,
                      const std::vector<engine::ConnectionStats>& conns,
                      const cache::CacheStats* cache, double uptime_s) {
  std::string out = fmt::format(
      "{{\"source\": {}, \"mountpoint\": {}, \"uptime_s\": {:.3f}, \"connections\": [",
      JsonString(source), JsonString(mountpoint), uptime_s);
  std::array<engine::OpStats, engine::kProcCount> total{};
  std::array<engine::StabilityStats, engine::kStabilityCount> total_stab{};
  for (size_t i = 0; i < conns.size(); ++i) {
    const auto& c = conns[i];
    out += fmt::format(
        "{}\n  {{\"endpoint\": {}, \"state\": \"{}\", \"calls\": {}, \"replies\": {}, "
        "\"errors\": {}, \"retransmits\": {}, \"reissues\": {}, \"reconnects\": {}, "
        "\"failovers\": {}, \"probes\": {}, "
        "\"bytes_out\": {}, \"bytes_in\": {}, \"inflight\": {}, \"queued\": {}, "
        "\"outstanding_bytes\": {}, \"rate_bps\": {}, "
        "\"transitions\": {}, \"latency_p50_us\": {},\n   \"ops\": {},\n   \"history\": {},\n   "
        "\"latency_mean_us\": {}, \"latency_p99_us\": {}}}",
        i == 0 ? "" : ",", JsonString(c.endpoint), c.state, c.calls, c.replies, c.errors, c.retransmits,
        c.reissues, c.reconnects, c.failovers, c.probes, c.bytes_out, c.bytes_in, c.inflight,
        c.queued, c.outstanding_bytes, c.rate_bps, c.transitions, c.latency_p50_us,
        OpsJson(c.ops, c.write_stability), HistoryJson(c.history), c.latency_mean_us,
        c.latency_p99_us);
    for (int p = 0; p < engine::kProcCount; ++p) total[p].Merge(c.ops[p]);
    for (int k = 0; k < engine::kStabilityCount; ++k) {
      total_stab[k].ops += c.write_stability[k].ops;
      total_stab[k].bytes += c.write_stability[k].bytes;
    }
  }
  out += "\n]";
  out += ",\n\"ops\": " + OpsJson(total, total_stab);
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
        "\"writes_around\": {}, \"dirty_age_s\": {:.3f}, \"flush_rate_bps\": {}}}",
        k.mode, k.state, k.capacity_bytes, k.used_bytes, k.slots, k.slots_used, k.read_hits,
        k.read_misses, k.read_bypasses, ratio(k.read_hits, k.read_hits + k.read_misses), k.writes,
        k.write_hits, k.write_bypasses, ratio(k.write_hits, k.writes - k.write_bypasses),
        k.pages_filled, k.evictions, k.invalidations, k.files_dropped, k.checksum_failures,
        k.device_errors, k.dirty_bytes, k.dirty_blocks, k.flushed_bytes, k.flush_errors, k.copies,
        k.wb_arounds, k.dirty_age_s, k.flush_rate_bps);
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
