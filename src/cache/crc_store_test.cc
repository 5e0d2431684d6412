#include "cache/crc_store.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <random>
#include <thread>
#include <vector>

#include "common/mutex.h"

namespace mpnfs::cache {
namespace {

// The kernel's disk, with reads and writes of the checksum file that can be
// made to fail or to wait.
class FlakyDisk : public Disk {
 public:
  std::atomic<bool> fail_reads{false}, fail_writes{false};
  std::atomic<int> reads{0}, writes{0};
  // While closed, reads (writes) of the file wait.
  std::atomic<bool> reads_closed{false}, writes_closed{false};

  Result<std::unique_ptr<File>> Open(const std::string& path, int flags) override {
    auto f = RealDisk().Open(path, flags);
    if (!f) return f.error();
    return std::unique_ptr<File>(new Wrapped(this, std::move(*f)));
  }
  bool Exists(const std::string& path) override { return RealDisk().Exists(path); }
  bool Rename(const std::string& a, const std::string& b) override { return RealDisk().Rename(a, b); }
  bool Remove(const std::string& path) override { return RealDisk().Remove(path); }
  bool SyncDir(const std::string& dir) override { return RealDisk().SyncDir(dir); }
  uint64_t Allocated(const std::string& path) override { return RealDisk().Allocated(path); }

 private:
  class Wrapped : public File {
   public:
    Wrapped(FlakyDisk* d, std::unique_ptr<File> f) : d_(d), f_(std::move(f)) {}
    bool ReadAt(char* p, size_t n, uint64_t off) override {
      d_->reads++;
      while (d_->reads_closed) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (d_->fail_reads) return errno = EIO, false;
      return f_->ReadAt(p, n, off);
    }
    bool WriteAt(const char* p, size_t n, uint64_t off) override {
      d_->writes++;
      while (d_->writes_closed) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (d_->fail_writes) return errno = EIO, false;
      return f_->WriteAt(p, n, off);
    }
    bool Sync() override { return f_->Sync(); }
    bool Truncate(uint64_t size) override { return f_->Truncate(size); }
    bool Allocate(uint64_t size) override { return f_->Allocate(size); }
    uint64_t Size() override { return f_->Size(); }

   private:
    FlakyDisk* d_;
    std::unique_ptr<File> f_;
  };
};

class CrcStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/mpnfs-crc-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // `slots` slots of 16 pages (64 bytes of CRCs), frames of one slot, and
  // RAM for `frames` of them.
  std::unique_ptr<CrcStore> Open(uint32_t slots, uint32_t frames) {
    CrcStore::Options o;
    o.slots = slots;
    o.pages = 16;
    o.frame = 64;
    o.ram = uint64_t{frames} * 64;
    auto s = CrcStore::Open(disk_, dir_, o);
    EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().what);
    return s.ok() ? std::move(*s) : nullptr;
  }
  // Sets slot's CRCs to a pattern of `v`.
  static CrcStore::Got Set(CrcStore& c, Mutex& mu, uint32_t slot, uint32_t v) REQUIRES(mu) {
    CrcStore::Holds h(c);
    auto got = c.Hold(mu, slot, h);
    if (got == CrcStore::Got::kFailed) return got;
    for (uint32_t p = 0; p < 16; ++p) c.Mut(slot)[p] = v * 100 + p;
    return got;
  }
  // Whether slot's CRCs are the pattern of `v`.
  static bool Is(CrcStore& c, Mutex& mu, uint32_t slot, uint32_t v) REQUIRES(mu) {
    CrcStore::Holds h(c);
    if (c.Hold(mu, slot, h) == CrcStore::Got::kFailed) return false;
    for (uint32_t p = 0; p < 16; ++p) {
      if (c.Get(slot)[p] != v * 100 + p) return false;
    }
    return true;
  }

  std::string dir_;
  FlakyDisk disk_;
  Mutex mu_;
};

