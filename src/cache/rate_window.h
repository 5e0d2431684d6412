// RateWindow: bytes per second over the last kSeconds, from amounts added
// as they happen (the flusher's flushed bytes). One slot per second in a
// ring, so no sample is kept and nothing is allocated.
//
// Thread safety: none; the owner serialises (BlockCache under its mutex).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>

namespace mpnfs::cache {

// Whole seconds of the monotonic clock (the clock RateWindow is fed).
inline int64_t MonotonicSec() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class RateWindow {
 public:
  static constexpr int kSeconds = 10;

  // `sec`: a monotonic clock in whole seconds.
  void Add(int64_t sec, uint64_t n) {
    const int i = Slot(sec);
    if (sec_[i] != sec) {
      sec_[i] = sec;
      bytes_[i] = 0;
    }
    bytes_[i] += n;
  }
  // The mean over the kSeconds seconds up to and including `now_sec`.
  uint64_t PerSecond(int64_t now_sec) const {
    uint64_t sum = 0;
    for (int i = 0; i < kSeconds; ++i) {
      if (sec_[i] > now_sec - kSeconds && sec_[i] <= now_sec) sum += bytes_[i];
    }
    return sum / kSeconds;
  }

 private:
  static int Slot(int64_t sec) {
    return static_cast<int>(((sec % kSeconds) + kSeconds) % kSeconds);
  }
  std::array<uint64_t, kSeconds> bytes_{};
  std::array<int64_t, kSeconds> sec_{-1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
};

}  // namespace mpnfs::cache
