// Logging: one spdlog logger per layer ("engine", "nfs", "fs", "fuse", "mount").
// The layer "setup" (the engine of a single call made at mount time or to
// find the lock manager again, nfs/mount3.h) shows only errors unless the
// level is debug or finer: its callers report what failed, and a lookup
// repeated every few seconds must not log each of its connections.
//
// InitLogging() decides the sink once at start-up: stderr in the foreground,
// syslog (ident "mpnfs") once daemonised. Layers fetch their logger with
// Log("engine") and keep the shared_ptr; loggers are thread safe.
//
// RateLimit lets a hot failure path (a server that is down) log once per
// interval and count what it suppressed, so an outage cannot fill a disk.
#pragma once

#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

namespace mpnfs {

enum class LogSink { kStderr, kSyslog };

// REQUIRES: called once, before any thread that logs is started.
void InitLogging(LogSink sink, spdlog::level::level_enum level);

std::shared_ptr<spdlog::logger> Log(const std::string& layer);

// Parses "trace|debug|info|warn|error|critical|off".
bool ParseLogLevel(const std::string& s, spdlog::level::level_enum* out);

class RateLimit {
 public:
  explicit RateLimit(std::chrono::milliseconds interval) : interval_ms_(interval.count()) {}
  // True when the caller may log now; *suppressed receives how many calls
  // were refused since the last permitted one. Thread safe.
  bool Allow(uint64_t* suppressed);

 private:
  const int64_t interval_ms_;
  std::atomic<int64_t> next_ms_{0};
  std::atomic<uint64_t> suppressed_{0};
};

}  // namespace mpnfs
