// fs::LockRanges against a byte oracle: random locks and unlocks of one
// owner (fixed seeds) leave exactly the bytes and types the oracle holds,
// as ranges that are ordered, disjoint and merged where they touch.
#include "fs/lock_ranges.h"

#include <gtest/gtest.h>

#include <random>

namespace mpnfs::fs {
namespace {

TEST(LockRanges, LocksSplitMergeAndReplaceAsPosixSays) {
  LockRanges r;
  r.Apply(0, 100, true, false);
  r.Apply(10, 20, false, false);  // a downgrade in the middle splits it
  EXPECT_EQ(r.All(), (std::vector<LockRanges::Range>{{0, 10, true}, {10, 20, false}, {20, 100, true}}));
  r.Apply(10, 20, true, false);  // and an upgrade merges it again
  EXPECT_EQ(r.All(), (std::vector<LockRanges::Range>{{0, 100, true}}));
  r.Apply(50, LockRanges::kToEnd, false, true);
  r.Apply(200, LockRanges::EndOf(200, 0), false, false);
  EXPECT_EQ(r.All(), (std::vector<LockRanges::Range>{{0, 50, true}, {200, LockRanges::kToEnd, false}}));
  EXPECT_EQ(LockRanges::LengthOf(r.All()[1]), 0u);
  EXPECT_EQ(LockRanges::EndOf(UINT64_MAX - 5, 10), LockRanges::kToEnd);
  r.Apply(0, LockRanges::kToEnd, false, true);
  EXPECT_TRUE(r.empty());
}

TEST(LockRanges, RandomLocksAndUnlocksAgreeWithAByteOracle) {
  for (uint32_t seed : {1u, 2u, 3u, 4u, 5u, 6u, 7u, 8u}) {
    constexpr uint64_t kBytes = 64;
    std::vector<int> oracle(kBytes, 0);  // 0 none, 1 shared, 2 exclusive
    LockRanges r;
    std::mt19937 rng(seed);
    for (int step = 0; step < 3000; ++step) {
      SCOPED_TRACE(testing::Message() << "seed " << seed << " step " << step);
      const uint64_t start = rng() % kBytes, end = std::min<uint64_t>(kBytes, start + 1 + rng() % 16);
      const int op = static_cast<int>(rng() % 3);  // unlock, shared, exclusive
      r.Apply(start, end, op == 2, op == 0);
      for (uint64_t b = start; b < end; ++b) oracle[b] = op;
      std::vector<int> seen(kBytes, 0);
      uint64_t last_end = 0;
      bool last_excl = false;
      for (const auto& x : r.All()) {
        ASSERT_LT(x.start, x.end);
        ASSERT_LE(x.end, kBytes);
        ASSERT_GE(x.start, last_end) << "ranges overlap";
        ASSERT_FALSE(x.start == last_end && x.start > 0 && last_excl == x.exclusive && seen[x.start - 1] != 0)
            << "touching ranges of one type are not merged";
        for (uint64_t b = x.start; b < x.end; ++b) seen[b] = x.exclusive ? 2 : 1;
        last_end = x.end;
        last_excl = x.exclusive;
      }
      ASSERT_EQ(seen, oracle);
    }
  }
}

}  // namespace
}  // namespace mpnfs::fs
