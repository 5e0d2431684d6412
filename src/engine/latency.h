// LatencyHistogram: reply latencies of one connection in power-of-two
// microsecond buckets, lock-free, so that the statistics can report a mean
// and a p99 without keeping samples. Record() is called by the loop thread;
// Mean()/Percentile() from any thread (relaxed atomics; a snapshot may mix
// a few concurrent records, which statistics tolerate).
#pragma once

#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>

namespace mpnfs::engine {

class LatencyHistogram {
 public:
  static constexpr int kBuckets = 32;  // bucket b holds [2^(b-1), 2^b) us; b=0 holds 0

  void Record(std::chrono::microseconds d) {
    const uint64_t us = d.count() > 0 ? static_cast<uint64_t>(d.count()) : 0;
    const int b = std::min<int>(kBuckets - 1, static_cast<int>(std::bit_width(us)));
    buckets_[b].fetch_add(1, std::memory_order_relaxed);
    count_.fetch_add(1, std::memory_order_relaxed);
    sum_us_.fetch_add(us, std::memory_order_relaxed);
  }
  uint64_t Count() const { return count_.load(std::memory_order_relaxed); }
  uint64_t MeanUs() const {
    const uint64_t n = Count();
    return n == 0 ? 0 : sum_us_.load(std::memory_order_relaxed) / n;
  }
  // Upper bound of the bucket holding the p-th percentile (0 < p <= 100).
  uint64_t PercentileUs(double p) const {
    const uint64_t n = Count();
    if (n == 0) return 0;
    const auto want = static_cast<uint64_t>(static_cast<double>(n) * p / 100.0 + 0.999999);
    uint64_t seen = 0;
    for (int b = 0; b < kBuckets; ++b) {
      seen += buckets_[b].load(std::memory_order_relaxed);
      if (seen >= want) return b == 0 ? 0 : (uint64_t{1} << b) - 1;
    }
    return (uint64_t{1} << (kBuckets - 1)) - 1;
  }

 private:
  std::array<std::atomic<uint64_t>, kBuckets> buckets_{};
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_us_{0};
};

}  // namespace mpnfs::engine
