// ControlSocket: a unix socket beside each mount that answers one command
// per connection: "stats" (a JSON snapshot of the mount's statistics),
// "stats prometheus" (the same in the Prometheus text format, cli/metrics.h),
// "cache drop", "cache detach", "cache flush", "path ..." (cli/path_control.h).
// `mpnfsctl` speaks it; so can
// any script (printf 'stats\n' | nc -U SOCKET). The socket lives at
// /run/mpnfs/<mountpoint with '/' as %2F>.sock.
//
// Thread safety: one accept thread; the handler is called from it.
#pragma once

#include <functional>
#include <string>
#include <thread>

#include "cache/block_cache.h"
#include "engine/engine.h"
#include "mpnfs/result.h"

namespace mpnfs::cli {

// The socket path of the mount at `mountpoint` (made absolute first).
Result<std::string> ControlPathFor(const std::string& mountpoint);

// The statistics document (documented in mpnfs(8), STATISTICS).
// `cache` is null for a mount without the SSD cache; `uptime_s` is the time
// since the mount started (what the counters cover).
std::string StatsJson(const std::string& source, const std::string& mountpoint,
                      const std::vector<engine::ConnectionStats>& conns,
                      const cache::CacheStats* cache = nullptr, double uptime_s = 0);

// The control channel of one mount: a unix socket. A client connects,
// writes one command line ("stats", "cache drop", ...) and reads the answer
// until the socket closes. Any local user may ask for statistics; commands
// that change something are answered only for root (SO_PEERCRED).
class ControlSocket {
 public:
  // handler(command, privileged) -> the answer; an answer starting with
  // "error:" makes mpnfsctl exit 1.
  using Handler = std::function<std::string(const std::string& command, bool privileged)>;
  ControlSocket(std::string path, Handler handler);
  ~ControlSocket();
  ControlSocket(const ControlSocket&) = delete;
  ControlSocket& operator=(const ControlSocket&) = delete;

  Status Start();

 private:
  void Serve();

  const std::string path_;
  Handler handler_;
  int fd_ = -1;
  std::thread thread_;
};

}  // namespace mpnfs::cli
