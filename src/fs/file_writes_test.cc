#include "fs/file_writes.h"

#include <gtest/gtest.h>

#include <cstring>

namespace mpnfs::fs {
namespace {

class FileWritesTest : public ::testing::Test {
 protected:
  // Admits a write and answers it UNSTABLE with `verf`.
  FileWrites::BufferedP Kept(uint64_t off, size_t len, uint64_t verf) {
    MutexLock lock(w_.mu);
    WriteOrder::Seq seq = 0;
    EXPECT_TRUE(w_.Admit(off, len, [](WriteOrder::Seq) {}, &seq));
    auto buf = std::make_shared<nfs::Bytes>(len);
    auto b = std::make_shared<Buffered>(Buffered{off, buf, 0, len, verf, seq, {}});
    w_.Keep(b);
    EXPECT_TRUE(w_.Finish(seq).empty());
    return b;
  }
  // The pieces of every lost write, each asked in turn (oldest first).
  std::vector<std::pair<uint64_t, uint64_t>> Pieces(const std::vector<FileWrites::BufferedP>& kept,
                                                    uint64_t verf) {
    MutexLock lock(w_.mu);
    std::vector<std::pair<uint64_t, uint64_t>> out;
    for (const auto& b : FileWrites::Lost(kept, nfs::CommitReply{verf, {}})) {
      for (const auto& p : w_.ResendPieces(kept, b)) out.emplace_back(p.off, p.len);
    }
    return out;
  }
  std::vector<FileWrites::BufferedP> Begin() {
    MutexLock lock(w_.mu);
    std::vector<FileWrites::BufferedP> kept;
    std::function<void(Result<Ok>)> cb = [](Result<Ok>) {};
    EXPECT_EQ(w_.BeginCommit(&cb, &kept), FileWrites::Begin::kStarted);
    return kept;
  }
  FileWrites w_;
};

using P = std::vector<std::pair<uint64_t, uint64_t>>;

TEST_F(FileWritesTest, OnlyWritesWithAnotherVerifierAreLost) {
  auto a = Kept(0, 100, 7);
  auto b = Kept(100, 100, 8);
  const auto lost = FileWrites::Lost({a, b}, nfs::CommitReply{8, {}});
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0], a);
}

TEST_F(FileWritesTest, AResendLeavesOutWhatNewerKeptDataOwns) {
  Kept(0, 100, 1);
  Kept(50, 10, 1);  // newer, over the middle
  auto kept = Begin();
  EXPECT_EQ(Pieces(kept, 2), (P{{0, 50}, {60, 40}, {50, 10}}));
}

TEST_F(FileWritesTest, AResendLeavesOutDataKeptSinceTheRoundBeganButNotWritesStillOut) {
  Kept(0, 100, 1);
  auto kept = Begin();
  Kept(10, 10, 1);  // answered after the round began
  {
    MutexLock lock(w_.mu);
    WriteOrder::Seq s = 0;  // still out: may yet fail (then its bytes are the resend's)
    ASSERT_TRUE(w_.Admit(80, 10, [](WriteOrder::Seq) {}, &s));
  }
  EXPECT_EQ(Pieces(kept, 2), (P{{0, 10}, {20, 80}}));
}

TEST_F(FileWritesTest, AResendLeavesOutWhatALaterTruncateCutAndLaterDurableOrForeignWrites) {
  Kept(0, 100, 1);
  {
    MutexLock lock(w_.mu);
    WriteOrder::Seq t = 0;
    ASSERT_TRUE(w_.AdmitTail(70, [](WriteOrder::Seq) {}, &t));
    w_.Truncated(t, 70);
    EXPECT_TRUE(w_.Finish(t).empty());
    WriteOrder::Seq s = 0;
    ASSERT_TRUE(w_.Admit(0, 10, [](WriteOrder::Seq) {}, &s));
    w_.Durable(s, 0, 10);  // answered FILE_SYNC
    EXPECT_TRUE(w_.Finish(s).empty());
    EXPECT_TRUE(w_.Foreign(30, 5));  // the flusher's
  }
  auto kept = Begin();
  EXPECT_EQ(Pieces(kept, 2), (P{{10, 20}, {35, 35}}));
}

TEST_F(FileWritesTest, TheResendLogsGoOnceNothingCanBeResent) {
  {
    MutexLock lock(w_.mu);
    EXPECT_TRUE(w_.Foreign(0, 10));  // nothing kept: no resend can happen, nothing to log
    EXPECT_TRUE(w_.ResendLogsEmpty());
  }
  Kept(0, 10, 1);
  {
    MutexLock lock(w_.mu);
    EXPECT_TRUE(w_.Foreign(0, 10));
    EXPECT_FALSE(w_.ResendLogsEmpty());
  }
  auto kept = Begin();
  MutexLock lock(w_.mu);
  EXPECT_TRUE(w_.EndCommit().empty());
  EXPECT_TRUE(w_.ResendLogsEmpty());
}

TEST_F(FileWritesTest, AForeignWriteWaitsForAnOverlappingWriteButNotForATruncate) {
  MutexLock lock(w_.mu);
  WriteOrder::Seq s = 0, t = 0;
  ASSERT_TRUE(w_.Admit(100, 50, [](WriteOrder::Seq) {}, &s));  // out (a resend, say)
  EXPECT_FALSE(w_.Foreign(120, 10));
  EXPECT_FALSE(w_.Foreign(0, 101));
  EXPECT_TRUE(w_.Foreign(150, 10));  // adjacent: no overlap
  EXPECT_TRUE(w_.Finish(s).empty());
  ASSERT_TRUE(w_.AdmitTail(0, [](WriteOrder::Seq) {}, &t));  // a truncate waiting for the flush
  EXPECT_TRUE(w_.Foreign(120, 10));
  EXPECT_TRUE(w_.Finish(t).empty());
}

