#include "common/log.h"

#include <spdlog/sinks/dist_sink.h>

#include <algorithm>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/sinks/syslog_sink.h>
#include <syslog.h>

#include "common/mutex.h"

namespace mpnfs {
namespace {

// Loggers all write to one dist_sink whose target is swapped by InitLogging,
// so loggers created before daemonising follow the switch to syslog.
struct LogState {
  Mutex mu;
  std::shared_ptr<spdlog::sinks::dist_sink_mt> sink =
      std::make_shared<spdlog::sinks::dist_sink_mt>(
          std::vector<spdlog::sink_ptr>{std::make_shared<spdlog::sinks::stderr_sink_mt>()});
  spdlog::level::level_enum level GUARDED_BY(mu) = spdlog::level::info;
};

LogState& State() {
  static LogState s;  // function-local: created on first use, never destroyed early
  return s;
}

// A layer's level when the process's is `level` (log.h: "setup" is quieter).
spdlog::level::level_enum LevelFor(const std::string& layer, spdlog::level::level_enum level) {
  return layer == "setup" && level > spdlog::level::debug ? std::max(level, spdlog::level::err) : level;
}

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void InitLogging(LogSink sink, spdlog::level::level_enum level) {
  LogState& s = State();
  MutexLock lock(s.mu);
  if (sink == LogSink::kSyslog) {
    s.sink->set_sinks({std::make_shared<spdlog::sinks::syslog_sink_mt>("mpnfs", LOG_PID,
                                                                         LOG_DAEMON, false)});
  } else {
    s.sink->set_sinks({std::make_shared<spdlog::sinks::stderr_sink_mt>()});
  }
  s.level = level;
  spdlog::apply_all([level](std::shared_ptr<spdlog::logger> l) { l->set_level(LevelFor(l->name(), level)); });
}

std::shared_ptr<spdlog::logger> Log(const std::string& layer) {
  LogState& s = State();
  MutexLock lock(s.mu);
  if (auto l = spdlog::get(layer)) return l;
  auto l = std::make_shared<spdlog::logger>(layer, s.sink);
  l->set_level(LevelFor(layer, s.level));
  l->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ [%n] %v");
  l->flush_on(spdlog::level::warn);
  spdlog::register_logger(l);
  return l;
}

bool ParseLogLevel(const std::string& s, spdlog::level::level_enum* out) {
  auto l = spdlog::level::from_str(s);
  if (l == spdlog::level::off && s != "off") return false;
  *out = l;
  return true;
}

bool RateLimit::Allow(uint64_t* suppressed) {
  int64_t now = NowMs();
  int64_t next = next_ms_.load(std::memory_order_relaxed);
  if (now >= next && next_ms_.compare_exchange_strong(next, now + interval_ms_)) {
    *suppressed = suppressed_.exchange(0);
    return true;
  }
  suppressed_.fetch_add(1, std::memory_order_relaxed);
  return false;
}

}  // namespace mpnfs
