// Timer: runs functions after a delay, on a thread of its own, in the order
// of their due times. For waits that must not hold a thread of their own
// while they last (a lock request asked again while another holds it).
//
// A function runs on the timer's thread and must not block for long: it
// starts the next step (an RPC) and returns. The destructor runs nothing
// still pending; it returns once a function running then has returned.
//
// Thread safety: After() may be called from any thread, also from a
// function the timer runs. Its lock, mu_, is a leaf (common/mutex.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <thread>
#include <utility>

#include "common/mutex.h"

namespace mpnfs {

class Timer {
 public:
  Timer() : thread_([this] { Run(); }) {}
  ~Timer() {
    {
      MutexLock lock(mu_);
      stop_ = true;
    }
    cv_.Signal();
    thread_.join();
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  void After(std::chrono::milliseconds delay, std::function<void()> fn) {
    {
      MutexLock lock(mu_);
      due_.emplace(std::make_pair(std::chrono::steady_clock::now() + delay, seq_++), std::move(fn));
    }
    cv_.Signal();
  }

 private:
  void Run() {
    MutexLock lock(mu_);
    while (!stop_) {
      if (due_.empty()) {
        cv_.Wait(mu_);
        continue;
      }
      auto first = due_.begin();
      if (first->first.first > std::chrono::steady_clock::now()) {
        cv_.WaitUntil(mu_, first->first.first);
        continue;
      }
      std::function<void()> fn = std::move(first->second);
      due_.erase(first);
      lock.Unlock();
      fn();
      lock.Lock();
    }
  }

  Mutex mu_;
  CondVar cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  uint64_t seq_ GUARDED_BY(mu_) = 0;
  std::map<std::pair<std::chrono::steady_clock::time_point, uint64_t>, std::function<void()>> due_ GUARDED_BY(mu_);
  std::thread thread_;  // last: started once the members it uses exist
};

}  // namespace mpnfs
