// Backoff: capped exponential delay between reconnect attempts, and the
// retransmission timeout schedule. Pure functions of their inputs so that the
// policy is unit-tested on its own.
//
// Retransmission follows the Linux NFS client over TCP: the n-th transmission
// of a request waits timeo x n (linear), capped at 600 s. Reconnect waits
// start at `initial`, double after each failed attempt, and stop growing at
// `max`, so a dead server costs one connect attempt per `max` and no CPU.
#pragma once

#include <algorithm>
#include <chrono>

namespace mpnfs::engine {

using Millis = std::chrono::milliseconds;

inline Millis RetransmitTimeout(Millis timeo, int transmission /* 1-based */) {
  auto t = timeo * std::max(1, transmission);
  return std::min<Millis>(t, std::chrono::seconds(600));
}

class Backoff {
 public:
  Backoff(Millis initial, Millis max) : initial_(initial), max_(max), next_(initial) {}

  // Delay before the next attempt; grows the one after.
  Millis Next() {
    Millis d = next_;
    next_ = std::min(max_, next_ * 2);
    return d;
  }
  void Reset() { next_ = initial_; }

 private:
  const Millis initial_;
  const Millis max_;
  Millis next_;
};

}  // namespace mpnfs::engine