TEST_F(CrcStoreTest, ATableThatFitsItsBudgetStaysInRamWithNoFile) {
  auto c = Open(8, 8);
  ASSERT_TRUE(c);
  EXPECT_FALSE(c->paged());
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/crcs"));
  MutexLock lock(mu_);
  for (uint32_t s = 0; s < 8; ++s) EXPECT_EQ(Set(*c, mu_, s, s + 1), CrcStore::Got::kHeld);
  for (uint32_t s = 0; s < 8; ++s) EXPECT_TRUE(Is(*c, mu_, s, s + 1));
  EXPECT_EQ(disk_.reads + disk_.writes, 0);
}

TEST_F(CrcStoreTest, ALargerTableLivesInItsFileWithOnlyTheBudgetInRam) {
  // A file left by an earlier, smaller cache's table is removed.
  {
    auto small = Open(64, 2);
    ASSERT_TRUE(small && small->paged());
  }
  ASSERT_TRUE(std::filesystem::exists(dir_ + "/crcs"));
  {
    auto fits = Open(4, 8);
    ASSERT_TRUE(fits && !fits->paged());
    EXPECT_FALSE(std::filesystem::exists(dir_ + "/crcs"));
  }
  auto c = Open(64, 4);
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->paged());
  EXPECT_EQ(std::filesystem::file_size(dir_ + "/crcs"), 64u * 64);
  MutexLock lock(mu_);
  for (uint32_t s = 0; s < 64; ++s) ASSERT_NE(Set(*c, mu_, s, s + 7), CrcStore::Got::kFailed);
  for (uint32_t s = 0; s < 64; ++s) EXPECT_TRUE(Is(*c, mu_, s, s + 7)) << s;
  auto n = c->counters();
  EXPECT_EQ(n.frames, 4u);
  EXPECT_EQ(n.ram_bytes, 4u * 64);
  EXPECT_GE(n.writes, 60u);  // every frame changed went out once at least
  EXPECT_GE(n.reads, 60u);   // and came back for the check
  EXPECT_EQ(disk_.reads, static_cast<int>(n.reads));
}

TEST_F(CrcStoreTest, AFrameNeverWrittenBackReadsAsZerosWithoutIo) {
  // (The file's old content, from an earlier mount, is never trusted.)
  {
    auto old = Open(16, 2);
    MutexLock lock(mu_);
    for (uint32_t s = 0; s < 16; ++s) Set(*old, mu_, s, 9);
    for (uint32_t s = 0; s < 16; ++s) EXPECT_TRUE(Is(*old, mu_, s, 9));
  }
  disk_.reads = 0;
  auto c = Open(16, 2);
  MutexLock lock(mu_);
  for (uint32_t s = 0; s < 16; ++s) {
    CrcStore::Holds h(*c);
    ASSERT_NE(c->Hold(mu_, s, h), CrcStore::Got::kFailed);
    for (uint32_t p = 0; p < 16; ++p) EXPECT_EQ(c->Get(s)[p], 0u);
  }
  EXPECT_EQ(disk_.reads, 0);
}

TEST_F(CrcStoreTest, HeldFramesStayAndMoreAreMadeRatherThanWaiting) {
  auto c = Open(16, 2);
  MutexLock lock(mu_);
  CrcStore::Holds h(*c);
  for (uint32_t s = 0; s < 6; ++s) {
    ASSERT_NE(c->Hold(mu_, s, h), CrcStore::Got::kFailed);
    for (uint32_t p = 0; p < 16; ++p) c->Mut(s)[p] = s;
  }
  for (uint32_t s = 0; s < 6; ++s) {
    ASSERT_TRUE(c->Resident(s));
    EXPECT_EQ(c->Get(s)[3], s);
  }
  EXPECT_EQ(c->counters().frames, 6u);  // beyond the budget of 2 while held
  h.Release();
  // Released: later loads evict them again, and the frame count stays.
  for (uint32_t s = 6; s < 16; ++s) ASSERT_NE(Set(*c, mu_, s, s), CrcStore::Got::kFailed);
  EXPECT_EQ(c->counters().frames, 6u);
  for (uint32_t s = 0; s < 6; ++s) {
    CrcStore::Holds k(*c);
    ASSERT_NE(c->Hold(mu_, s, k), CrcStore::Got::kFailed);
    EXPECT_EQ(c->Get(s)[3], s);
  }
}

