// LatencyHistogram: reply latencies of one connection in power-of-two
// microsecond buckets, lock-free, so that the statistics can report a mean
// and percentiles (p50, p99) without keeping samples. Record() is called by
// the loop thread; Mean()/Percentile()/Snapshot() from any thread (relaxed
// atomics; a snapshot may mix a few concurrent records, which statistics
// tolerate). A LatencySnapshot is a plain copy: snapshots of several
// histograms (the connections of a mount) add up with Merge().
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>

namespace mpnfs::engine {

inline constexpr int kLatencyBuckets = 32;  // bucket b holds [2^(b-1), 2^b) us; b=0 holds 0

struct LatencySnapshot {
  std::array<uint64_t, kLatencyBuckets> buckets{};
  uint64_t count = 0;
  uint64_t sum_us = 0;

  void Merge(const LatencySnapshot& o) {
    for (int b = 0; b < kLatencyBuckets; ++b) buckets[b] += o.buckets[b];
    count += o.count;
    sum_us += o.sum_us;
  }
  uint64_t MeanUs() const { return count == 0 ? 0 : sum_us / count; }
  // Upper bound of the bucket holding the p-th percentile (0 < p <= 100).
  uint64_t PercentileUs(double p) const {
    if (count == 0) return 0;
    const auto want = static_cast<uint64_t>(static_cast<double>(count) * p / 100.0 + 0.999999);
    uint64_t seen = 0;
    for (int b = 0; b < kLatencyBuckets; ++b) {
      seen += buckets[b];
      if (seen >= want) return b == 0 ? 0 : (uint64_t{1} << b) - 1;
    }
    return (uint64_t{1} << (kLatencyBuckets - 1)) - 1;
  }
};

class LatencyHistogram {
 public:
  static constexpr int kBuckets = kLatencyBuckets;

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
  uint64_t PercentileUs(double p) const { return Snapshot().PercentileUs(p); }

  // The count is the sum of the buckets read, so percentiles stay consistent.
  LatencySnapshot Snapshot() const {
    LatencySnapshot s;
    for (int b = 0; b < kBuckets; ++b) {
      s.buckets[b] = buckets_[b].load(std::memory_order_relaxed);
      s.count += s.buckets[b];
    }
    s.sum_us = sum_us_.load(std::memory_order_relaxed);
    return s;
  }

 private:
  std::array<std::atomic<uint64_t>, kBuckets> buckets_{};
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_us_{0};
};

}  // namespace mpnfs::engine
