#include "cli/control.h"

#include <algorithm>

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
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
                      const cache::CacheStats* cache, double uptime_s,
                      const std::vector<nfs::ServiceStats>& services,
                      const fuse::TransportStats* fuse) {
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
        "\"outstanding_bytes\": {}, \"weight\": {}, \"link_rate_bps\": {}, \"rate_bps\": {}, \"sojourn_us\": {}, "
        "\"transitions\": {}, \"latency_p50_us\": {},\n   \"ops\": {},\n   \"history\": {},\n   "
        "\"latency_mean_us\": {}, \"latency_p99_us\": {}}}",
        i == 0 ? "" : ",", JsonString(c.endpoint), c.state, c.calls, c.replies, c.errors, c.retransmits,
        c.reissues, c.reconnects, c.failovers, c.probes, c.bytes_out, c.bytes_in, c.inflight,
        c.queued, c.outstanding_bytes, c.weight, c.link_rate_bps, c.rate_bps, c.sojourn_us, c.transitions,
        c.latency_p50_us,
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
  out += ",\n\"services\": [";
  for (size_t i = 0; i < services.size(); ++i) {
    const auto& v = services[i];
    const auto& o = v.calls;
    out += fmt::format(
        "{}\n  {{\"service\": {}, \"endpoint\": {}, \"state\": {}, \"ops\": {}, "
        "\"transmissions\": {}, \"retransmits\": {}, \"errors\": {}, \"refusals\": {}, \"rtt_count\": {}, "
        "\"rtt_mean_us\": {}, \"rtt_p99_us\": {}, \"exe_mean_us\": {}, \"reconnects\": {}, "
        "\"lost_locks\": {}, \"last_error\": {}, \"last_call\": {}}}",
        i == 0 ? "" : ",", JsonString(v.service), JsonString(v.endpoint), JsonString(v.state), o.ops,
        o.transmissions, o.retransmits, o.errors, o.nfs_errors, o.rtt.count, o.rtt.MeanUs(), o.rtt.PercentileUs(99), o.ops == 0 ? 0 : o.exe_us / o.ops,
        v.reconnects, v.lost_locks, JsonString(v.last_error),
        v.last_call == std::chrono::system_clock::time_point{} ? "null" : "\"" + IsoTime(v.last_call) + "\"");
  }
  out += "]";
  if (fuse != nullptr) {
    out += fmt::format(
        ",\n\"fuse\": {{\"transport\": {}, \"why\": {}, \"queues\": {}, \"depth\": {}, "
        "\"ring_requests\": {}, \"device_requests\": {}}}",
        JsonString(fuse->transport), JsonString(fuse->why), fuse->queues, fuse->depth,
        fuse->ring_requests, fuse->device_requests);
  }
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
        "\"copies_to_partner\": {}, \"copied_pages\": {}, \"rewrites_in_place\": {}, "
        "\"tombstones\": {}, \"writes_around\": {}, \"dirty_age_s\": {:.3f}, \"flush_rate_bps\": {}, "
        "\"checksum_reads\": {}, \"checksum_writes\": {}, \"checksum_ram_bytes\": {}}}",
        k.mode, k.state, k.capacity_bytes, k.used_bytes, k.slots, k.slots_used, k.read_hits,
        k.read_misses, k.read_bypasses, ratio(k.read_hits, k.read_hits + k.read_misses), k.writes,
        k.write_hits, k.write_bypasses, ratio(k.write_hits, k.writes - k.write_bypasses),
        k.pages_filled, k.evictions, k.invalidations, k.files_dropped, k.checksum_failures,
        k.device_errors, k.dirty_bytes, k.dirty_blocks, k.flushed_bytes, k.flush_errors, k.copies,
        k.copies_to_partner, k.copied_pages, k.rewrites_in_place, k.tombstones, k.wb_arounds, k.dirty_age_s, k.flush_rate_bps,
        k.checksum_reads, k.checksum_writes, k.checksum_ram_bytes);
  }
  out += "}\n";
  return out;
}