TEST_F(CrcStoreTest, AFailedWriteBackKeepsTheFrameAndItsChecksumsAndFailsNoOneElse) {
  auto c = Open(16, 2);
  MutexLock lock(mu_);
  ASSERT_NE(Set(*c, mu_, 0, 1), CrcStore::Got::kFailed);
  ASSERT_NE(Set(*c, mu_, 1, 2), CrcStore::Got::kFailed);
  disk_.fail_writes = true;
  // Both frames are changed: making room for a third tries to write them
  // back; that fails, and the third gets a frame of its own instead.
  {
    CrcStore::Holds h(*c);
    EXPECT_NE(c->Hold(mu_, 2, h), CrcStore::Got::kFailed);
    for (uint32_t p = 0; p < 16; ++p) c->Mut(2)[p] = 300 + p;
  }
  EXPECT_GE(c->counters().write_errors, 1u);
  EXPECT_GE(disk_.writes, 1);
  EXPECT_TRUE(c->Resident(0) && c->Resident(1));
  EXPECT_EQ(c->counters().frames, 3u);
  disk_.fail_writes = false;
  EXPECT_TRUE(Is(*c, mu_, 2, 3));
  EXPECT_TRUE(Is(*c, mu_, 0, 1));
  EXPECT_TRUE(Is(*c, mu_, 1, 2));
  for (uint32_t s = 2; s < 16; ++s) ASSERT_NE(Set(*c, mu_, s, 3), CrcStore::Got::kFailed);
  EXPECT_TRUE(Is(*c, mu_, 0, 1));
  EXPECT_TRUE(Is(*c, mu_, 1, 2));
}

TEST_F(CrcStoreTest, AFailedReadBackIsReportedAndLeavesNothingLoaded) {
  auto c = Open(16, 2);
  MutexLock lock(mu_);
  for (uint32_t s = 0; s < 16; ++s) ASSERT_NE(Set(*c, mu_, s, 4), CrcStore::Got::kFailed);
  disk_.fail_reads = true;
  CrcStore::Holds h(*c);
  errno = 0;
  EXPECT_EQ(c->Hold(mu_, 0, h), CrcStore::Got::kFailed);
  EXPECT_EQ(errno, EIO);
  EXPECT_FALSE(c->Resident(0));
  disk_.fail_reads = false;
  EXPECT_TRUE(Is(*c, mu_, 0, 4));
}

// Takes mu within 10 s or says it could not (the lock is held across I/O).
bool LockFree(Mutex& mu) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!mu.TryLock()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  mu.Unlock();
  return true;
}

