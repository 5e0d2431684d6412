#include "cache/policy.h"

#include <gtest/gtest.h>

#include <set>

namespace mpnfs::cache {
namespace {

std::string K(int i) { return "k" + std::to_string(i); }

uint32_t Alloc(TwoQueue& q, const std::string& key, bool* evicted = nullptr) {
  bool e = false;
  auto s = q.Allocate(key, &e);
  EXPECT_TRUE(s.has_value());
  if (evicted) *evicted = e;
  return s.value_or(0);
}

TEST(TwoQueueTest, FillsFreeSlotsBeforeEvicting) {
  TwoQueue q(8);
  std::set<uint32_t> seen;
  for (int i = 0; i < 8; ++i) {
    bool evicted = true;
    seen.insert(Alloc(q, K(i), &evicted));
    EXPECT_FALSE(evicted);
  }
  EXPECT_EQ(seen.size(), 8u);
  EXPECT_EQ(q.in_use(), 8u);
  bool evicted = false;
  Alloc(q, K(100), &evicted);
  EXPECT_TRUE(evicted);
  EXPECT_EQ(q.in_use(), 8u);
}

// A slot released while an operation still holds it (pinned) is not handed
// out again until that operation lets go.
TEST(TwoQueueTest, AReleasedSlotStillPinnedIsNotHandedOut) {
  TwoQueue q(4);
  const uint32_t held = Alloc(q, K(1));
  q.Pin(held);
  q.Release(held);
  const uint32_t other = Alloc(q, K(2));
  EXPECT_NE(other, held);
  for (int i = 3; i < 10; ++i) EXPECT_NE(Alloc(q, K(i)), held) << "allocation " << i;
  q.Unpin(held);
  std::set<uint32_t> got;
  for (int i = 10; i < 20; ++i) got.insert(Alloc(q, K(i)));
  EXPECT_TRUE(got.count(held)) << "the slot never came back once unpinned";
}

TEST(TwoQueueTest, AScanDoesNotEvictBlocksUsedTwice) {
  TwoQueue q(100);
  std::vector<uint32_t> hot;
  for (int i = 0; i < 50; ++i) {
    hot.push_back(Alloc(q, K(i)));
    q.Touch(hot.back());  // used twice: promoted
  }
  // A scan of 1000 blocks, each used once.
  for (int i = 1000; i < 2000; ++i) Alloc(q, K(i));
  for (uint32_t s : hot) EXPECT_TRUE(q.InMain(s)) << s;
  EXPECT_EQ(q.main(), 50u);
}

TEST(TwoQueueTest, AGhostHitIsAdmittedHot) {
  TwoQueue q(8);
  for (int i = 0; i < 8; ++i) Alloc(q, K(i));
  Alloc(q, K(8));  // evicts K(0) from probation onto the ghost list
  EXPECT_TRUE(q.Ghost(K(0)));
  uint32_t s = Alloc(q, K(0));
  EXPECT_TRUE(q.InMain(s));
  EXPECT_FALSE(q.Ghost(K(0)));
}

TEST(TwoQueueTest, AdmitSecondCachesOnlyOnTheSecondMiss) {
  TwoQueue q(8, /*admit_second=*/true);
  EXPECT_FALSE(q.Admit(K(1)));
  EXPECT_TRUE(q.Admit(K(1)));
  EXPECT_TRUE(q.InMain(Alloc(q, K(1))));
  TwoQueue first(8);
  EXPECT_TRUE(first.Admit(K(1)));
}

TEST(TwoQueueTest, PinnedSlotsAreNotEvicted) {
  TwoQueue q(2);
  uint32_t a = Alloc(q, K(1));
  uint32_t b = Alloc(q, K(2));
  q.Pin(a);
  q.Pin(b);
  bool evicted = false;
  EXPECT_FALSE(q.Allocate(K(3), &evicted).has_value());
  q.Unpin(b);
  EXPECT_EQ(Alloc(q, K(3)), b);
}

// Released slots are handed out after the slots free before them (a
// copy-on-write partner waits at the back), and Take claims a given free
// slot unless it is in use or pinned.
TEST(TwoQueueTest, AReleasedSlotIsHandedOutLastAndCanBeTakenBack) {
  TwoQueue q(4);
  const uint32_t a = Alloc(q, K(1));
  q.Release(a);
  std::set<uint32_t> got;
  for (int i = 2; i < 5; ++i) got.insert(Alloc(q, K(i)));
  EXPECT_FALSE(got.count(a)) << "a released slot was handed out before the free ones";
  EXPECT_FALSE(q.Take(*got.begin(), TwoQueue::Hash(K(9)), false)) << "took a slot in use";
  q.Pin(a);
  EXPECT_FALSE(q.Take(a, TwoQueue::Hash(K(9)), false)) << "took a pinned slot";
  q.Unpin(a);
  EXPECT_TRUE(q.Take(a, TwoQueue::Hash(K(9)), true));
  EXPECT_TRUE(q.InMain(a));
  EXPECT_EQ(q.in_use(), 4u);
}

TEST(TwoQueueTest, ReleasedAndAdoptedSlotsKeepTheCountRight) {
  TwoQueue q(4);
  q.Adopt(2, K(2), true);
  q.Adopt(0, K(0), false);
  EXPECT_EQ(q.in_use(), 2u);
  std::set<uint32_t> got = {Alloc(q, K(5)), Alloc(q, K(6))};
  EXPECT_EQ(got, (std::set<uint32_t>{1, 3}));
  q.Release(2);
  EXPECT_EQ(q.in_use(), 3u);
  EXPECT_EQ(Alloc(q, K(7)), 2u);
  EXPECT_EQ(q.in_use(), 4u);
}

}  // namespace
}  // namespace mpnfs::cache
