#include "nfs/service_stats.h"

namespace mpnfs::nfs {

void ServiceCounters::Record(const std::string& service, const std::string& endpoint,
                             const engine::OpStats& engine_counts, const std::string& error) {
  MutexLock lock(mu_);
  ServiceStats& s = by_name_[service];
  s.service = service;
  s.endpoint = endpoint;
  s.calls.Merge(engine_counts);
  if (engine_counts.ops == 0) {
    // No engine counted it (see the header): the call still happened.
    s.calls.ops += 1;
    if (!error.empty()) s.calls.errors += 1;
  }
  s.last_error = error;
  s.last_call = std::chrono::system_clock::now();
}

void ServiceCounters::Refused(const std::string& service, const std::string& why) {
  MutexLock lock(mu_);
  ServiceStats& s = by_name_[service];
  s.service = service;
  s.calls.nfs_errors += 1;
  s.last_error = why;
}

std::vector<ServiceStats> ServiceCounters::Snapshot() const {
  MutexLock lock(mu_);
  std::vector<ServiceStats> out;
  out.reserve(by_name_.size());
  for (const auto& [name, s] : by_name_) out.push_back(s);
  return out;
}

}  // namespace mpnfs::nfs
