// ControlSocket: a unix socket beside each mount that answers one command
// per connection: "stats" (a JSON snapshot of the mount's statistics),
// "stats prometheus" (the same in the Prometheus text format, cli/metrics.h),
// "cache drop", "cache detach", "cache flush", "path ..." (cli/path_control.h),
// "calibrate ...". `mpnfsctl` speaks it; so can any script
// (printf 'stats\n' | nc -U SOCKET). The socket lives at
// /run/mpnfs/<mountpoint with '/' as %2F>.sock.
//
// Protocol: the client writes one command line; the answer is streamed back
// as lines until the socket closes. Lines starting "progress " are interim
// (key=value pairs, e.g. `progress dirty_bytes=N rate_bps=N eta_s=N`); an
// answer whose first non-progress line starts with "error:" is a failure.
// A client that closes its socket ends its interest: a long command notices
// (Reply::Line/Alive return false) and stops where it can.
//
// Threads: one accept thread; each connection is served on its own thread,
// so a long command does not hold up `stats`. Non-root clients share at most
// kMaxCommands threads (beyond that they are told "error: busy"); root's
// commands are not counted against them and are refused only beyond the hard
// cap kMaxConnections. The command line must arrive within kCommandLineTimeout
// in all (one deadline, not per byte): a client that has sent nothing by then
// gets the statistics, one that sent part of a line is dropped. The handler runs on
// those threads, concurrently with itself. The destructor stops accepting,
// shuts every open connection down (their Reply::Line fails from then on)
// and joins every thread: handlers must return soon after their client goes.
#pragma once

#include <chrono>
#include <functional>
#include <list>
#include <optional>
#include <string>
#include <thread>

#include "cache/block_cache.h"
#include "common/mutex.h"
#include "engine/engine.h"
#include "fuse/transport_stats.h"
#include "mpnfs/result.h"
#include "nfs/service_stats.h"

namespace mpnfs::cli {

// The socket path of the mount at `mountpoint` (made absolute first).
Result<std::string> ControlPathFor(const std::string& mountpoint);

// The statistics document (documented in mpnfsctl(8)).
// `cache` is null for a mount without the SSD cache; `uptime_s` is the time
// since the mount started (what the counters cover); `services` the calls
// to the server's other services (nfs/service_stats.h); `fuse` how FUSE
// requests reach mpnfs (fuse/transport.h), left out when null.
std::string StatsJson(const std::string& source, const std::string& mountpoint,
                      const std::vector<engine::ConnectionStats>& conns,
                      const cache::CacheStats* cache = nullptr, double uptime_s = 0,
                      const std::vector<nfs::ServiceStats>& services = {},
                      const fuse::TransportStats* fuse = nullptr);

// The control channel of one mount: a unix socket. A client connects,
// writes one command line ("stats", "cache drop", ...) and reads the answer
// until the socket closes. Any local user may ask for statistics; commands
// that change something are answered only for root (SO_PEERCRED).
// The answer channel of one command. Used by its handler thread only.
class Reply {
 public:
  explicit Reply(int fd) : fd_(fd) {}
  // Writes `line` (and a '\n' if it has none). False once the client has
  // gone (closed, write failed, or not reading for 30 s); nothing more is
  // written after that.
  bool Line(const std::string& line);
  // Writes `text` as is (a whole answer of several lines).
  bool Text(const std::string& text);
  // Whether the client is still there (it has not closed its socket); does
  // not write. A client that only shut down its writing half is still there.
  bool Alive();

 private:
  int fd_;
  bool gone_ = false;
};

// Helpers for "progress" lines (also used by mpnfsctl to render them).
// The value of `key` in a "progress k=v k=v" line, or nullopt.
std::optional<std::string> ProgressField(const std::string& line, const std::string& key);
// A human form of a progress line, e.g. "flushing: 12.0 MiB dirty, 3.0
// MiB/s, 0:04 left" or "calibrate: randread path 10.0.0.2 depth 8: 1234 IOPS".
std::string RenderProgress(const std::string& line);

// Dirty bytes left over time -> rate and time to go (a flush in progress).
// Rate: bytes the dirty count fell over the last `window` of samples.
// Not thread safe (one user).
class FlushMeter {
 public:
  explicit FlushMeter(double window_s = 5.0) : window_s_(window_s) {}
  void Sample(double t_s, uint64_t dirty_bytes);
  uint64_t dirty() const { return samples_.empty() ? 0 : samples_.back().second; }
  uint64_t rate_bps() const;  // 0: not known yet
  int64_t eta_s() const;      // -1: not known
  // "progress dirty_bytes=N rate_bps=N eta_s=N"
  std::string ProgressLine() const;

 private:
  double window_s_;
  std::vector<std::pair<double, uint64_t>> samples_;
};

class ControlSocket {
 public:
  static constexpr int kMaxCommands = 8;      // non-root connections at once
  static constexpr int kMaxConnections = 32;  // all connections at once (root too)
  static constexpr int kCommandLineTimeoutMs = 1000;
  // Whether the peer of a just-accepted connection may change things: root,
  // by SO_PEERCRED. Replaceable (before Start) for tests; runs on the accept
  // thread.
  static bool PeerIsRoot(int fd);
  std::function<bool(int fd)> privileged_peer = PeerIsRoot;
  // handler(command, privileged, reply) writes the answer through `reply`;
  // a first line starting with "error:" makes mpnfsctl exit 1.
  using Handler = std::function<void(const std::string& command, bool privileged, Reply& reply)>;
  ControlSocket(std::string path, Handler handler);
  ~ControlSocket();
  ControlSocket(const ControlSocket&) = delete;
  ControlSocket& operator=(const ControlSocket&) = delete;

  Status Start();
  // Stops taking commands and tells the running ones that their client is
  // gone (Reply::Alive() turns false: a calibrate stops and removes its
  // scratch file), then waits up to `grace` for them to return. True if
  // they all did. Called at unmount while the engine still runs; the
  // destructor joins whatever is left.
  bool Quiesce(std::chrono::milliseconds grace);

 private:
  void Serve();
  void ServeOne(int c, bool privileged);
  void Reap(bool all);

  struct Worker {
    int fd;
    bool privileged;
    std::thread thread;
    bool done = false;
  };
  const std::string path_;
  Handler handler_;
  int fd_ = -1;
  std::thread thread_;
  Mutex mu_;
  std::list<Worker> workers_ GUARDED_BY(mu_);  // (the threads themselves: by Reap)
  bool stopping_ GUARDED_BY(mu_) = false;
};

}  // namespace mpnfs::cli
