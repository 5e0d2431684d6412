#include "fs/write_order.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <random>
#include <set>

namespace mpnfs::fs {
namespace {

TEST(WriteOrderTest, OverlappingWriteWaitsForTheEarlierOne) {
  WriteOrder o;
  std::vector<WriteOrder::Seq> started;
  auto start = [&](WriteOrder::Seq s) { started.push_back(s); };
  WriteOrder::Seq a, b, c;
  ASSERT_TRUE(o.Admit(0, 4096, start, &a));
  EXPECT_FALSE(o.Admit(4095, 2, start, &b));   // overlaps a by one byte
  EXPECT_TRUE(o.Admit(4097, 100, start, &c));  // overlaps nothing in flight
  EXPECT_TRUE(started.empty());
  EXPECT_EQ(o.waiting(), 1u);
  auto run = o.Finish(a);
  ASSERT_EQ(run.size(), 1u);
  run[0]();
  EXPECT_EQ(started, std::vector<WriteOrder::Seq>{b});
}

TEST(WriteOrderTest, AdjacentWritesDoNotWait) {
  WriteOrder o;
  WriteOrder::Seq s;
  auto never = [](WriteOrder::Seq) { FAIL() << "started late"; };
  for (uint64_t i = 0; i < 64; ++i) ASSERT_TRUE(o.Admit(i * 4096, 4096, never, &s));
  EXPECT_EQ(o.waiting(), 0u);
}

TEST(WriteOrderTest, WaitsForEveryEarlierOverlap) {
  WriteOrder o;
  std::vector<WriteOrder::Seq> started;
  auto start = [&](WriteOrder::Seq s) { started.push_back(s); };
  WriteOrder::Seq a, b, c;
  o.Admit(0, 10, start, &a);
  o.Admit(20, 10, start, &b);
  EXPECT_FALSE(o.Admit(5, 20, start, &c));  // overlaps both
  EXPECT_TRUE(o.Finish(b).empty());
  auto run = o.Finish(a);
  ASSERT_EQ(run.size(), 1u);
  run[0]();
  EXPECT_EQ(started, std::vector<WriteOrder::Seq>{c});
}

TEST(WriteOrderTest, WriteOverlapsSeesWritesStartedOrWaitingButNotTruncates) {
  WriteOrder o;
  WriteOrder::Seq a, b, t;
  auto nop = [](WriteOrder::Seq) {};
  ASSERT_TRUE(o.Admit(0, 100, nop, &a));
  EXPECT_FALSE(o.Admit(50, 100, nop, &b));  // waiting for `a`
  EXPECT_TRUE(o.WriteOverlaps(120, 10));    // `b`, waiting
  EXPECT_FALSE(o.WriteOverlaps(150, 10));   // adjacent
  EXPECT_TRUE(o.AdmitTail(1000, nop, &t));   // nothing out past 1000: at once
  EXPECT_FALSE(o.WriteOverlaps(2000, 10));  // only the truncate there
}

TEST(WriteOrderTest, TruncateOrdersAgainstWritesPastItsSizeOnly) {
  WriteOrder o;
  std::vector<WriteOrder::Seq> started;
  auto start = [&](WriteOrder::Seq s) { started.push_back(s); };
  WriteOrder::Seq past, below, trunc, later, under;
  ASSERT_TRUE(o.Admit(8192, 4096, start, &past));
  ASSERT_TRUE(o.Admit(0, 100, start, &below));
  EXPECT_FALSE(o.AdmitTail(4096, start, &trunc));      // waits for the write past 4096
  EXPECT_FALSE(o.Admit(1u << 30, 10, start, &later));  // far past: waits for the truncate
  EXPECT_TRUE(o.Admit(100, 3996, start, &under));      // below the new size: free
  auto run = o.Finish(past);
  ASSERT_EQ(run.size(), 1u);
  run[0]();
  EXPECT_EQ(started, std::vector<WriteOrder::Seq>{trunc});
  run = o.Finish(trunc);
  ASSERT_EQ(run.size(), 1u);
  run[0]();
  EXPECT_EQ(started.back(), later);
}

TEST(SubtractRangesTest, CutsHolesOut) {
  using V = std::vector<std::pair<uint64_t, uint64_t>>;
  EXPECT_EQ(SubtractRanges(0, 100, {}), (V{{0, 100}}));
  EXPECT_EQ(SubtractRanges(0, 100, {{10, 10}, {50, 60}}), (V{{0, 10}, {20, 30}}));
  EXPECT_EQ(SubtractRanges(10, 10, {{0, 100}}), V{});
  EXPECT_EQ(SubtractRanges(10, 10, {{0, 5}, {25, 5}}), (V{{10, 10}}));
  EXPECT_EQ(SubtractRanges(0, 100, {{30, 10}, {0, 35}}), (V{{40, 60}}));
}

// Random admissions and completions (completions in random order, as a
// server answers): no two overlapping writes are ever started and unfinished
// at once, a write starts only after every earlier overlapping write
// finished, and every write starts eventually.
TEST(WriteOrderTest, RandomScheduleKeepsOverlapsSerialAndStartsEverything) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    std::mt19937_64 rng(seed);
    WriteOrder o;
    struct W {
      uint64_t off, end;
    };
    std::map<WriteOrder::Seq, W> all;
    std::set<WriteOrder::Seq> running, finished;
    std::vector<std::function<void()>> to_run;
    auto start = [&](WriteOrder::Seq s) {
      const W& w = all.at(s);
      for (auto r : running) {
        const W& x = all.at(r);
        ASSERT_FALSE(x.off < w.end && w.off < x.end) << "seed " << seed << ": " << r << " and " << s;
      }
      for (const auto& [e, x] : all) {
        if (e >= s) break;
        if (x.off < w.end && w.off < x.end) {
          ASSERT_TRUE(finished.count(e)) << "seed " << seed << ": " << s << " overtook " << e;
        }
      }
      running.insert(s);
    };
    int admitted = 0;
    while (admitted < 2000 || !running.empty()) {
      if (admitted < 2000 && (running.empty() || rng() % 2)) {
        const uint64_t off = rng() % 64 * 512;
        const uint64_t len = 1 + rng() % 8192;
        WriteOrder::Seq s;
        // The entry must exist before start() looks it up.
        const WriteOrder::Seq next = o.last_seq() + 1;
        all[next] = W{off, off + len};
        if (o.Admit(off, len, start, &s)) start(s);
        ASSERT_EQ(s, next);
        ++admitted;
      } else {
        auto it = running.begin();
        std::advance(it, static_cast<long>(rng() % running.size()));
        const auto s = *it;
        running.erase(it);
        finished.insert(s);
        for (auto& fn : o.Finish(s)) fn();
      }
    }
    EXPECT_EQ(finished.size(), 2000u) << "seed " << seed;
    EXPECT_TRUE(o.empty());
  }
}

}  // namespace
}  // namespace mpnfs::fs