bool Reply::Line(const std::string& line) {
  if (!line.empty() && line.back() == '\n') return Text(line);
  return Text(line + "\n");
}

bool Reply::Text(const std::string& text) {
  if (gone_) return false;
  size_t off = 0;
  while (off < text.size()) {
    ssize_t n = send(fd_, text.data() + off, text.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      gone_ = true;
      return false;
    }
    off += static_cast<size_t>(n);
  }
  return true;
}

bool Reply::Alive() {
  if (gone_) return false;
  pollfd p{fd_, 0, 0};
  // POLLHUP: both directions are shut (the client closed its socket, or the
  // gateway is stopping); a half close (shutdown SHUT_WR) is not that.
  if (poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR)) != 0) gone_ = true;
  return !gone_;
}

std::optional<std::string> ProgressField(const std::string& line, const std::string& key) {
  const std::string k = " " + key + "=";
  auto at = line.find(k);
  if (line.rfind("progress ", 0) != 0 || at == std::string::npos) return std::nullopt;
  at += k.size();
  return line.substr(at, line.find(' ', at) - at);
}

namespace {

std::string HumanBytes(double b) {
  if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.1f} GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", b / (1024.0 * 1024));
  return fmt::format("{:.0f} KiB", b / 1024.0);
}

}  // namespace

std::string RenderProgress(const std::string& line) {
  auto num = [&](const char* k) {
    auto v = ProgressField(line, k);
    return v ? std::strtoll(v->c_str(), nullptr, 10) : -1;
  };
  if (auto dirty = ProgressField(line, "dirty_bytes")) {
    const long long rate = num("rate_bps"), eta = num("eta_s");
    std::string out = "flushing: " + HumanBytes(static_cast<double>(num("dirty_bytes"))) + " dirty";
    out += rate > 0 ? ", " + HumanBytes(static_cast<double>(rate)) + "/s" : ", rate not known yet";
    if (eta >= 0) out += fmt::format(", {}:{:02} left", eta / 60, eta % 60);
    return out;
  }
  if (auto step = ProgressField(line, "step")) {
    if (*step == "start") {
      return fmt::format("calibrate: {} target(s), scratch file {} MiB, at most {} s",
                         ProgressField(line, "targets").value_or("?"),
                         ProgressField(line, "file_mib").value_or("?"),
                         ProgressField(line, "estimated_max_s").value_or("?"));
    }
    std::string out = "calibrate: " + *step;
    if (auto p = ProgressField(line, "path")) out += " path " + *p;
    if (auto d = ProgressField(line, "depth")) out += " depth " + *d;
    if (auto v = ProgressField(line, "iops")) out += ": " + *v + " IOPS";
    if (auto v = ProgressField(line, "mbps")) out += ": " + *v + " MB/s";
    return out;
  }
  return line.substr(std::min<size_t>(line.size(), 9));
}

void FlushMeter::Sample(double t_s, uint64_t dirty_bytes) {
  samples_.emplace_back(t_s, dirty_bytes);
  while (samples_.size() > 2 && samples_.back().first - samples_[1].first >= window_s_) {
    samples_.erase(samples_.begin());
  }
}

uint64_t FlushMeter::rate_bps() const {
  if (samples_.size() < 2) return 0;
  const auto& a = samples_.front();
  const auto& b = samples_.back();
  if (b.first <= a.first || b.second >= a.second) return 0;
  return static_cast<uint64_t>(static_cast<double>(a.second - b.second) / (b.first - a.first));
}

int64_t FlushMeter::eta_s() const {
  if (dirty() == 0) return 0;
  const uint64_t r = rate_bps();
  return r == 0 ? -1 : static_cast<int64_t>((dirty() + r - 1) / r);
}

std::string FlushMeter::ProgressLine() const {
  return fmt::format("progress dirty_bytes={} rate_bps={} eta_s={}", dirty(), rate_bps(), eta_s());
}

