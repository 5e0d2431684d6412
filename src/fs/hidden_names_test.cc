#include "fs/hidden_names.h"

#include <gtest/gtest.h>

#include <thread>

namespace mpnfs::fs {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

TEST(HiddenNamesTest, NothingPendingSettlesAtOnce) {
  HiddenNames h(10s, 10s);
  const auto t0 = Clock::now();
  h.Settle("");
  h.Settle("d");
  EXPECT_LT(Clock::now() - t0, 1s);
}

TEST(HiddenNamesTest, ARemovalHoldsItsDirectoryUntilDone) {
  HiddenNames h(10s, 30s);
  h.Closing("d", 7);
  h.Removing("d", 7);
  h.Settle("other");  // another directory: not held
  std::atomic<bool> done{false};
  std::thread t([&] {
    std::this_thread::sleep_for(100ms);
    done = true;
    h.Done("d", 7);
  });
  h.Settle("d");
  EXPECT_TRUE(done);
  t.join();
  EXPECT_EQ(h.size(), 0u);
}

TEST(HiddenNamesTest, ACloseHoldsForTheGraceAtMost) {
  HiddenNames h(200ms, 30s);
  h.Closing("d", 1);
  const auto t0 = Clock::now();
  h.Settle("");
  const auto waited = Clock::now() - t0;
  EXPECT_GE(waited, 150ms);
  EXPECT_LT(waited, 5s);
  // Past its grace it holds nobody up.
  const auto t1 = Clock::now();
  h.Settle("d");
  EXPECT_LT(Clock::now() - t1, 100ms);
  // A release without a name to remove forgets it.
  h.Released(1);
  EXPECT_EQ(h.size(), 0u);
}

TEST(HiddenNamesTest, ARemovalThatNeverEndsHoldsForTheLimitAtMost) {
  HiddenNames h(10ms, 300ms);
  h.Removing("d", 1);
  h.Released(1);  // (a removal in progress is not forgotten by that)
  const auto t0 = Clock::now();
  h.Settle("d");
  EXPECT_GE(Clock::now() - t0, 250ms);
  EXPECT_LT(Clock::now() - t0, 5s);
  EXPECT_EQ(h.size(), 1u);
}

}  // namespace
}  // namespace mpnfs::fs
