#include "fs/hidden_names.h"

namespace mpnfs::fs {

void HiddenNames::Closing(const std::string& dir, uint64_t ino) {
  MutexLock lock(mu_);
  State& s = names_[{dir, ino}];
  if (!s.removing) s.since = Clock::now();
}

void HiddenNames::Removing(const std::string& dir, uint64_t ino) {
  MutexLock lock(mu_);
  State& s = names_[{dir, ino}];
  s.removing = true;
  s.since = Clock::now();
}

void HiddenNames::Done(const std::string& dir, uint64_t ino) {
  {
    MutexLock lock(mu_);
    names_.erase({dir, ino});
  }
  cv_.SignalAll();
}

void HiddenNames::Released(uint64_t ino) {
  {
    MutexLock lock(mu_);
    std::erase_if(names_, [ino](const auto& kv) { return kv.first.second == ino && !kv.second.removing; });
  }
  cv_.SignalAll();
}

bool HiddenNames::Busy(const std::string& dir, Clock::time_point now, Clock::time_point* until) const {
  bool busy = false;
  *until = now + limit_;
  for (const auto& [key, s] : names_) {
    if (!dir.empty() && key.first != dir) continue;
    if (s.removing) {
      busy = true;
    } else if (now < s.since + grace_) {
      busy = true;
      *until = std::min(*until, s.since + grace_);
    }
  }
  return busy;
}

void HiddenNames::Settle(const std::string& dir) {
  MutexLock lock(mu_);
  const Clock::time_point deadline = Clock::now() + limit_;
  while (true) {
    const Clock::time_point now = Clock::now();
    Clock::time_point until;
    if (!Busy(dir, now, &until) || now >= deadline) return;
    cv_.WaitUntil(mu_, std::min(until, deadline));
  }
}

size_t HiddenNames::size() const {
  MutexLock lock(mu_);
  return names_.size();
}

}  // namespace mpnfs::fs