void WaitFor(const std::atomic<int>& n, int want) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (n < want && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

TEST_F(CrcStoreTest, ThreadsWantingOneFrameReadItOnceAndWaitWithTheLockReleased) {
  auto c = Open(16, 2);
  {
    MutexLock lock(mu_);
    for (uint32_t s = 0; s < 16; ++s) ASSERT_NE(Set(*c, mu_, s, 5), CrcStore::Got::kFailed);
  }
  ASSERT_FALSE(c->Resident(0));
  disk_.reads = 0;
  disk_.reads_closed = true;
  std::atomic<int> good{0};
  std::vector<std::thread> ts;
  for (int i = 0; i < 3; ++i) {
    ts.emplace_back([&] {
      MutexLock lock(mu_);
      CrcStore::Holds h(*c);
      // (kRelocked for those that came during the read; a thread that came
      // after it finds the frame in RAM: kHeld.)
      if (c->Hold(mu_, 0, h) != CrcStore::Got::kFailed && c->Get(0)[1] == 501) good++;
    });
  }
  WaitFor(disk_.reads, 1);
  ASSERT_EQ(disk_.reads, 1);
  // The read is under way: the lock is free meanwhile (the other threads
  // wait for that read, not for the lock).
  EXPECT_TRUE(LockFree(mu_));
  disk_.reads_closed = false;
  for (auto& t : ts) t.join();
  EXPECT_EQ(good, 3);
  EXPECT_EQ(disk_.reads, 1);
}

// A frame changed while it is being written back (with the lock released)
// keeps the change: it is not evicted, and later evictions write it again.
TEST_F(CrcStoreTest, AChangeDuringAWriteBackIsNotLost) {
  auto c = Open(16, 2);
  MutexLock lock(mu_);
  ASSERT_NE(Set(*c, mu_, 0, 1), CrcStore::Got::kFailed);
  ASSERT_NE(Set(*c, mu_, 1, 2), CrcStore::Got::kFailed);
  disk_.writes = 0;
  disk_.writes_closed = true;
  lock.Unlock();
  std::thread t([&] {
    MutexLock l(mu_);
    CrcStore::Holds h(*c);
    EXPECT_NE(c->Hold(mu_, 2, h), CrcStore::Got::kFailed);  // evicts 0 or 1: a write-back
  });
  WaitFor(disk_.writes, 1);
  ASSERT_EQ(disk_.writes, 1);
  lock.Lock();
  // Both frames still resident (one of them being written), usable, changeable.
  ASSERT_TRUE(c->Resident(0) && c->Resident(1));
  EXPECT_EQ(Set(*c, mu_, 0, 8), CrcStore::Got::kHeld);
  EXPECT_EQ(Set(*c, mu_, 1, 9), CrcStore::Got::kHeld);
  lock.Unlock();
  disk_.writes_closed = false;
  t.join();
  lock.Lock();
  for (uint32_t s = 2; s < 16; ++s) ASSERT_NE(Set(*c, mu_, s, 3), CrcStore::Got::kFailed);
  EXPECT_FALSE(c->Resident(0) && c->Resident(1));
  EXPECT_TRUE(Is(*c, mu_, 0, 8));
  EXPECT_TRUE(Is(*c, mu_, 1, 9));
}

// Random changes and checks over a table 8 times its budget, against a
// copy in plain memory (fixed seeds), with frames held across other loads.
TEST_F(CrcStoreTest, RandomChangesReadBackAsWritten) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    auto c = Open(64, 8);
    ASSERT_TRUE(c && c->paged());
    std::vector<uint32_t> model(64 * 16, 0);
    std::mt19937 rng(seed);
    MutexLock lock(mu_);
    for (int i = 0; i < 5000; ++i) {
      CrcStore::Holds h(*c);
      const int n = 1 + static_cast<int>(rng() % 4);
      std::vector<uint32_t> got;
      for (int k = 0; k < n; ++k) {
        const uint32_t s = rng() % 64;
        ASSERT_NE(c->Hold(mu_, s, h), CrcStore::Got::kFailed);
        got.push_back(s);
      }
      for (uint32_t s : got) {
        ASSERT_TRUE(c->Resident(s));
        for (uint32_t p = 0; p < 16; ++p) ASSERT_EQ(c->Get(s)[p], model[s * 16 + p]) << "seed " << seed << " op " << i;
        if (rng() % 2) {
          const uint32_t p = rng() % 16, v = static_cast<uint32_t>(rng());
          c->Mut(s)[p] = v;
          model[s * 16 + p] = v;
        }
      }
    }
    EXPECT_LE(c->counters().frames, 8u + 4u);
  }
}

}  // namespace
}  // namespace mpnfs::cache
