#include "engine/latency.h"

#include <gtest/gtest.h>

namespace mpnfs::engine {
namespace {

using std::chrono::microseconds;

TEST(LatencyHistogramTest, EmptyReportsZero) {
  LatencyHistogram h;
  EXPECT_EQ(h.MeanUs(), 0u);
  EXPECT_EQ(h.PercentileUs(99), 0u);
}

TEST(LatencyHistogramTest, MeanIsExactAndP99FindsTheTail) {
  LatencyHistogram h;
  for (int i = 0; i < 990; ++i) h.Record(microseconds(100));  // bucket [64,128)
  for (int i = 0; i < 10; ++i) h.Record(microseconds(5000));  // bucket [4096,8192)
  EXPECT_EQ(h.Count(), 1000u);
  EXPECT_EQ(h.MeanUs(), (990 * 100 + 10 * 5000) / 1000u);
  EXPECT_EQ(h.PercentileUs(50), 127u);
  EXPECT_EQ(h.PercentileUs(99), 127u);     // 990 of 1000 are <= 127 us
  EXPECT_EQ(h.PercentileUs(99.5), 8191u);  // the tail
  EXPECT_EQ(h.PercentileUs(100), 8191u);
}

}  // namespace
}  // namespace mpnfs::engine