TEST_F(FileWritesTest, OneRoundAtATimeAndAFailedRoundKeepsItsWritesFirst) {
  auto a = Kept(0, 10, 1);
  auto kept = Begin();
  auto b = Kept(10, 10, 1);
  MutexLock lock(w_.mu);
  bool called = false;
  std::function<void(Result<Ok>)> cb = [&](Result<Ok>) { called = true; };
  std::vector<FileWrites::BufferedP> none;
  EXPECT_EQ(w_.BeginCommit(&cb, &none), FileWrites::Begin::kQueued);
  w_.CommitFailed(kept);
  auto waiters = w_.EndCommit();
  ASSERT_EQ(waiters.size(), 1u);
  waiters[0](Ok{});
  EXPECT_TRUE(called);
  std::vector<FileWrites::BufferedP> again;
  std::function<void(Result<Ok>)> cb2 = [](Result<Ok>) {};
  ASSERT_EQ(w_.BeginCommit(&cb2, &again), FileWrites::Begin::kStarted);
  EXPECT_EQ(again, (std::vector<FileWrites::BufferedP>{a, b}));
  EXPECT_TRUE(w_.EndCommit().empty());
  std::vector<FileWrites::BufferedP> empty;
  EXPECT_EQ(w_.BeginCommit(&cb2, &empty), FileWrites::Begin::kNothingKept);
  EXPECT_TRUE(cb2 != nullptr);  // handed back
}

TEST_F(FileWritesTest, TheWindowParksInOrderAndDrainWaitersRunWhenNothingIsPending) {
  MutexLock lock(w_.mu);
  std::vector<int> order;
  EXPECT_FALSE(w_.MustPark(100, 150));  // an empty window takes any write
  w_.Behind(100);
  w_.WriteStarted();
  EXPECT_TRUE(w_.MustPark(100, 150));
  w_.Park(100, [&](FileWrites::Run* run) { order.push_back(1); run->push_back([&] { order.push_back(11); }); });
  EXPECT_TRUE(w_.MustPark(10, 150));  // behind a parked write, even if it fits
  w_.Park(10, [&](FileWrites::Run*) { order.push_back(2); });
  std::function<void()> drained = [&] { order.push_back(3); };
  EXPECT_TRUE(w_.WhenDrained(drained));
  FileWrites::Run run;
  w_.WriteEnded(1, 100, 150, &run);  // both parked fit now (110)
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  ASSERT_EQ(run.size(), 1u);  // the drain waiter waits for them
  w_.WriteStarted();
  w_.WriteStarted();
  FileWrites::Run run2;
  w_.WriteEnded(2, 100, 150, &run2);
  EXPECT_TRUE(run2.empty());
  w_.WriteEnded(3, 10, 150, &run2);
  ASSERT_EQ(run2.size(), 1u);
  run2[0]();
  EXPECT_EQ(order.back(), 3);
  std::function<void()> now = [] {};
  EXPECT_FALSE(w_.WhenDrained(now));
}

TEST_F(FileWritesTest, EachOpenLearnsEachErrorOnceAndAnOpenAfterItNever) {
  MutexLock lock(w_.mu);
  uint64_t a = w_.err_seq();
  w_.RecordError(Error::Errno(EIO, "lost"));
  EXPECT_TRUE(w_.Refused());
  uint64_t b = w_.err_seq();  // opened after the error
  EXPECT_FALSE(w_.TakeError(&b).has_value());
  auto e = w_.TakeError(&a);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->err, EIO);
  EXPECT_FALSE(w_.TakeError(&a).has_value());
  EXPECT_TRUE(w_.DoubtedSinceOpen());
  EXPECT_FALSE(w_.DoubtedSinceOpen());
  w_.Doubt();
  EXPECT_TRUE(w_.DoubtedSinceOpen());
}

TEST_F(FileWritesTest, TheSizeMarkGoesOnlyWithAGetattrSentAfterEveryWriteAndNothingKept) {
  Kept(0, 10, 1);
  MutexLock lock(w_.mu);
  w_.Wrote(4096);
  w_.WriteStarted();
  w_.Settled(5);  // a write is out
  EXPECT_EQ(w_.size_hwm(), 4096u);
  FileWrites::Run run;
  w_.WriteEnded(6, 0, 0, &run);
  w_.Settled(5);  // sent before the write ended
  EXPECT_EQ(w_.size_hwm(), 4096u);
  w_.Settled(7);  // data kept may still be resent
  EXPECT_EQ(w_.size_hwm(), 4096u);
  std::vector<FileWrites::BufferedP> kept;
  std::function<void(Result<Ok>)> cb = [](Result<Ok>) {};
  ASSERT_EQ(w_.BeginCommit(&cb, &kept), FileWrites::Begin::kStarted);
  EXPECT_TRUE(w_.EndCommit().empty());
  w_.Settled(7);
  EXPECT_EQ(w_.size_hwm(), 0u);
}

}  // namespace
}  // namespace mpnfs::fs
