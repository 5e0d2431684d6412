#include "engine/link_rate.h"

#include <gtest/gtest.h>

namespace mpnfs::engine {
namespace {

using namespace std::chrono_literals;

const Clock::time_point kT0 = Clock::time_point(1000s);

TEST(LinkRateTest, UnknownUntilASample) {
  LinkRate r;
  EXPECT_EQ(r.Get(kT0), 0u);
  r.Add(kT0, 100);
  EXPECT_EQ(r.Get(kT0), 100u);
}

// The 75th percentile: a few samples too high (a record's bytes bunched by
// a shaper's burst allowance) or too low (read late) do not count.
TEST(LinkRateTest, TheUpperQuartileOfTheWindowCounts) {
  LinkRate r;
  r.Add(kT0, 300);
  r.Add(kT0 + 100ms, 100);
  r.Add(kT0 + 900ms, 200);
  EXPECT_EQ(r.Get(kT0 + 900ms), 200u);
  for (int i = 0; i < 10; ++i) r.Add(kT0 + 1s, 100);
  r.Add(kT0 + 1s, 5000);
  r.Add(kT0 + 1s, 1);
  EXPECT_EQ(r.Get(kT0 + 1s), 100u);
}

// Samples leave the estimate once the window has passed them, while
// others go on coming: a link that slowed down is seen to.
TEST(LinkRateTest, OldSamplesExpire) {
  LinkRate r;
  for (int i = 0; i < 10; ++i) r.Add(kT0, 1000);
  for (auto t = kT0 + 100ms; t < kT0 + 3s; t += 500ms) r.Add(t, 100);
  EXPECT_EQ(r.Get(kT0 + 3s), 100u);
}

// No sample for a window: unknown again (the balancer then gives the
// connection work, and so measures it).
TEST(LinkRateTest, NoSampleForAWindowIsUnknown) {
  LinkRate r;
  r.Add(kT0, 100);
  EXPECT_EQ(r.Get(kT0 + LinkRate::kWindow), 100u);
  EXPECT_EQ(r.Get(kT0 + LinkRate::kWindow + 1ms), 0u);
  r.Add(kT0 + 10s, 50);
  EXPECT_EQ(r.Get(kT0 + 10s), 50u) << "a sample from before the gap still counted";
}

TEST(LinkRateTest, ResetForgets) {
  LinkRate r;
  r.Add(kT0, 100);
  r.Reset();
  EXPECT_EQ(r.Get(kT0), 0u);
  r.Add(kT0 + 1ms, 40);
  EXPECT_EQ(r.Get(kT0 + 1ms), 40u);
}

TEST(MountRateTest, UnknownUntilASlotHasPassed) {
  MountRate m;
  m.Add(1 << 20);
  EXPECT_EQ(m.Peak(kT0), 0u);
  m.Add(100 << 20);
  EXPECT_EQ(m.Peak(kT0 + 100ms), 0u) << "rolled before its slot ended";
}

// The peak of the last four slots: 100 MiB in the first 500 ms slot, then
// 10 MiB per slot.
TEST(MountRateTest, ThePeakOfTheLastFourSlots) {
  MountRate m;
  m.Peak(kT0);  // starts the first slot
  m.Add(100 << 20);
  EXPECT_EQ(m.Peak(kT0 + 500ms), 200ull << 20);
  auto t = kT0 + 500ms;
  for (int k = 1; k <= 3; ++k) {
    m.Add(10 << 20);
    t += 500ms;
    EXPECT_EQ(m.Peak(t), 200ull << 20) << "slot " << k;
  }
  m.Add(10 << 20);
  t += 500ms;
  EXPECT_EQ(m.Peak(t), 20ull << 20) << "the busy slot is more than four slots old";
}

// After a gap longer than the window, the old slots are gone and the gap's
// slot stands for the idle time.
TEST(MountRateTest, AnIdleGapForgetsThePeak) {
  MountRate m;
  m.Peak(kT0);
  m.Add(100 << 20);
  EXPECT_EQ(m.Peak(kT0 + 500ms), 200ull << 20);
  m.Add(10 << 20);
  EXPECT_EQ(m.Peak(kT0 + 500ms + 10s), 1ull << 20);
}

}  // namespace
}  // namespace mpnfs::engine
