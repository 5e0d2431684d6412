// LinkRate: how fast a connection's link carries data, from the wire's own
// timing, for the balancer's weights when weight= does not say them.
//
// The rule. A sample is the rate at which the bytes of one large RPC record
// crossed the link: a READ reply's second half as it arrives
// (RpcTransport), the kernel's delivery rate of a large WRITE's data when
// TCP says the sample was not limited by the application (tcpi_delivery_rate).
// Either depends on the link and on the server's sending, not on how much
// work the balancer gives the path: one record on an otherwise idle path
// measures the same as one of many. (Throughput per path, or latency, do
// depend on the load given, and weights made of them feed on themselves:
// balance_test.cc.) The estimate is the 75th percentile of the samples of
// the last kWindow (at most kSamples of them). Not their maximum: a few
// samples come out too high, a record's bytes bunched by a shaper's burst
// allowance or by the kernel's delivery of TCP's acknowledgements, and a
// few too low, a loop thread busy elsewhere reading late. No sample in
// kWindow: unknown (the balancer then treats the path as fast as the
// fastest one known, so it gets work and is measured).
//
// A link rate above what the whole mount moved at its recent peak
// (MountRate) counts as that peak: such a link is not what limits the
// mount, and where no link does (paths faster than the client or the
// server can go), the timing of records measures the client's threads, not
// the links, and shares the work no better than the shortest queue.
//
// Thread: Add() and Reset() on the connection's loop thread; Get() from
// any thread.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

#include "common/mutex.h"
#include "engine/request.h"

namespace mpnfs::engine {

class LinkRate {
 public:
  static constexpr std::chrono::milliseconds kWindow{2000};
  // Records smaller than this tell nothing: a few segments cross at once.
  static constexpr uint64_t kMinRecord = 256 << 10;

  // Loop thread. `bytes_per_s` > 0.
  void Add(Clock::time_point now, uint64_t bytes_per_s) {
    if (bytes_per_s == 0) return;
    samples_[next_++ % samples_.size()] = Sample{now, bytes_per_s};
    std::array<uint64_t, kSamples> recent;
    size_t n = 0;
    for (const Sample& x : samples_) {
      if (x.rate > 0 && now - x.at <= kWindow) recent[n++] = x.rate;
    }
    auto at = recent.begin() + static_cast<ptrdiff_t>(3 * (n - 1) / 4);
    std::nth_element(recent.begin(), at, recent.begin() + static_cast<ptrdiff_t>(n));
    rate_.store(*at, std::memory_order_relaxed);
    last_.store(now.time_since_epoch().count(), std::memory_order_relaxed);
  }
  // Any thread: bytes per second, or 0 if unknown.
  uint64_t Get(Clock::time_point now) const {
    const Clock::time_point last{Clock::duration(last_.load(std::memory_order_relaxed))};
    if (now - last > kWindow) return 0;
    return rate_.load(std::memory_order_relaxed);
  }
  // Loop thread: forgets everything (a new TCP connection).
  void Reset() {
    samples_ = {};
    rate_.store(0, std::memory_order_relaxed);
    last_.store(0, std::memory_order_relaxed);
  }

 private:
  static constexpr size_t kSamples = 32;
  struct Sample {
    Clock::time_point at{};
    uint64_t rate = 0;  // 0: none
  };
  std::array<Sample, kSamples> samples_{};
  size_t next_ = 0;
  std::atomic<uint64_t> rate_{0};
  std::atomic<Clock::rep> last_{0};
};

// MountRate: the bytes per second all of a mount's calls moved, at the
// peak of the last kWindow (the largest of four slots of kWindow / 4).
// Thread: any. Its lock is a leaf, only ever try-locked.
class MountRate {
 public:
  // Bytes of an answered call (READ or WRITE data).
  void Add(int64_t bytes) { total_.fetch_add(static_cast<uint64_t>(bytes), std::memory_order_relaxed); }
  uint64_t Peak(Clock::time_point now) {
    if (now.time_since_epoch().count() >= slot_end_.load(std::memory_order_relaxed) && mu_.TryLock()) {
      Roll(now);
      mu_.Unlock();
    }
    return peak_.load(std::memory_order_relaxed);
  }

 private:
  static constexpr Clock::duration kSlot = std::chrono::duration_cast<Clock::duration>(LinkRate::kWindow) / 4;
  void Roll(Clock::time_point now) REQUIRES(mu_) {
    // Another thread may have rolled since this one looked (its `now` then
    // precedes or barely follows the new slot's start).
    if (start_ != Clock::time_point{} && now - start_ < kSlot) return;
    const uint64_t total = total_.load(std::memory_order_relaxed);
    if (start_ != Clock::time_point{}) {
      const double secs = std::chrono::duration<double>(now - start_).count();
      // A slot much longer than kSlot was idle for most of it: its rate
      // stands for the whole gap, and the older slots are gone.
      if (now - start_ > LinkRate::kWindow) slots_ = {};
      slots_[next_++ % slots_.size()] = static_cast<uint64_t>(static_cast<double>(total - start_total_) / secs);
      peak_.store(*std::max_element(slots_.begin(), slots_.end()), std::memory_order_relaxed);
    }
    start_ = now;
    start_total_ = total;
    slot_end_.store((now + kSlot).time_since_epoch().count(), std::memory_order_relaxed);
  }

  std::atomic<uint64_t> total_{0};
  std::atomic<Clock::rep> slot_end_{0};
  std::atomic<uint64_t> peak_{0};
  Mutex mu_;
  Clock::time_point start_ GUARDED_BY(mu_){};
  uint64_t start_total_ GUARDED_BY(mu_) = 0;
  std::array<uint64_t, 4> slots_ GUARDED_BY(mu_){};
  size_t next_ GUARDED_BY(mu_) = 0;
};

}  // namespace mpnfs::engine