ControlSocket::ControlSocket(std::string path, Handler handler)
    : path_(std::move(path)), handler_(std::move(handler)) {}

ControlSocket::~ControlSocket() {
  if (fd_ >= 0) {
    shutdown(fd_, SHUT_RDWR);  // wakes accept()
  }
  if (thread_.joinable()) thread_.join();
  {
    MutexLock lock(mu_);
    stopping_ = true;
    // Handlers see their client gone and return.
    for (auto& w : workers_) shutdown(w.fd, SHUT_RDWR);
  }
  Reap(true);
  if (fd_ >= 0) {
    close(fd_);
    unlink(path_.c_str());
  }
}

bool ControlSocket::Quiesce(std::chrono::milliseconds grace) {
  if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);  // wakes accept()
  if (thread_.joinable()) thread_.join();
  {
    MutexLock lock(mu_);
    stopping_ = true;
    for (auto& w : workers_) shutdown(w.fd, SHUT_RDWR);
  }
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (true) {
    {
      MutexLock lock(mu_);
      if (std::all_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.done; })) {
        return true;
      }
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void ControlSocket::Reap(bool all) {
  std::list<Worker> finished;
  {
    MutexLock lock(mu_);
    for (auto it = workers_.begin(); it != workers_.end();) {
      auto next = std::next(it);
      if (all || it->done) finished.splice(finished.end(), workers_, it);
      it = next;
    }
  }
  for (auto& w : finished) {
    w.thread.join();
    close(w.fd);
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

bool ControlSocket::PeerIsRoot(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.uid == 0;
}

void ControlSocket::Serve() {
  for (;;) {
    int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // shut down
    }
    Reap(false);
    // Who is asking, before counting: root is never refused because of
    // connections other users hold.
    const bool privileged = privileged_peer(c);
    MutexLock lock(mu_);
    size_t unprivileged = 0;
    for (const auto& w : workers_) unprivileged += w.privileged ? 0 : 1;
    if (workers_.size() >= static_cast<size_t>(kMaxConnections) ||
        (!privileged && unprivileged >= static_cast<size_t>(kMaxCommands))) {
      const std::string busy = fmt::format("error: busy ({} commands running)\n", workers_.size());
      ssize_t n = send(c, busy.data(), busy.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      (void)n;
      close(c);
      continue;
    }
    workers_.push_back(Worker{c, privileged, {}, false});
    Worker* w = &workers_.back();
    w->thread = std::thread([this, w] {
      ServeOne(w->fd, w->privileged);
      MutexLock l(mu_);
      w->done = true;
    });
  }
}

void ControlSocket::ServeOne(int c, bool privileged) {
  timeval stv{30, 0};  // a client that stops reading is treated as gone
  setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &stv, sizeof(stv));
  // One command line, against one deadline for the whole line: a client that
  // says nothing within it gets the statistics; one that has sent part of a
  // line by then (or dribbles bytes to hold this thread) is dropped.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(kCommandLineTimeoutMs);
  std::string cmd;
  bool complete = false;  // a '\n' or the client's end of writing
  while (cmd.size() < 256) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) break;
    pollfd p{c, POLLIN, 0};
    const int r = poll(&p, 1, static_cast<int>(left));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    char ch;
    const ssize_t n = recv(c, &ch, 1, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0 || ch == '\n') {
      complete = true;
      break;
    }
    cmd += ch;
  }
  if (!complete && !cmd.empty()) {
    Reply(c).Line("error: no complete command line (at most 255 bytes, within 1 s)");
    shutdown(c, SHUT_RDWR);
    return;
  }
  if (cmd.empty()) cmd = "stats";
  Reply reply(c);
  handler_(cmd, privileged, reply);
  shutdown(c, SHUT_RDWR);  // the answer is complete (the fd is closed by Reap)
}

}  // namespace mpnfs::cli
