// The statistics of a mount's calls to the server's other services: the
// portmapper, MOUNT and the status monitor (NSM), called one call at a time
// by nfs/mount3.h, and the lock manager (NLM), whose engine the lock
// service keeps (cli/lock_service.h). `mpnfsctl stats` shows them under
// "services", the Prometheus metrics as mpnfs_service_* (mpnfsctl(8)).
//
// The counts are the engine's (engine::OpStats, each call's engine summed
// per service): a call that ends counts in `ops`, one that ends without an
// answer also in `errors`. A call the engine did not count (none could
// start, no time was left to send it, the engine ended it while stopping)
// counts here as an op, and as an error if it failed. An answer that
// refuses (MOUNT's status other than OK, a program the portmapper does not
// know) counts in `calls.nfs_errors` (Refused()).
//
// Thread safety: ServiceCounters is thread safe; its mu_ is a leaf.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "engine/engine.h"

namespace mpnfs::nfs {

struct ServiceStats {
  std::string service;   // "PORTMAP", "MOUNT", "NSM", "NLM"
  std::string endpoint;  // host:port of its last call
  // NLM: its connection's state (engine::ConnectionStats::state); the
  // services called one call at a time keep no connection: "none".
  std::string state = "none";
  engine::OpStats calls;
  uint64_t reconnects = 0;  // NLM: connections lost while up
  uint64_t lost_locks = 0;  // NLM: locks the server no longer granted after its restart (fs/locks.h)
  // Why its last call failed or was refused (empty if it succeeded); NLM:
  // while its connection is not up, why it last went down.
  std::string last_error;
  std::chrono::system_clock::time_point last_call{};  // when its last call ended
};

// The services called one call at a time, summed per service.
class ServiceCounters {
 public:
  // A call of `service` to `endpoint` ended: `engine_counts` is what its
  // engine counted (empty if none could start), `error` why it failed
  // (empty if answered).
  void Record(const std::string& service, const std::string& endpoint, const engine::OpStats& engine_counts,
              const std::string& error);
  // The answer to the last call of `service` refused it: `why`.
  void Refused(const std::string& service, const std::string& why);
  // Every service called so far, by name.
  std::vector<ServiceStats> Snapshot() const;

 private:
  mutable Mutex mu_;
  std::map<std::string, ServiceStats> by_name_ GUARDED_BY(mu_);
};

}  // namespace mpnfs::nfs
