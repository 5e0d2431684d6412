#include "engine/backoff.h"

#include <gtest/gtest.h>

namespace mpnfs::engine {
namespace {

using namespace std::chrono_literals;

TEST(BackoffTest, DoublesUpToTheCapAndResets) {
  Backoff b(100ms, 1000ms);
  EXPECT_EQ(b.Next(), 100ms);
  EXPECT_EQ(b.Next(), 200ms);
  EXPECT_EQ(b.Next(), 400ms);
  EXPECT_EQ(b.Next(), 800ms);
  EXPECT_EQ(b.Next(), 1000ms);
  EXPECT_EQ(b.Next(), 1000ms);
  b.Reset();
  EXPECT_EQ(b.Next(), 100ms);
}

TEST(RetransmitTimeoutTest, GrowsLinearlyAndIsCappedAt600s) {
  EXPECT_EQ(RetransmitTimeout(60s, 1), 60s);
  EXPECT_EQ(RetransmitTimeout(60s, 2), 120s);
  EXPECT_EQ(RetransmitTimeout(60s, 3), 180s);
  EXPECT_EQ(RetransmitTimeout(60s, 20), 600s);
  EXPECT_EQ(RetransmitTimeout(1s, 0), 1s);
}

}  // namespace
}  // namespace mpnfs::engine
