#include "fs/split.h"

#include <gtest/gtest.h>

namespace mpnfs::fs {
namespace {

TEST(SplitRangeTest, SmallRequestIsOnePiece) {
  auto p = SplitRange(100, 50, 1 << 20);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].off, 100u);
  EXPECT_EQ(p[0].buf_off, 0u);
  EXPECT_EQ(p[0].len, 50u);
}

TEST(SplitRangeTest, AlignsPiecesAfterTheFirstToTheLimit) {
  auto p = SplitRange(1000, 10000, 4096);  // [1000,4096) [4096,8192) [8192,11000)
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0].off, 1000u);
  EXPECT_EQ(p[0].len, 3096u);
  EXPECT_EQ(p[1].off, 4096u);
  EXPECT_EQ(p[1].buf_off, 3096u);
  EXPECT_EQ(p[2].off, 8192u);
  EXPECT_EQ(p[2].off + p[2].len, 11000u);
  size_t total = 0;
  for (auto& x : p) total += x.len;
  EXPECT_EQ(total, 10000u);
}

TEST(SplitRangeTest, CoversLargeOffsetsBeyond4GiB) {
  const uint64_t off = (5ull << 30) + 123;
  auto p = SplitRange(off, 3 << 20, 1 << 20);
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p.front().off, off);
  EXPECT_EQ(p.back().off + p.back().len, off + (3 << 20));
}

TEST(SplitRangeTest, EmptyRangeHasNoPieces) { EXPECT_TRUE(SplitRange(0, 0, 4096).empty()); }

TEST(StripePieceTest, OnePathKeepsTheFullSize) {
  EXPECT_EQ(StripePiece(1 << 20, 1, 1 << 20), 1u << 20);
  EXPECT_EQ(StripePiece(1 << 20, 0, 1 << 20), 1u << 20);
}

TEST(StripePieceTest, SharesALargeRequestAmongPaths) {
  EXPECT_EQ(StripePiece(1 << 20, 4, 1 << 20), 256u << 10);
  EXPECT_EQ(StripePiece(1 << 20, 2, 1 << 20), 512u << 10);
  // Rounded up to whole pages, so no path gets a sliver.
  EXPECT_EQ(StripePiece(1 << 20, 3, 1 << 20), 352256u);
  EXPECT_EQ(SplitRange(0, 1 << 20, StripePiece(1 << 20, 3, 1 << 20)).size(), 3u);
}

TEST(StripePieceTest, NeverBelowTheMinimumNorAboveRsize) {
  EXPECT_EQ(StripePiece(256 << 10, 8, 1 << 20), 128u << 10);
  EXPECT_EQ(StripePiece(64 << 10, 8, 1 << 20), 1u << 20);  // small: one call anyway
  EXPECT_EQ(StripePiece(4 << 20, 2, 1 << 20), 1u << 20);
}

}  // namespace
}  // namespace mpnfs::fs
