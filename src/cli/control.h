// ControlSocket: a unix socket beside each mount that answers every
// connection with one JSON snapshot of the mount's statistics, then closes.
// `mpnfsctl stats MOUNTPOINT` reads it; so can any script (socat, nc -U).
// The socket lives at /run/mpnfs/<mountpoint with '/' as %2F>.sock.
//
// Thread safety: one accept thread; `snapshot` is called from it.
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
// `cache` is null for a mount without the SSD cache.
std::string StatsJson(const std::string& source, const std::string& mountpoint,
                      const std::vector<engine::ConnectionStats>& conns,
                      const cache::CacheStats* cache = nullptr);

class ControlSocket {
 public:
  ControlSocket(std::string path, std::function<std::string()> snapshot);
  ~ControlSocket();
  ControlSocket(const ControlSocket&) = delete;
  ControlSocket& operator=(const ControlSocket&) = delete;

  Status Start();

 private:
  void Serve();

  const std::string path_;
  std::function<std::string()> snapshot_;
  int fd_ = -1;
  std::thread thread_;
};

}  // namespace mpnfs::cli
