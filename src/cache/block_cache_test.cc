#include "cache/block_cache.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <map>
#include <random>
#include <thread>

namespace mpnfs::cache {
namespace {

constexpr uint32_t kBlock = 64 << 10;
const FileVersion kV1{1 << 20, 100, 100};
const FileVersion kV2{1 << 20, 200, 200};
const FileVersion kV3{1 << 20, 300, 300};

std::string Pattern(size_t n, char seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + i * 7 + i / 4096);
  return s;
}

class BlockCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/mpnfs-cache-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<BlockCache> Open(CacheMode mode = CacheMode::kWriteThrough, uint64_t size = 1 << 20,
                                   bool admit_second = false, Disk* disk = nullptr) {
    CacheOptions o;
    o.disk = disk;
    o.dir = dir_;
    o.size = size;
    o.block = kBlock;
    o.mode = mode;
    o.seq_cutoff = 4 << 20;
    o.admit_second = admit_second;
    o.commit_interval = commit_interval_;
    if (paged_ || getenv("MPNFS_TEST_CRC_PAGED")) {
      // One slot's checksums per frame, RAM for two (the table pages).
      o.crc_frame = kBlock / 4096 * 4;
      o.crc_ram = 2 * o.crc_frame;
      // (Small index groups: a record write holds few frames, and frames
      // are never given back, so big groups would keep most of them in RAM.)
      o.index_per_page = index_per_page_ != 0 ? index_per_page_ : 2;
    }
    auto c = BlockCache::Open(o);
    EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.error().what);
    return c.ok() ? std::move(c.value()) : nullptr;
  }
  // Reads `data` in from the "server" at `off` the way the filesystem does.
  static void FillFromServer(BlockCache& c, const std::string& fh, uint64_t off, const std::string& data) {
    uint64_t token = c.ReadStart(fh);
    c.Fill(fh, token, off, data.data(), data.size());
    c.Quiesce();
  }
  // A write of `data` at `off` that the server answers with WCC before/after.
  static void Write(BlockCache& c, const std::string& fh, uint64_t off, const std::string& data,
                    const std::optional<FileVersion>& before, const std::optional<FileVersion>& after) {
    uint64_t t = c.WriteStart(fh, off, data.size());
    c.WriteDone(fh, t, off, data.data(), data.size(), true, true, before, after);
    c.Quiesce();
  }
  // A writethrough cache holding block 1 of "fh1" (validated at kV1).
  std::unique_ptr<BlockCache> WithCachedBlock(char seed) {
    auto c = Open(CacheMode::kWriteThrough);
    c->Observe("fh1", kV1);
    FillFromServer(*c, "fh1", kBlock, Pattern(kBlock, seed));
    return c;
  }
  // Block 0 of "fh1" filled from the server ('e'), a byte of its third page
  // flipped on disk, and the cache opened again in `mode` (null on failure).
  std::unique_ptr<BlockCache> ReopenWithFilledPage2Damaged(CacheMode mode) {
    {
      auto c = Open(mode);
      c->Observe("fh1", kV1);
      FillFromServer(*c, "fh1", 0, Pattern(kBlock, 'e'));
    }
    if (!FlipOnDisk(2 * 4096 + 17, 0x40)) return nullptr;
    auto c = Open(mode);
    c->Observe("fh1", kV1);
    return c;
  }
  // Flips bits of the byte at `off` of the cache's data file (damage).
  bool FlipOnDisk(uint64_t off, char bits = 0x40) {
    const int fd = open((dir_ + "/data").c_str(), O_RDWR);
    char byte = 0;
    const bool flipped = fd >= 0 && pread(fd, &byte, 1, off) == 1 && (byte ^= bits, pwrite(fd, &byte, 1, off) == 1);
    if (fd >= 0) close(fd);
    return flipped;
  }
  std::string dir_;
  std::chrono::milliseconds commit_interval_{1000};
  bool paged_ = false;  // page checksums mostly out of RAM (crc_store.h)
  uint32_t index_per_page_ = 0;  // (when paged_)
};

TEST_F(BlockCacheTest, AFilledRangeIsServedFromTheCache) {
  auto c = Open();
  c->Observe("fh1", kV1);
  EXPECT_FALSE(c->Read("fh1", 0, 8192).has_value());
  const std::string data = Pattern(3 * kBlock, 'a');
  FillFromServer(*c, "fh1", 0, data);
  auto got = c->Read("fh1", 4096 + 10, 100000);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, data.substr(4096 + 10, 100000));
  auto st = c->Stats();
  EXPECT_EQ(st.read_hits, 1u);
  EXPECT_EQ(st.read_misses, 1u);
  EXPECT_EQ(st.used_bytes, 3u * kBlock);
  EXPECT_EQ(st.slots_used, 3u);
}

TEST_F(BlockCacheTest, OnlyWholePagesAreStoredAndPartialRangesMiss) {
  auto c = Open();
  c->Observe("fh1", kV1);
  FillFromServer(*c, "fh1", 1000, Pattern(10000, 'b'));  // whole pages: 4096..8191 only
  EXPECT_TRUE(c->Read("fh1", 4096, 4096).has_value());
  EXPECT_FALSE(c->Read("fh1", 0, 4096).has_value());
  EXPECT_FALSE(c->Read("fh1", 8192, 100).has_value());
}

TEST_F(BlockCacheTest, NothingIsServedBeforeTheFileWasObserved) {
  auto c = Open();
  FillFromServer(*c, "fh1", 0, Pattern(kBlock, 'c'));
  EXPECT_FALSE(c->Read("fh1", 0, 4096).has_value());
}

TEST_F(BlockCacheTest, TheCacheIsWarmAfterReopeningAndChecksTheVersion) {
  const std::string data = Pattern(2 * kBlock, 'd');
  {
    auto c = Open();
    c->Observe("fh1", kV1);
    c->Observe("fh2", kV1);
    FillFromServer(*c, "fh1", 0, data);
    FillFromServer(*c, "fh2", 0, data);
  }
  auto c = Open();
  EXPECT_EQ(c->Stats().slots_used, 4u);
  c->Observe("fh1", kV1);
  auto got = c->Read("fh1", 0, 2 * kBlock);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, data);
  c->Observe("fh2", kV2);  // changed on the server while unmounted
  EXPECT_FALSE(c->Read("fh2", 0, 4096).has_value());
  EXPECT_EQ(c->Stats().slots_used, 2u);
}

TEST_F(BlockCacheTest, ADamagedPageIsDetectedDroppedAndNotServed) {
  auto c = ReopenWithFilledPage2Damaged(CacheMode::kWriteThrough);
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(c->Read("fh1", 0, 8192).has_value());      // pages 0-1 are fine
  EXPECT_FALSE(c->Read("fh1", 8192, 4096).has_value());  // page 2 is not
  EXPECT_EQ(c->Stats().checksum_failures, 1u);
  EXPECT_FALSE(c->Read("fh1", 8192, 4096).has_value());  // dropped: a plain miss now
  EXPECT_EQ(c->Stats().checksum_failures, 1u);
  EXPECT_TRUE(c->Read("fh1", 12288, 4096).has_value());
}

TEST_F(BlockCacheTest, AWriteInvalidatesAndWritethroughStoresTheNewData) {
  auto c = Open(CacheMode::kWriteThrough);
  c->Observe("fh1", kV1);
  FillFromServer(*c, "fh1", 0, Pattern(kBlock, 'f'));
  const std::string fresh = Pattern(8192, 'F');
  uint64_t t = c->WriteStart("fh1", 4096, fresh.size());
  EXPECT_FALSE(c->Read("fh1", 4096, 4096).has_value());  // invalid while in flight
  EXPECT_TRUE(c->Read("fh1", 0, 4096).has_value());      // the rest is still there
  c->WriteDone("fh1", t, 4096, fresh.data(), fresh.size(), true, true, kV1, kV2);
  c->Quiesce();
  auto got = c->Read("fh1", 4096, 8192);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, fresh);
  EXPECT_EQ(c->Stats().write_hits, 1u);
  c->Observe("fh1", kV2);  // our own write's version: nothing dropped
  EXPECT_TRUE(c->Read("fh1", 0, 4096).has_value());
}

TEST_F(BlockCacheTest, ReadonlyModeOnlyInvalidatesOnWrite) {
  auto c = Open(CacheMode::kReadOnly);
  c->Observe("fh1", kV1);
  FillFromServer(*c, "fh1", 0, Pattern(kBlock, 'g'));
  Write(*c, "fh1", 0, Pattern(4096, 'G'), kV1, kV2);
  EXPECT_FALSE(c->Read("fh1", 0, 4096).has_value());
  EXPECT_TRUE(c->Read("fh1", 4096, 4096).has_value());
}

TEST_F(BlockCacheTest, AReadOlderThanAWriteNeverOverwritesItsData) {
  auto c = Open(CacheMode::kWriteThrough);
  c->Observe("fh1", kV1);
  const uint64_t token = c->ReadStart("fh1");  // a read leaves for the server...
  const std::string fresh = Pattern(4096, 'H');
  uint64_t t = c->WriteStart("fh1", 0, 4096);  // ...a write overtakes it
  c->WriteDone("fh1", t, 0, fresh.data(), fresh.size(), true, true, kV1, kV2);
  const std::string old = Pattern(4096, 'h');
  c->Fill("fh1", token, 0, old.data(), old.size());  // the old data arrives late
  c->Quiesce();
  auto got = c->Read("fh1", 0, 4096);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, fresh);
}

TEST_F(BlockCacheTest, OverlappingWritesStoreNeitherUntilTheyAreOrdered) {
  auto c = Open(CacheMode::kWriteThrough);
  c->Observe("fh1", kV1);
  const std::string a = Pattern(4096, 'a'), b = Pattern(4096, 'b');
  uint64_t ta = c->WriteStart("fh1", 0, 4096);
  uint64_t tb = c->WriteStart("fh1", 0, 4096);
  c->WriteDone("fh1", tb, 0, b.data(), b.size(), true, true, kV1, kV2);
  c->WriteDone("fh1", ta, 0, a.data(), a.size(), true, true, kV2, kV3);
  c->Quiesce();
  EXPECT_FALSE(c->Read("fh1", 0, 4096).has_value());
}

TEST_F(BlockCacheTest, AnotherClientsChangeDropsTheFile) {
  auto c = Open();
  c->Observe("fh1", kV1);
  FillFromServer(*c, "fh1", 0, Pattern(kBlock, 'i'));
  c->Observe("fh1", kV2);
  EXPECT_FALSE(c->Read("fh1", 0, 4096).has_value());
  EXPECT_EQ(c->Stats().files_dropped, 1u);
}

TEST_F(BlockCacheTest, ALateReplyWithAnOlderVersionDropsNothing) {
  auto c = WithCachedBlock('o');
  Write(*c, "fh1", 0, Pattern(4096, 'O'), kV1, kV2);
  c->Observe("fh1", kV1);  // a READ answered before our write, arriving after it
  EXPECT_TRUE(c->Read("fh1", kBlock, 4096).has_value());
  EXPECT_EQ(c->Stats().files_dropped, 0u);
  c->Observe("fh1", kV3);  // newer than ours: another client
  EXPECT_FALSE(c->Read("fh1", kBlock, 4096).has_value());
}

TEST_F(BlockCacheTest, AForeignChangeBetweenOurWritesDropsTheFile) {
  auto c = WithCachedBlock('j');
  // Pre-op version kV2 is neither the validated one nor one of ours.
  Write(*c, "fh1", 0, Pattern(4096, 'J'), kV2, kV3);
  EXPECT_FALSE(c->Read("fh1", kBlock, 4096).has_value());
  EXPECT_EQ(c->Stats().files_dropped, 1u);
}

TEST_F(BlockCacheTest, ConcurrentOwnWritesWithUnseenIntermediateVersionsKeepTheFile) {
  auto c = WithCachedBlock('n');
  const std::string d = Pattern(4096, 'N');
  uint64_t a = c->WriteStart("fh1", 0, 4096);
  uint64_t b = c->WriteStart("fh1", 8192, 4096);
  // The server reports A's post-op after B ran too: B's pre-op (kV2) is never seen.
  c->WriteDone("fh1", a, 0, d.data(), d.size(), true, true, kV1, kV3);
  c->WriteDone("fh1", b, 8192, d.data(), d.size(), true, true, kV2, kV3);
  c->Quiesce();
  EXPECT_TRUE(c->Read("fh1", kBlock, 4096).has_value());
  EXPECT_EQ(c->Stats().files_dropped, 0u);
  c->Observe("fh1", kV3);
  EXPECT_TRUE(c->Read("fh1", kBlock, 4096).has_value());
}

TEST_F(BlockCacheTest, WritesWithoutPostOpAttributesDropTheFile) {
  auto c = WithCachedBlock('k');
  Write(*c, "fh1", 0, Pattern(4096, 'K'), std::nullopt, std::nullopt);
  EXPECT_FALSE(c->Read("fh1", kBlock, 4096).has_value());
}

TEST_F(BlockCacheTest, WritesWithoutPreOpAttributesAreTakenAsOurs) {
  auto c = WithCachedBlock('q');
  Write(*c, "fh1", 0, Pattern(4096, 'Q'), std::nullopt, kV2);
  EXPECT_TRUE(c->Read("fh1", kBlock, 4096).has_value());
  c->Observe("fh1", kV2);
  EXPECT_TRUE(c->Read("fh1", 0, 4096).has_value());
}

TEST_F(BlockCacheTest, SequentialRunsPastTheCutoffAreReported) {
  auto c = Open();
  bool seq = false;
  for (uint64_t off = 0; off < (8u << 20) && !seq; off += 1 << 20) seq = c->Sequential("fh1", off, 1 << 20, false);
  EXPECT_TRUE(seq);
  EXPECT_FALSE(c->Sequential("fh1", 123 << 20, 4096, false));  // a jump starts a new run
  EXPECT_FALSE(c->Sequential("fh2", 0, 1 << 20, false));
  // Slightly out of order (readahead) still continues the run.
  bool reordered = false;
  for (uint64_t off = 0; off < (8u << 20) && !reordered; off += 2 << 20) {
    reordered = c->Sequential("fh3", off + (1 << 20), 1 << 20, false) || c->Sequential("fh3", off, 1 << 20, false);
  }
  EXPECT_TRUE(reordered);
  // Random 8 KiB accesses over 1 GiB never make a run.
  std::mt19937_64 rnd(1);
  bool random_seq = false;
  for (int i = 0; i < 100000; ++i) random_seq |= c->Sequential("fh4", (rnd() % (1ull << 30)) & ~8191ull, 8192, false);
  EXPECT_FALSE(random_seq);
  // Nor do random accesses in a small file, however many: each is within
  // the slack of the run's end, but one behind the end lengthens nothing.
  for (int i = 0; i < 100000 && !random_seq; ++i) random_seq = c->Sequential("fh5", (rnd() % (256 << 10)) & ~4095ull, 4096, false);
  EXPECT_FALSE(random_seq);
  // Rewriting the same page (a log's last page) is no stream either.
  bool rewrite_seq = false;
  for (int i = 0; i < 10000 && !rewrite_seq; ++i) rewrite_seq = c->Sequential("fh6", 8192, 8192, false);
  EXPECT_FALSE(rewrite_seq);
}

// A request of a stream that arrives further behind than the slack (many
// FUSE threads on a slow machine) starts a run of its own: it must not
// restart the stream's run, or the next request in order restarts it again
// and another seq_cutoff of the stream is cached.
TEST_F(BlockCacheTest, AStragglerDoesNotRestartTheStreamsRun) {
  auto c = Open();
  constexpr uint64_t kReq = 128 << 10;  // slack 512 KiB
  uint64_t off = 0;
  while (!c->Sequential("fh", off, kReq, false)) off += kReq;
  off += kReq;
  EXPECT_LT(off, uint64_t{8} << 20);
  // 2 MiB behind the stream's end: a run of its own, not sequential.
  EXPECT_FALSE(c->Sequential("fh", off - (2 << 20), kReq, false));
  // The stream goes on bypassing from its very next request.
  for (int i = 0; i < 16; ++i, off += kReq) EXPECT_TRUE(c->Sequential("fh", off, kReq, false)) << off;
  // Bursts of up to 6 stragglers at random distances behind, among
  // in-order requests.
  std::mt19937_64 rnd(7);
  for (int i = 0; i < 400; ++i, off += kReq) {
    if (rnd() % 4 == 0) {
      for (int k = 1 + static_cast<int>(rnd() % 6); k > 0; --k) {
        (void)c->Sequential("fh", off - kReq * (5 + rnd() % 40), kReq, false);
      }
    }
    EXPECT_TRUE(c->Sequential("fh", off, kReq, false)) << off;
  }
}

// Reads and writes are separate streams. A file written in order and read
// back: the writing's run, the file's longest and recently continued, is
// kept from replacement; were it in the reads' table, the reading's run would
// be replaced by the first of its requests that arrives further behind than
// the slack (one its own jump ahead skipped), and another seq_cutoff of the
// reading would be cached. The order of the reads is one a 32 MiB write and
// read through FUSE produced.
TEST_F(BlockCacheTest, AFileWrittenThenReadBackIsTwoStreams) {
  auto c = Open();  // seq_cutoff 4 MiB
  constexpr uint64_t kMiB = 1 << 20;
  uint64_t cached = 0;
  for (uint64_t m = 0; m < 32; ++m) cached += c->Sequential("fh", m * kMiB, kMiB, /*write=*/true) ? 0 : kMiB;
  EXPECT_EQ(cached, 4 * kMiB);  // past the cutoff from the fifth request
  cached = 0;
  for (uint64_t m : {1, 2, 3, 0, 8, 4, 5, 6, 7, 9, 11, 10, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 23, 24,
                     22, 25, 26, 27, 28, 29, 30, 31}) {
    if (!c->Sequential("fh", m * kMiB, kMiB, /*write=*/false)) cached += kMiB;
  }
  // The run reaches the cutoff with 1..3, 0 and 8; 4, more than the slack
  // behind, starts a run of its own; 5 fills the first run's hole past it.
  EXPECT_EQ(cached, 6 * kMiB);
  // A write after the reads still continues the writing's run.
  EXPECT_TRUE(c->Sequential("fh", 32 * kMiB, kMiB, /*write=*/true));
}

// The requests a jump ahead of a stream past the cutoff skipped are the
// stream's, however far behind its end they arrive. The order is another
// one a 32 MiB read through FUSE produced: 9 jumps 4 MiB (the slack) ahead of
// 5, and 5 arrives after 10 and 11, 5 MiB behind the end.
TEST_F(BlockCacheTest, RequestsAStreamsJumpSkippedBypassWithIt) {
  auto c = Open();  // seq_cutoff 4 MiB
  constexpr uint64_t kMiB = 1 << 20;
  uint64_t cached = 0;
  for (uint64_t m : {0, 2, 1, 3, 4, 9, 5, 10, 11, 6, 7, 8, 12, 13, 14, 15, 16, 17, 18, 19, 20, 22, 23, 24,
                     21, 25, 26, 27, 28, 29, 30, 31}) {
    if (!c->Sequential("fh", m * kMiB, kMiB, /*write=*/false)) cached += kMiB;
  }
  EXPECT_EQ(cached, 4 * kMiB);  // 0..3; past the cutoff from 4 on
}

// More runs mean more chances for a random request to land near one: large
// random requests must stay mostly "not a stream".
TEST_F(BlockCacheTest, LargeRandomRequestsAreRarelyAStream) {
  auto c = Open();
  struct Case {
    uint64_t req, file;
    int max_percent;
  };
  for (const Case& k : {Case{512 << 10, 16 << 20, 12}, Case{512 << 10, 64 << 20, 2},
                        Case{1 << 20, 64 << 20, 15}, Case{1 << 20, 256 << 20, 2}}) {
    std::mt19937_64 rnd(1);
    int seq = 0;
    constexpr int kN = 20000;
    const std::string fh = "fh" + std::to_string(k.req) + "/" + std::to_string(k.file);
    for (int i = 0; i < kN; ++i) seq += c->Sequential(fh, rnd() % (k.file / k.req) * k.req, k.req, false) ? 1 : 0;
    EXPECT_LT(seq, kN * k.max_percent / 100) << k.req << " in " << k.file;
  }
}

// A scan whose requests arrive shuffled within windows of 4 (as many FUSE
// threads deliver readahead) bypasses after about seq_cutoff, like one in
// order: the bytes behind a run's end that fill a hole it jumped count.
// (Crediting a jump with the request alone cached 7 MiB at 128 KiB and
// 10 MiB at 1 MiB.)
TEST_F(BlockCacheTest, AShuffledScanBypassesAfterTheCutoff) {
  auto c = Open();
  for (uint64_t req : {uint64_t{128} << 10, uint64_t{1} << 20}) {
    std::mt19937_64 rnd(2);
    const uint64_t n = (256ull << 20) / req;
    uint64_t admitted = 0;
    const std::string fh = "scan" + std::to_string(req);
    for (uint64_t w = 0; w < n; w += 4) {
      std::vector<uint64_t> idx;
      for (uint64_t i = w; i < std::min(n, w + 4); ++i) idx.push_back(i);
      std::shuffle(idx.begin(), idx.end(), rnd);
      for (uint64_t i : idx) admitted += c->Sequential(fh, i * req, req, false) ? 0 : req;
    }
    EXPECT_LE(admitted, (uint64_t{4} << 20) + 2 * req) << req;
  }
}

// A jump ahead leaves a hole that the request filling it later credits;
// re-reading ground already seen behind the end credits nothing (a count of
// skipped bytes let any request behind the end claim them).
TEST_F(BlockCacheTest, OnlyTheGroundAJumpSkippedCountsWhenFilledLater) {
  auto c = Open();  // seq_cutoff 4 MiB
  constexpr uint64_t M = 1 << 20;
  EXPECT_FALSE(c->Sequential("fh", 0, M, false));      // 1 MiB
  EXPECT_FALSE(c->Sequential("fh", 2 * M, M, false));  // 2 MiB; [1, 2) MiB skipped
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(c->Sequential("fh", 0, M, false));  // seen: nothing
  EXPECT_FALSE(c->Sequential("fh", 3 * M, M, false));  // 3 MiB
  EXPECT_FALSE(c->Sequential("fh", 4 * M, M, false));  // 4 MiB: not past the cutoff
  EXPECT_TRUE(c->Sequential("fh", M, M, false));       // the hole: 5 MiB
  EXPECT_FALSE(c->Sequential("fh2", 0, M, false));
  EXPECT_FALSE(c->Sequential("fh2", 3 * M, M, false));  // [1, 3) skipped
  EXPECT_FALSE(c->Sequential("fh2", M + M / 2, M / 4, false));
  EXPECT_FALSE(c->Sequential("fh2", M + M / 2, M / 4, false));  // the same part again: nothing
  EXPECT_FALSE(c->Sequential("fh2", 4 * M, M, false));  // 3.25 MiB
  // The rest of the hole, both sides of the part filled: 5 MiB.
  EXPECT_TRUE(c->Sequential("fh2", M, 2 * M, false));
}

TEST_F(BlockCacheTest, TwoStreamsInOneFileAreBothSequential) {
  auto c = Open();
  constexpr uint64_t kReq = 256 << 10;
  const uint64_t a0 = 0, b0 = uint64_t{1} << 30;
  bool a_seq = false, b_seq = false;
  for (uint64_t i = 0; i < 64; ++i) {
    a_seq = c->Sequential("fh", a0 + i * kReq, kReq, false);
    b_seq = c->Sequential("fh", b0 + i * kReq, kReq, false);
  }
  EXPECT_TRUE(a_seq);
  EXPECT_TRUE(b_seq);
  // A random access elsewhere is not part of either.
  EXPECT_FALSE(c->Sequential("fh", uint64_t{3} << 30, 8192, false));
  EXPECT_TRUE(c->Sequential("fh", a0 + 64 * kReq, kReq, false));
}

TEST_F(BlockCacheTest, CapacityIsBoundedAndHotBlocksSurviveAScan) {
  auto c = Open(CacheMode::kReadOnly, 16 * kBlock);
  c->Observe("hot", kV1);
  c->Observe("scan", kV1);
  for (int i = 0; i < 4; ++i) {
    FillFromServer(*c, "hot", uint64_t(i) * kBlock, Pattern(kBlock, 'h'));
    EXPECT_TRUE(c->Read("hot", uint64_t(i) * kBlock, 4096).has_value());  // used twice: hot
  }
  for (int i = 0; i < 64; ++i) FillFromServer(*c, "scan", uint64_t(i) * kBlock, Pattern(kBlock, 's'));
  auto st = c->Stats();
  EXPECT_EQ(st.slots_used, 16u);
  EXPECT_GE(st.evictions, 52u);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(c->Read("hot", uint64_t(i) * kBlock, 4096).has_value()) << i;
}

TEST_F(BlockCacheTest, AdmitSecondCachesOnTheSecondMiss) {
  auto c = Open(CacheMode::kReadOnly, 1 << 20, /*admit_second=*/true);
  c->Observe("fh1", kV1);
  FillFromServer(*c, "fh1", 0, Pattern(kBlock, 'm'));
  EXPECT_FALSE(c->Read("fh1", 0, 4096).has_value());
  FillFromServer(*c, "fh1", 0, Pattern(kBlock, 'm'));
  EXPECT_TRUE(c->Read("fh1", 0, 4096).has_value());
}

TEST_F(BlockCacheTest, TheDirectoryServesOneMountAtATime) {
  auto a = Open();
  CacheOptions o;
  o.dir = dir_;
  o.size = 1 << 20;
  o.block = kBlock;
  o.mode = CacheMode::kReadOnly;
  auto b = BlockCache::Open(o);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.error().what.find("in use"), std::string::npos);
  o.dir = dir_ + "/missing";
  auto m = BlockCache::Open(o);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().what.find("not a directory"), std::string::npos);
}


// ------------------------------------------------------------ write-back

class WriteBackTest : public BlockCacheTest {
 protected:
  std::unique_ptr<BlockCache> OpenWb(uint64_t size = 1 << 20) { return Open(CacheMode::kWriteBack, size); }
  static WbWrite MakeWb(const std::string& fh, uint64_t off, const std::string& data) {
    auto keep = std::make_shared<std::string>(data);
    WbWrite w;
    w.fh = fh;
    w.off = off;
    w.data = keep->data();
    w.len = keep->size();
    w.keep = keep;
    w.uid = 1000;
    w.gid = 1000;
    return w;
  }
  static WbOutcome Wb(BlockCache& c, const std::string& fh, uint64_t off, const std::string& data,
                      std::map<uint64_t, std::string> base = {}) {
    WbWrite w = MakeWb(fh, off, data);
    w.base = std::move(base);
    std::promise<WbOutcome> p;
    auto f = p.get_future();
    c.WriteBack(std::move(w), [&p](WbOutcome o) { p.set_value(std::move(o)); });
    return f.get();
  }
  // fh1 [0, 8 KiB) = 'a' stored and committed (unflushed), then a byte of
  // its second page flipped on disk, and the cache opened again.
  std::unique_ptr<BlockCache> ReopenWithUnflushedPage1Damaged() {
    {
      auto c = OpenWb();
      c->Observe("fh1", kV1);
      if (Wb(*c, "fh1", 0, Pattern(8192, 'a')).kind != WbOutcome::kStored) return nullptr;
    }  // (the unmount commits it)
    if (!FlipOnDisk(4096 + 5)) return nullptr;
    auto c = OpenWb();
    c->Observe("fh1", kV1);
    return c;
  }
  static std::string Collected(BlockCache& c, const std::string& fh, uint64_t off, size_t len) {
    std::string out(len, '?');
    for (const auto& r : c.CollectDirty(UINT64_MAX, fh, std::chrono::steady_clock::now())) {
      for (size_t i = 0; i < r.data.size(); ++i) {
        if (r.off + i >= off && r.off + i < off + len) out[r.off + i - off] = r.data[i];
      }
    }
    return out;
  }
};

// A write over part of an unflushed page reads that page back to complete
// it; when the page fails its checksum there, the write it held is lost, and
// fsync must say so (merged with the server's copy silently, the loss would
// go unreported).
TEST_F(WriteBackTest, AWriteThatFindsTheUnflushedPageItCompletesDamagedReportsTheLossToFsync) {
  auto c = ReopenWithUnflushedPage1Damaged();
  ASSERT_NE(c, nullptr);
  WbOutcome o = Wb(*c, "fh1", 4096 + 100, "XYZ");
  ASSERT_EQ(o.kind, WbOutcome::kNeedPages);
  ASSERT_EQ(o.need, std::vector<uint64_t>{4096});
  EXPECT_EQ(Wb(*c, "fh1", 4096 + 100, "XYZ", {{4096, Pattern(4096, 's')}}).kind, WbOutcome::kStored);
  EXPECT_EQ(c->Stats().checksum_failures, 1u);
  std::promise<bool> d;
  c->Durable("fh1", [&d](bool ok) { d.set_value(ok); });
  EXPECT_FALSE(d.get_future().get()) << "fsync would say the lost write is durable";
  EXPECT_TRUE(c->TakeLost("fh1"));
  EXPECT_TRUE(Collected(*c, "fh1", 0, 4096) == Pattern(8192, 'a').substr(0, 4096));  // the sound page stays
}

// A cache left by an mpnfs of format 3 (its records in the index file, the
// data synced before them) is converted at the first mount, keeping its
// unflushed writes; the next mount finds them again.
TEST_F(WriteBackTest, AFormat3CacheIsConvertedKeepingItsUnflushedWrites) {
  const uint32_t pages = kBlock / kPage, slots = 16, slot = 5;
  const uint32_t rb = RecordBytes(pages), per3 = (kPage - 4 - 16) / rb;
  const uint32_t groups3 = (slots + per3 - 1) / per3;
  auto put = [](std::string& b, size_t at, auto v) { std::memcpy(b.data() + at, &v, sizeof(v)); };
  std::string header(kPage, '\0');
  put(header, 0, uint32_t{0x494e504d});
  put(header, 4, uint32_t{3});
  put(header, 8, kBlock);
  put(header, 12, slots);
  put(header, 16, rb);
  put(header, 20, uint32_t{0});
  put(header, kPage - 4, Crc(header.data(), kPage - 4));
  const std::string a = Pattern(8192, 'a');
  Record r;
  r.seq = 7;
  r.fh = "fh1";
  r.block = 0;
  for (uint32_t p = 0; p < 2; ++p) {
    SetBit(r.valid, p);
    SetBit(r.dirty, p);
  }
  r.version = kV1;
  r.fsize = 8192;
  r.uid = r.gid = 1000;
  r.crc.assign(pages, 0);
  r.crc[0] = Crc(a.data(), kPage);
  r.crc[1] = Crc(a.data() + kPage, kPage);
  std::string group(kPage, '\0');
  put(group, 0, uint32_t{0x474e504d});
  put(group, 4, uint16_t{3});
  put(group, 6, static_cast<uint16_t>(per3));
  put(group, 8, uint64_t{9});
  const std::string rec = EncodeRecord(r, pages);
  std::memcpy(group.data() + 16 + (slot % per3) * rb, rec.data(), rec.size());
  put(group, kPage - 4, Crc(group.data(), kPage - 4));
  {
    std::string index((1 + 2 * groups3) * kPage, '\0');
    index.replace(0, kPage, header);
    index.replace((1 + slot / per3 + groups3) * kPage, kPage, group);  // (copy 1)
    std::ofstream(dir_ + "/index", std::ios::binary) << index;
    std::string data(size_t{slots} * kBlock, '\0');
    data.replace(size_t{slot} * kBlock, a.size(), a);
    std::ofstream(dir_ + "/data", std::ios::binary) << data;
  }
  {
    auto c = OpenWb();
    ASSERT_NE(c, nullptr);
    EXPECT_TRUE(Collected(*c, "fh1", 0, 8192) == a) << "the unflushed write was not kept";
    EXPECT_EQ(c->SizeFloor("fh1"), 8192u);
    EXPECT_EQ(std::filesystem::file_size(dir_ + "/index"), kPage) << "still format 3";
  }
  auto c = OpenWb();
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(Collected(*c, "fh1", 0, 8192) == a) << "lost at the second mount";
  EXPECT_EQ(c->Stats().checksum_failures, 0u);
}

// A write that covers a damaged unflushed page whole replaces it; nothing is
// lost, nothing is read back, fsync succeeds.
TEST_F(WriteBackTest, AWriteThatCoversADamagedUnflushedPageWholeLosesNothing) {
  auto c = ReopenWithUnflushedPage1Damaged();
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(Wb(*c, "fh1", 4096, Pattern(4096, 'b')).kind, WbOutcome::kStored);
  std::promise<bool> d;
  c->Durable("fh1", [&d](bool ok) { d.set_value(ok); });
  EXPECT_TRUE(d.get_future().get());
  EXPECT_EQ(c->Stats().checksum_failures, 0u);
  EXPECT_TRUE(Collected(*c, "fh1", 0, 8192) == Pattern(8192, 'a').substr(0, 4096) + Pattern(4096, 'b'));
}

// A write over part of a clean cached page that fails its checksum asks
// for the server's copy, and the failure is counted (the write rewrites the
// slot in place, which has already taken the page out).
TEST_F(WriteBackTest, ADamagedCleanPageAWriteCompletesIsCounted) {
  auto c = ReopenWithFilledPage2Damaged(CacheMode::kWriteBack);
  ASSERT_NE(c, nullptr);
  WbOutcome o = Wb(*c, "fh1", 2 * 4096 + 100, "XYZ");
  ASSERT_EQ(o.kind, WbOutcome::kNeedPages);
  EXPECT_EQ(o.need, std::vector<uint64_t>{2 * 4096});
  EXPECT_EQ(c->Stats().checksum_failures, 1u);
}

TEST_F(WriteBackTest, AStoredWriteIsReadBackAndSurvivesAReopen) {
  const std::string data = Pattern(8192, 'w');
  {
    auto c = OpenWb();
    c->Observe("fh1", kV1);
    EXPECT_EQ(Wb(*c, "fh1", kBlock + 8192, data).kind, WbOutcome::kStored);
    auto got = c->Read("fh1", kBlock + 8192, 8192);
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(*got, data);
    EXPECT_EQ(c->Stats().dirty_bytes, 8192u);
    EXPECT_TRUE(c->HasDirty("fh1", kBlock + 8000, 300));
    EXPECT_FALSE(c->HasDirty("fh1", kBlock, 8192));
  }
  // The index is the journal: the dirty pages are found again, with whose
  // they are, and the flusher gets exactly the written bytes.
  auto c = OpenWb();
  EXPECT_EQ(c->Dirty().blocks, 1u);
  auto runs = c->CollectDirty(UINT64_MAX, "", std::chrono::steady_clock::now());
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].off, kBlock + 8192);
  EXPECT_EQ(runs[0].data, data);
  EXPECT_EQ(runs[0].uid, 1000u);
  // The size the unflushed data makes (the rest of the file is the
  // server's to say; a crash test shows why: crash_test.cc).
  EXPECT_EQ(c->SizeFloor("fh1"), kBlock + 16384);
  c->Observe("fh1", kV2);  // the server's version moved: dirty pages stay
  auto got = c->Read("fh1", kBlock + 8192, 8192);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, data);
}

// Durable at fsync: a write-back write returns before a commit; fsync of a
// file waits for one only if that file has writes no commit covered yet.
TEST_F(WriteBackTest, FsyncWaitsForACommitOnlyWhenTheFileHasWritesWaitingForOne) {
  commit_interval_ = std::chrono::hours(1);  // commits only when asked
  auto c = OpenWb();
  c->Observe("fhA", kV1);
  c->Observe("fhB", kV1);
  ASSERT_EQ(Wb(*c, "fhA", 0, Pattern(8192, 'a')).kind, WbOutcome::kStored);
  const auto me = std::this_thread::get_id();
  std::thread::id ran{};
  bool ok = false;
  c->Durable("fhB", [&](bool r) { ok = r, ran = std::this_thread::get_id(); });
  EXPECT_TRUE(ok);
  EXPECT_EQ(ran, me) << "fhB's fsync waited for a commit of fhA's writes";
  std::promise<std::pair<bool, std::thread::id>> a;
  c->Durable("fhA", [&a](bool r) { a.set_value({r, std::this_thread::get_id()}); });
  auto [a_ok, a_thread] = a.get_future().get();
  EXPECT_TRUE(a_ok);
  EXPECT_NE(a_thread, me) << "fhA's fsync returned without a commit";
  ran = {};
  c->Durable("fhA", [&](bool r) { ok = r, ran = std::this_thread::get_id(); });
  EXPECT_EQ(ran, me) << "a second fsync waited although nothing was written since";
}

TEST_F(WriteBackTest, ANonWriteBackMountRefusesACacheHoldingDirtyData) {
  {
    auto c = OpenWb();
    c->Observe("fh1", kV1);
    ASSERT_EQ(Wb(*c, "fh1", 0, Pattern(4096, 'x')).kind, WbOutcome::kStored);
  }
  CacheOptions o;
  o.dir = dir_;
  o.size = 8 << 20;    // another size
  o.block = 2 * kBlock;  // and block: the cache keeps its own until flushed
  o.mode = CacheMode::kReadOnly;
  auto c = BlockCache::Open(o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().what.find("cache_mode=writeback"), std::string::npos) << c.error().what;
  o.mode = CacheMode::kWriteBack;
  auto wb = BlockCache::Open(o);
  ASSERT_TRUE(wb.ok()) << wb.error().what;
  EXPECT_EQ((*wb)->capacity_bytes(), 1u << 20);
  EXPECT_EQ(Collected(**wb, "fh1", 0, 4096), Pattern(4096, 'x'));
}

TEST_F(WriteBackTest, APartialPageIsMergedWithTheServersCopy) {
  auto c = OpenWb();
  c->Observe("fh1", kV1);
  const std::string server = Pattern(4096, 's');
  auto o = Wb(*c, "fh1", 4096 + 100, "hello");
  ASSERT_EQ(o.kind, WbOutcome::kNeedPages);
  ASSERT_EQ(o.need, std::vector<uint64_t>{4096});
  ASSERT_EQ(Wb(*c, "fh1", 4096 + 100, "hello", {{4096, server}}).kind, WbOutcome::kStored);
  std::string want = server;
  want.replace(100, 5, "hello");
  auto got = c->Read("fh1", 4096, 4096);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, want);
  // Now cached: a second partial write needs nothing from the server.
  ASSERT_EQ(Wb(*c, "fh1", 4096 + 200, "again").kind, WbOutcome::kStored);
  want.replace(200, 5, "again");
  EXPECT_EQ(Collected(*c, "fh1", 4096, 4096), want);
}

TEST_F(WriteBackTest, RewritingADirtyPageCopiesTheBlockAndKeepsTheNewest) {
  commit_interval_ = std::chrono::hours(1);  // commits only when the test asks
  {
    auto c = OpenWb();
    c->Observe("fh1", kV1);
    FillFromServer(*c, "fh1", 0, Pattern(kBlock, 'c'));  // clean pages around
    ASSERT_EQ(Wb(*c, "fh1", 8192, Pattern(4096, '1')).kind, WbOutcome::kStored);
    c->Quiesce();  // a commit: a record declares the dirty page
    ASSERT_EQ(Wb(*c, "fh1", 8192, Pattern(4096, '2')).kind, WbOutcome::kStored);
    EXPECT_EQ(c->Stats().copies, 1u);
    EXPECT_EQ(c->Stats().rewrites_in_place, 0u);
    c->Quiesce();  // a commit: the new record is durable
    EXPECT_EQ(c->Stats().slots_used, 1u);  // the old slot was freed
    EXPECT_EQ(c->Stats().dirty_bytes, 4096u);  // the clean pages came along clean
    auto got = c->Read("fh1", 0, kBlock);
    ASSERT_TRUE(got.has_value());
    std::string want = Pattern(kBlock, 'c');
    want.replace(8192, 4096, Pattern(4096, '2'));
    EXPECT_EQ(*got, want);
  }
  auto c = OpenWb();
  EXPECT_EQ(Collected(*c, "fh1", 8192, 4096), Pattern(4096, '2'));
}

// A page rewritten after every commit (a database log's last page): the
// block goes back and forth between two slots, and each copy writes only
// the pages changed since the block left the slot it goes back to.
TEST_F(WriteBackTest, ARewriteAfterACommitGoesBackToThePartnerAndCopiesOnlyWhatChanged) {
  commit_interval_ = std::chrono::hours(1);  // commits only when the test asks
  const uint32_t pages = kBlock / 4096;
  std::string want = Pattern(kBlock, 'c');
  auto put = [&](BlockCache& c, uint32_t page, char v) {
    ASSERT_EQ(Wb(c, "fh1", uint64_t{page} * 4096, Pattern(4096, v)).kind, WbOutcome::kStored);
    want.replace(size_t{page} * 4096, 4096, Pattern(4096, v));
    c.Quiesce();  // a commit (fsync)
  };
  {
    auto c = OpenWb();
    c->Observe("fh1", kV1);
    FillFromServer(*c, "fh1", 0, Pattern(kBlock, 'c'));
    put(*c, 2, '1');  // clean page: in place
    EXPECT_EQ(c->Stats().copies, 0u);
    put(*c, 2, '2');  // dirty and committed: copied to a fresh slot, every other page read
    EXPECT_EQ(c->Stats().copies, 1u);
    EXPECT_EQ(c->Stats().copies_to_partner, 0u);
    EXPECT_EQ(c->Stats().copied_pages, pages - 1);
    put(*c, 2, '3');  // back to the first slot: nothing else changed, nothing read
    EXPECT_EQ(c->Stats().copies, 2u);
    EXPECT_EQ(c->Stats().copies_to_partner, 1u);
    EXPECT_EQ(c->Stats().copied_pages, pages - 1);
    put(*c, 5, '4');  // a clean page: in place, but it now differs from the partner's
    EXPECT_EQ(c->Stats().copies, 2u);
    put(*c, 2, '5');  // back again: page 5 alone is copied
    EXPECT_EQ(c->Stats().copies, 3u);
    EXPECT_EQ(c->Stats().copies_to_partner, 2u);
    EXPECT_EQ(c->Stats().copied_pages, pages);
    // Two writes to one page between commits: the first copies back to
    // the partner, the second rewrites the copy in place (no record
    // declares it yet).
    ASSERT_EQ(Wb(*c, "fh1", 2 * 4096, Pattern(4096, '6')).kind, WbOutcome::kStored);
    put(*c, 2, '7');
    EXPECT_EQ(c->Stats().copies, 4u);
    EXPECT_EQ(c->Stats().copies_to_partner, 3u);
    EXPECT_EQ(c->Stats().copied_pages, pages);
    EXPECT_EQ(c->Stats().rewrites_in_place, 1u);
    EXPECT_EQ(c->Stats().slots_used, 1u);
    auto got = c->Read("fh1", 0, kBlock);
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(*got, want);
  }
  auto c = OpenWb();
  c->Observe("fh1", kV1);
  auto got = c->Read("fh1", 0, kBlock);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, want);
  EXPECT_EQ(Collected(*c, "fh1", 2 * 4096, 4096), Pattern(4096, '7'));
  EXPECT_EQ(Collected(*c, "fh1", 5 * 4096, 4096), Pattern(4096, '4'));
}

// A dirty page that no record declares yet (written since the last
// commit) is rewritten in place: no copy, the newest data kept; once a
// commit declared it, the next write copies again.
TEST_F(WriteBackTest, ADirtyPageNoRecordDeclaresYetIsRewrittenInPlace) {
  commit_interval_ = std::chrono::hours(1);  // commits only when the test asks
  {
    auto c = OpenWb();
    c->Observe("fh1", kV1);
    FillFromServer(*c, "fh1", 0, Pattern(kBlock, 'c'));
    for (char v : {'1', '2', '3'}) {
      ASSERT_EQ(Wb(*c, "fh1", 8192, Pattern(4096, v)).kind, WbOutcome::kStored);
    }
    EXPECT_EQ(c->Stats().copies, 0u);
    EXPECT_EQ(c->Stats().rewrites_in_place, 2u);
    EXPECT_EQ(Collected(*c, "fh1", 8192, 4096), Pattern(4096, '3'));
    c->Quiesce();
    ASSERT_EQ(Wb(*c, "fh1", 8192, Pattern(4096, '4')).kind, WbOutcome::kStored);
    EXPECT_EQ(c->Stats().copies, 1u);
    EXPECT_EQ(c->Stats().rewrites_in_place, 2u);
    ASSERT_EQ(Wb(*c, "fh1", 8192 + 100, "tail").kind, WbOutcome::kStored);  // partial: merged in place
    EXPECT_EQ(c->Stats().copies, 1u);
    EXPECT_EQ(c->Stats().rewrites_in_place, 3u);
  }
  auto c = OpenWb();
  c->Observe("fh1", kV1);
  std::string want = Pattern(4096, '4');
  want.replace(100, 4, "tail");
  EXPECT_EQ(Collected(*c, "fh1", 8192, 4096), want);
  auto got = c->Read("fh1", 0, kBlock);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->substr(8192, 4096), want);
  EXPECT_EQ(got->substr(0, 8192), Pattern(kBlock, 'c').substr(0, 8192));
}

// Pages filled after a copy are not in the partner: going back copies them.
TEST_F(WriteBackTest, PagesFilledAfterACopyAreCarriedBackToThePartner) {
  commit_interval_ = std::chrono::hours(1);  // commits only when the test asks
  const uint32_t pages = kBlock / 4096;
  auto c = OpenWb();
  c->Observe("fh1", kV1);
  const std::string server = Pattern(kBlock, 's');
  FillFromServer(*c, "fh1", 0, server.substr(0, kBlock / 2));  // the first half
  ASSERT_EQ(Wb(*c, "fh1", 2 * 4096, Pattern(4096, '1')).kind, WbOutcome::kStored);
  c->Quiesce();
  ASSERT_EQ(Wb(*c, "fh1", 2 * 4096, Pattern(4096, '2')).kind, WbOutcome::kStored);
  c->Quiesce();
  ASSERT_EQ(c->Stats().copied_pages, pages / 2 - 1);
  FillFromServer(*c, "fh1", kBlock / 2, server.substr(kBlock / 2));  // the second half, after the copy
  ASSERT_EQ(Wb(*c, "fh1", 2 * 4096, Pattern(4096, '3')).kind, WbOutcome::kStored);
  c->Quiesce();
  EXPECT_EQ(c->Stats().copies_to_partner, 1u);
  EXPECT_EQ(c->Stats().copied_pages, pages / 2 - 1 + pages / 2);
  std::string want = server;
  want.replace(2 * 4096, 4096, Pattern(4096, '3'));
  auto got = c->Read("fh1", 0, kBlock);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, want);
  EXPECT_EQ(c->Stats().checksum_failures, 0u);
}

// A partner given to another block meanwhile is not gone back to: the copy
// takes a fresh slot and carries every page, as the first copy did.
TEST_F(WriteBackTest, APartnerTakenByAnotherBlockIsNotWrittenOver) {
  commit_interval_ = std::chrono::hours(1);  // commits only when the test asks
  const uint32_t pages = kBlock / 4096;
  auto c = OpenWb();  // 16 slots
  c->Observe("fh1", kV1);
  c->Observe("fh2", kV1);
  FillFromServer(*c, "fh1", 0, Pattern(kBlock, 'c'));
  ASSERT_EQ(Wb(*c, "fh1", 0, Pattern(4096, '1')).kind, WbOutcome::kStored);
  c->Quiesce();
  ASSERT_EQ(Wb(*c, "fh1", 0, Pattern(4096, '2')).kind, WbOutcome::kStored);
  c->Quiesce();  // the first slot is free now, fh1's partner
  ASSERT_EQ(c->Stats().copies, 1u);
  // Fill every other slot: the partner, handed out last, is taken too.
  for (uint64_t b = 0; b < 15; ++b) FillFromServer(*c, "fh2", b * kBlock, Pattern(kBlock, 'a' + b));
  ASSERT_EQ(c->Stats().slots_used, 16u);
  ASSERT_EQ(Wb(*c, "fh1", 0, Pattern(4096, '3')).kind, WbOutcome::kStored);
  c->Quiesce();
  EXPECT_EQ(c->Stats().copies, 2u);
  EXPECT_EQ(c->Stats().copies_to_partner, 0u);
  EXPECT_EQ(c->Stats().copied_pages, 2 * (pages - 1));
  std::string want = Pattern(kBlock, 'c');
  want.replace(0, 4096, Pattern(4096, '3'));
  auto got = c->Read("fh1", 0, kBlock);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, want);
  for (uint64_t b = 0; b < 15; ++b) {
    auto other = c->Read("fh2", b * kBlock, kBlock);
    if (other) {
      EXPECT_EQ(*other, Pattern(kBlock, 'a' + b)) << "block " << b;  // (one was evicted)
    }
  }
}

// A partner taken by another block and freed again (another gen) is not
// gone back to.
TEST_F(WriteBackTest, APartnerTakenAndFreedAgainIsNotGoneBackTo) {
  commit_interval_ = std::chrono::hours(1);
  auto c = OpenWb();  // 16 slots
  c->Observe("fh1", kV1);
  c->Observe("fh2", kV1);
  FillFromServer(*c, "fh1", 0, Pattern(kBlock, 'c'));
  ASSERT_EQ(Wb(*c, "fh1", 0, Pattern(4096, '1')).kind, WbOutcome::kStored);
  c->Quiesce();
  ASSERT_EQ(Wb(*c, "fh1", 0, Pattern(4096, '2')).kind, WbOutcome::kStored);
  c->Quiesce();  // the first slot is free now, fh1's partner
  for (uint64_t b = 0; b < 15; ++b) FillFromServer(*c, "fh2", b * kBlock, Pattern(kBlock, 'a' + b));
  ASSERT_EQ(c->Stats().slots_used, 16u);  // the partner holds an fh2 block now
  c->Drop("fh2");                          // ... and is free again (another gen)
  c->Quiesce();
  ASSERT_EQ(Wb(*c, "fh1", 0, Pattern(4096, '3')).kind, WbOutcome::kStored);
  c->Quiesce();
  EXPECT_EQ(c->Stats().copies_to_partner, 0u);
  std::string want = Pattern(kBlock, 'c');
  want.replace(0, 4096, Pattern(4096, '3'));
  auto got = c->Read("fh1", 0, kBlock);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, want);
  EXPECT_EQ(c->Stats().checksum_failures, 0u);
}

// A block's new slot freed before the commit (and given to another file)
// gets no partner from it.
TEST_F(WriteBackTest, ANewSlotFreedBeforeTheCommitGetsNoPartner) {
  commit_interval_ = std::chrono::hours(1);
  auto c = OpenWb();  // 16 slots
  for (const char* fh : {"fh1", "fh2", "fh3"}) c->Observe(fh, kV1);
  FillFromServer(*c, "fh1", 0, Pattern(kBlock, 'c'));
  ASSERT_EQ(Wb(*c, "fh1", 0, Pattern(4096, '1')).kind, WbOutcome::kStored);
  c->Quiesce();
  for (uint64_t b = 0; b < 14; ++b) FillFromServer(*c, "fh2", b * kBlock, Pattern(kBlock, 'a' + b));
  ASSERT_EQ(c->Stats().slots_used, 15u);
  ASSERT_EQ(Wb(*c, "fh1", 0, Pattern(4096, '2')).kind, WbOutcome::kStored);  // copy to the last free slot B
  c->Quiesce(/*commit=*/false);
  c->Drop("fh1");  // frees B (the old slot stays retired until the commit)
  {
    const std::string f = Pattern(kBlock, 'f');
    const uint64_t t = c->ReadStart("fh3");
    c->Fill("fh3", t, 0, f.data(), f.size());  // B again (the only free slot)
    c->Quiesce(/*commit=*/false);
  }
  ASSERT_EQ(Wb(*c, "fh3", 0, Pattern(4096, '3')).kind, WbOutcome::kStored);  // in place
  c->Quiesce();
  ASSERT_EQ(Wb(*c, "fh3", 0, Pattern(4096, '4')).kind, WbOutcome::kStored);  // a copy
  c->Quiesce();
  EXPECT_EQ(c->Stats().copies_to_partner, 0u);
  std::string want = Pattern(kBlock, 'f');
  want.replace(0, 4096, Pattern(4096, '4'));
  auto got = c->Read("fh3", 0, kBlock);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, want);
  EXPECT_EQ(c->Stats().checksum_failures, 0u);
}

TEST_F(WriteBackTest, ATruncateNeverDropsUnflushedWrites) {
  // A write acknowledged after the flush that precedes a truncate: the cache
  // refuses to forget the file until it is flushed too.
  auto c = Open(CacheMode::kWriteBack);
  c->Observe("fh1", kV1);
  ASSERT_EQ(Wb(*c, "fh1", 0, Pattern(8192, 'a')).kind, WbOutcome::kStored);
  bool sent = false;
  EXPECT_FALSE(c->Truncating("fh1", [&sent] { sent = true; }));
  EXPECT_FALSE(sent);
  EXPECT_TRUE(c->HasDirty("fh1", 0, 8192));
  auto runs = c->CollectDirty(UINT64_MAX, "", std::chrono::steady_clock::now());
  ASSERT_EQ(runs.size(), 1u);
  c->Flushed(runs);
  EXPECT_TRUE(c->Truncating("fh1", [&sent] { sent = true; }));
  EXPECT_TRUE(sent);
  EXPECT_FALSE(c->HasDirty("fh1", 0, 8192));
}

TEST_F(WriteBackTest, AFlushMarksCleanOnlyWhatWasNotWrittenAgain) {
  auto c = OpenWb();
  EXPECT_EQ(c->Stats().dirty_age_s, 0.0);  // nothing dirty
  c->Observe("fh1", kV1);
  ASSERT_EQ(Wb(*c, "fh1", 0, Pattern(8192, 'a')).kind, WbOutcome::kStored);
  ASSERT_EQ(Wb(*c, "fh1", kBlock, Pattern(8192, 'b')).kind, WbOutcome::kStored);
  auto runs = c->CollectDirty(UINT64_MAX, "fh1", std::chrono::steady_clock::now());
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_LT(runs[0].off, runs[1].off);  // file order
  ASSERT_EQ(Wb(*c, "fh1", kBlock, Pattern(4096, 'n')).kind, WbOutcome::kStored);  // while "in flight"
  c->Flushed(runs);
  EXPECT_EQ(c->Dirty().blocks, 1u);  // block 0 clean, block 1 written again
  EXPECT_EQ(Collected(*c, "fh1", kBlock, 4096), Pattern(4096, 'n'));
  EXPECT_EQ(c->Stats().flushed_bytes, 16384u);
  EXPECT_EQ(c->Stats().flush_rate_bps, 16384u / RateWindow::kSeconds);  // within the window
  EXPECT_GT(c->Stats().dirty_age_s, 0.0);  // block 1 is still dirty
  // Clean pages are still cached.
  EXPECT_TRUE(c->Read("fh1", 0, 8192).has_value());
}

TEST(RateWindowTest, AveragesWhatWasAddedInTheLastTenSeconds) {
  RateWindow w;
  EXPECT_EQ(w.PerSecond(100), 0u);
  w.Add(100, 5000);
  w.Add(100, 5000);
  w.Add(105, 20000);
  EXPECT_EQ(w.PerSecond(105), 3000u);
  EXPECT_EQ(w.PerSecond(109), 3000u);
  EXPECT_EQ(w.PerSecond(110), 2000u);  // second 100 has left the window
  EXPECT_EQ(w.PerSecond(115), 0u);
  w.Add(120, 1000);  // reuses second 100's and 110's slot
  EXPECT_EQ(w.PerSecond(120), 100u);
}

TEST_F(WriteBackTest, DirtyBlocksAreNeverEvicted) {
  auto c = OpenWb(16 * kBlock);  // 16 slots
  c->Observe("fh1", kV1);
  for (uint64_t b = 0; b < 16; ++b) {
    ASSERT_EQ(Wb(*c, "fh1", b * kBlock, Pattern(4096, static_cast<char>(b))).kind, WbOutcome::kStored);
  }
  EXPECT_EQ(Wb(*c, "fh1", 20 * kBlock, Pattern(4096, 'z')).kind, WbOutcome::kUnavailable);
  FillFromServer(*c, "fh1", 30 * kBlock, Pattern(kBlock, 'f'));
  for (uint64_t b = 0; b < 16; ++b) {
    EXPECT_EQ(Collected(*c, "fh1", b * kBlock, 4096), Pattern(4096, static_cast<char>(b)));
  }
  EXPECT_EQ(c->Stats().wb_arounds, 1u);
  EXPECT_EQ(c->DropAll(), 0u);  // drop keeps unflushed data
  EXPECT_EQ(c->Dirty().blocks, 16u);
}

TEST_F(WriteBackTest, OverlayPutsUnflushedPagesOverServerDataAndExtendsTheFile) {
  auto c = OpenWb();
  c->Observe("fh1", FileVersion{10000, 1, 1});
  const uint64_t token = c->ReadStart("fh1");
  // Grow the file past the server's end: 8 KiB at 16 KiB.
  ASSERT_EQ(Wb(*c, "fh1", 16384, Pattern(8192, 'd')).kind, WbOutcome::kStored);
  EXPECT_EQ(c->SizeFloor("fh1"), 24576u);
  // A read sent before that write returned the server's 10000 bytes.
  const std::string server = Pattern(10000, 's');
  std::string buf;
  auto r = c->Overlay("fh1", token, 0, server, 32768, &buf);
  ASSERT_EQ(r.kind, OverlayResult::kOk);
  ASSERT_TRUE(r.replaced);
  ASSERT_EQ(buf.size(), 24576u);
  EXPECT_EQ(buf.substr(0, 10000), server);
  EXPECT_EQ(buf.substr(10000, 6384), std::string(6384, '\0'));
  EXPECT_EQ(buf.substr(16384, 8192), Pattern(8192, 'd'));
  // Nothing unflushed in range: the server's bytes stand as they are.
  EXPECT_FALSE(c->Overlay("fh1", c->ReadStart("fh1"), 0, server.substr(0, 8192), 8192, &buf).replaced);
  // A read of a block flushed and dropped since it was sent must be redone.
  auto runs = c->CollectDirty(UINT64_MAX, "fh1", std::chrono::steady_clock::now());
  c->Flushed(runs);
  c->Drop("fh1");
  c->Observe("fh1", FileVersion{24576, 2, 2});
  EXPECT_EQ(c->Overlay("fh1", token, 16384, std::string(8192, 's'), 8192, &buf).kind,
            OverlayResult::kRetry);
}

TEST_F(WriteBackTest, OverlayNeverReadsTheCacheDiskOnTheCallersThread) {
  // READ replies arrive on engine event loops, which must not wait for the
  // cache disk: merging unflushed pages moves to the cache's reader thread.
  std::shared_ptr<BlockCache> c = OpenWb();
  c->Observe("fh1", FileVersion{8192, 1, 1});
  ASSERT_EQ(Wb(*c, "fh1", 0, Pattern(4096, 'd')).kind, WbOutcome::kStored);
  const std::string server = Pattern(8192, 's');
  std::promise<std::pair<std::thread::id, std::string>> got;
  BlockCache::OverlayAsync(c, "fh1", c->ReadStart("fh1"), 0, server, 8192,
                           [&got](OverlayResult r, std::string_view data) {
                             EXPECT_EQ(r.kind, OverlayResult::kOk);
                             got.set_value({std::this_thread::get_id(), std::string(data)});
                           });
  auto [tid, data] = got.get_future().get();
  EXPECT_NE(tid, std::this_thread::get_id());
  EXPECT_EQ(data.substr(0, 4096), Pattern(4096, 'd'));
  EXPECT_EQ(data.substr(4096), server.substr(4096));
  // Nothing to read back: answered at once, in the caller's thread.
  std::thread::id inline_tid;
  BlockCache::OverlayAsync(c, "fh1", c->ReadStart("fh1"), 4096, server.substr(4096), 4096,
                           [&inline_tid](OverlayResult, std::string_view) {
                             inline_tid = std::this_thread::get_id();
                           });
  EXPECT_EQ(inline_tid, std::this_thread::get_id());
}

TEST_F(WriteBackTest, ReadHitsStopAtTheEndOfTheFile) {
  auto c = OpenWb();
  c->Observe("fh1", FileVersion{0, 1, 1});
  ASSERT_EQ(Wb(*c, "fh1", 0, "abc", {{0, ""}}).kind, WbOutcome::kStored);
  auto got = c->Read("fh1", 0, 4096);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, "abc");
  auto runs = c->CollectDirty(UINT64_MAX, "", std::chrono::steady_clock::now());
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].data, "abc");  // not a page of zeros: the file is 3 bytes
}

TEST_F(BlockCacheTest, AnIndexThatCannotBeReadIsRefusedAndKept) {
  { auto c = Open(CacheMode::kWriteBack); }
  // Damage the header (or an index of an unknown format): the mount is
  // refused with a way out, and the file is left as it was.
  {
    std::fstream f(dir_ + "/index", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(9);
    f.put('\x7f');
  }
  const auto before = std::filesystem::file_size(dir_ + "/index");
  CacheOptions o;
  o.dir = dir_;
  o.size = 1 << 20;
  o.block = kBlock;
  o.mode = CacheMode::kWriteBack;
  auto c = BlockCache::Open(o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().what.find("remove"), std::string::npos) << c.error().what;
  EXPECT_EQ(std::filesystem::file_size(dir_ + "/index"), before);
}

TEST(RecordFormatTest, RoundTripsAndRejectsDamage) {
  Record r;
  r.seq = 42;
  r.fh = "handle";
  r.block = 7;
  SetBit(r.valid, 3);
  SetBit(r.valid, 4);
  SetBit(r.dirty, 4);
  r.version = kV2;
  r.fsize = 123456;
  r.uid = 20001;
  r.gid = 20002;
  r.groups = {20010, 20011};
  r.crc.assign(16, 0);
  r.crc[3] = 0xdeadbeef;
  std::string bytes = EncodeRecord(r, 16);
  EXPECT_EQ(bytes.size(), RecordBytes(16));
  auto back = DecodeRecord(bytes, 16);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->seq, 42u);
  EXPECT_EQ(back->fh, "handle");
  EXPECT_EQ(back->block, 7u);
  EXPECT_TRUE(TestBit(back->valid, 3));
  EXPECT_EQ(back->version, kV2);
  EXPECT_EQ(back->crc[3], 0xdeadbeefu);
  EXPECT_TRUE(TestBit(back->dirty, 4));
  EXPECT_FALSE(TestBit(back->dirty, 3));
  EXPECT_EQ(back->fsize, 123456u);
  EXPECT_EQ(back->uid, 20001u);
  EXPECT_EQ(back->gid, 20002u);
  EXPECT_EQ(back->groups, (std::vector<uint32_t>{20010, 20011}));
  bytes[40] ^= 1;
  EXPECT_FALSE(DecodeRecord(bytes, 16).has_value());
  EXPECT_FALSE(DecodeRecord(std::string(bytes.size(), '\0'), 16).has_value());
}


// The per-file table: a file holds an id while any slot names it; the id
// goes with its last slot and is then given to another file, whose blocks
// are never taken for the first file's.
TEST_F(BlockCacheTest, AFilesEntryGoesWithItsLastSlotAndItsIdIsReusedSafely) {
  auto c = Open();
  c->Observe("fhA", kV1);
  c->Observe("fhB", kV1);
  FillFromServer(*c, "fhA", 0, Pattern(2 * kBlock, 'a'));
  FillFromServer(*c, "fhB", 0, Pattern(kBlock, 'b'));
  EXPECT_EQ(c->Stats().files_cached, 2u);
  c->Drop("fhA");
  EXPECT_EQ(c->Stats().files_cached, 1u);
  c->Observe("fhC", kV1);
  FillFromServer(*c, "fhC", 0, Pattern(kBlock, 'c'));
  EXPECT_EQ(c->Stats().files_cached, 2u);
  c->Observe("fhA", kV1);
  EXPECT_FALSE(c->Read("fhA", 0, 4096).has_value());
  EXPECT_EQ(c->Read("fhC", 0, kBlock), Pattern(kBlock, 'c'));
  EXPECT_EQ(c->Read("fhB", 0, kBlock), Pattern(kBlock, 'b'));
  c->Observe("fhB", kV2);  // changed elsewhere: its only block goes
  EXPECT_EQ(c->Stats().files_cached, 1u);
  c->Observe("fhC", kV2);
  EXPECT_EQ(c->Stats().files_cached, 0u);
  EXPECT_EQ(c->Stats().slots_used, 0u);
}

// A page damaged on the cache disk is caught by its CRC (crc_store.h); the
// block's sound pages still serve.
TEST_F(BlockCacheTest, ADamagedPageIsCaughtAndTheSoundPagesStillServe) {
  auto c = Open();
  c->Observe("fh1", kV1);
  const std::string data = Pattern(kBlock, 'q');
  FillFromServer(*c, "fh1", 0, data);
  EXPECT_EQ(c->Read("fh1", 0, kBlock), data);
  // Flip a byte of the slot's fourth page on disk.
  ASSERT_TRUE(FlipOnDisk(3 * 4096 + 5, 0x01));
  EXPECT_FALSE(c->Read("fh1", 0, kBlock).has_value());
  EXPECT_EQ(c->Stats().checksum_failures, 1u);
  EXPECT_EQ(c->Read("fh1", 0, 3 * 4096), data.substr(0, 3 * 4096));  // the sound pages still serve
}

// With the page checksums of 2 of 16 slots in RAM (the rest in the file
// `crcs`, crc_store.h), every block still serves what was filled, a damaged
// page is still caught, and a remount rebuilds the table from the records.
TEST_F(BlockCacheTest, ChecksumsOutOfRamStillServeCatchDamageAndComeBackAtMount) {
  paged_ = true;
  index_per_page_ = 2;  // (a record write holds the checksums of 4 frames at most)
  auto name = [](int i) { return "file" + std::to_string(i); };
  {
    auto c = Open();
    ASSERT_EQ(c->Stats().slots, 16u);
    for (int i = 0; i < 16; ++i) {
      c->Observe(name(i), kV1);
      FillFromServer(*c, name(i), 0, Pattern(kBlock, static_cast<char>('a' + i)));
    }
    for (int round = 0; round < 2; ++round) {
      for (int i = 0; i < 16; ++i) EXPECT_EQ(c->Read(name(i), 0, kBlock), Pattern(kBlock, static_cast<char>('a' + i))) << i;
    }
    const auto st = c->Stats();
    EXPECT_GE(st.checksum_reads, 16u);  // each block's checksums read back
    EXPECT_GE(st.checksum_writes, 14u);
    // The budget, and what the writer's record writes and a read held at once.
    EXPECT_LE(st.checksum_ram_bytes, (2u + 4u + 2u) * (kBlock / 4096 * 4));
    EXPECT_TRUE(std::filesystem::exists(dir_ + "/crcs"));
    // One page of slot 9, damaged on disk: exactly one file stops serving.
    ASSERT_TRUE(FlipOnDisk(9ull * kBlock + 3 * 4096 + 5, 0x01));
    int whole = 0;
    for (int i = 0; i < 16; ++i) whole += c->Read(name(i), 0, kBlock).has_value() ? 1 : 0;
    EXPECT_EQ(whole, 15);
    EXPECT_EQ(c->Stats().checksum_failures, 1u);
  }
  auto c = Open();
  int whole = 0;
  for (int i = 0; i < 16; ++i) {
    c->Observe(name(i), kV1);
    auto got = c->Read(name(i), 0, kBlock);
    if (got) {
      EXPECT_EQ(*got, Pattern(kBlock, static_cast<char>('a' + i))) << i;
      whole++;
    }
  }
  EXPECT_EQ(whole, 15);
  EXPECT_EQ(c->Stats().checksum_failures, 0u);  // the damaged page was dropped for good
}

// Files with nothing cached are forgotten past 65536 of them; a read that
// left before its file was forgotten, and a write to it since, must not
// fill the cache with what the read brings back once the file is seen again
// (write counters come from one cache-wide counter).
TEST_F(BlockCacheTest, AReadOlderThanAForgottenFilesWriteNeverFills) {
  auto c = Open();
  c->Observe("fhX", kV1);
  const uint64_t token = c->ReadStart("fhX");
  const std::string fresh = Pattern(kBlock, 'n');
  uint64_t t = c->WriteStart("fhX", 0, kBlock);
  c->WriteDone("fhX", t, 0, fresh.data(), fresh.size(), true, /*admit=*/false, kV1, kV2);
  for (int i = 0; i <= 65536; ++i) c->Observe("other" + std::to_string(i), kV1);
  c->Observe("fhX", kV2);  // seen again (its entry was forgotten)
  const std::string stale = Pattern(kBlock, 's');
  c->Fill("fhX", token, 0, stale.data(), stale.size());
  c->Quiesce();
  EXPECT_FALSE(c->Read("fhX", 0, kBlock).has_value());
}

// Races of write-back writes: a disk whose data file holds one write of a
// given length until released.
// It can also hold the next sync of the records (the data file's), and
// fail the data file's syncs and reads.
struct GateFile : File {
  std::unique_ptr<File> f;
  struct GateDisk* d;
  bool index = false;
  bool crcs = false;  // the page checksum file (crc_store.h)
  bool ReadAt(char* p, size_t n, uint64_t off) override;
  bool WriteAt(const char* p, size_t n, uint64_t off) override;
  bool Sync() override;
  bool Truncate(uint64_t size) override;
  bool Allocate(uint64_t size) override { return f->Allocate(size); }
  uint64_t Size() override { return f->Size(); }
};
struct GateDisk : Disk {
  std::mutex mu;
  std::condition_variable cv;
  bool armed = false, held = false, release = false;
  size_t hold_len = 0;
  bool hold_index_sync = false;  // like armed/held/release, for the next sync of the records (the data file's)
  bool tear = false;             // a held data write lands half before it holds
  bool fail_torn = false;        // ... and then fails (EIO) instead of holding
  bool read_armed = false, read_held = false, read_release = false;  // the next data read
  std::atomic<bool> fail_data_sync{false}, fail_data_read{false};
  std::atomic<int> fail_crc_reads{0};  // the next N reads of the page checksum file fail
  std::atomic<bool> fail_index_truncate{false};  // the index cannot be truncated ...
  std::atomic<bool> fail_index_remove{false};    // ... nor removed
  Result<std::unique_ptr<File>> Open(const std::string& path, int flags) override {
    auto r = RealDisk().Open(path, flags);
    if (!r) return r;
    const bool data = path.size() >= 5 && path.substr(path.size() - 5) == "/data";
    const bool index = path.size() >= 6 && path.substr(path.size() - 6) == "/index";
    const bool crcs = path.size() >= 5 && path.substr(path.size() - 5) == "/crcs";
    if (!data && !index && !crcs) return r;
    auto g = std::make_unique<GateFile>();
    g->f = std::move(*r);
    g->d = this;
    g->index = index;
    g->crcs = crcs;
    return std::unique_ptr<File>(std::move(g));
  }
  bool Exists(const std::string& p) override { return RealDisk().Exists(p); }
  bool Rename(const std::string& a, const std::string& b) override { return RealDisk().Rename(a, b); }
  bool Remove(const std::string& p) override {
    if (fail_index_remove && p.ends_with("/index")) return errno = EIO, false;
    return RealDisk().Remove(p);
  }
  bool SyncDir(const std::string& d) override { return RealDisk().SyncDir(d); }
  uint64_t Allocated(const std::string& p) override { return RealDisk().Allocated(p); }
  void Arm(size_t len) {
    std::lock_guard l(mu);
    armed = true;
    hold_len = len;
  }
  void AwaitHeld() {
    std::unique_lock l(mu);
    cv.wait(l, [&] { return held; });
  }
  void Release() {
    std::lock_guard l(mu);
    release = true;
    cv.notify_all();
  }
};
bool GateFile::ReadAt(char* p, size_t n, uint64_t off) {
  if (crcs) {
    if (d->fail_crc_reads > 0) {
      d->fail_crc_reads--;
      return errno = EIO, false;
    }
    return f->ReadAt(p, n, off);
  }
  if (!index && d->fail_data_read) {
    errno = EIO;
    return false;
  }
  if (!index) {
    std::unique_lock l(d->mu);
    if (d->read_armed) {
      d->read_armed = false;
      d->read_held = true;
      d->cv.notify_all();
      d->cv.wait(l, [&] { return d->read_release; });
    }
  }
  return f->ReadAt(p, n, off);
}
bool GateFile::Truncate(uint64_t size) {
  if (index && d->fail_index_truncate) {
    errno = EIO;
    return false;
  }
  return f->Truncate(size);
}
bool GateFile::Sync() {
  if (crcs) return f->Sync();
  if (!index && d->fail_data_sync) {
    errno = EIO;
    return false;
  }
  if (!index) {  // (the data file's sync makes the records durable too)
    std::unique_lock l(d->mu);
    if (d->hold_index_sync) {
      d->hold_index_sync = false;
      d->held = true;
      d->cv.notify_all();
      d->cv.wait(l, [&] { return d->release; });
    }
  }
  return f->Sync();
}
bool GateFile::WriteAt(const char* p, size_t n, uint64_t off) {
  if (crcs) return f->WriteAt(p, n, off);
  if (index) return f->WriteAt(p, n, off);
  {
    std::unique_lock l(d->mu);
    if (d->armed && n == d->hold_len) {
      d->armed = false;
      if (d->tear && !f->WriteAt(p, n / 2, off)) return false;
      if (d->fail_torn) {
        errno = EIO;
        return false;
      }
      d->held = true;
      d->cv.notify_all();
      d->cv.wait(l, [&] { return d->release; });
    }
  }
  return f->WriteAt(p, n, off);
}

class WbRaceTest : public WriteBackTest {
 protected:
  std::unique_ptr<BlockCache> Open(uint64_t size, Disk* disk = nullptr) {
    return BlockCacheTest::Open(CacheMode::kWriteBack, size, false, disk);
  }
  // A cache on `disk` that commits only when asked, holding one answered
  // write-back write of fhA (8 KiB at 0) that no commit covered yet.
  std::unique_ptr<BlockCache> OpenWithAWriteNotCommitted(GateDisk& disk) {
    commit_interval_ = std::chrono::hours(1);
    auto c = Open(1 << 20, &disk);
    c->Observe("fhA", kV1);
    if (Wb(*c, "fhA", 0, Pattern(8192, 'a')).kind != WbOutcome::kStored) return nullptr;
    return c;
  }
  // The next commit's data sync fails (the index breaks): true if the
  // fsync waiting for it heard so.
  static bool FailTheCommit(BlockCache& c, GateDisk& disk, const std::string& fh = "fhA") {
    disk.fail_data_sync = true;
    std::promise<bool> d;
    c.Durable(fh, [&d](bool ok) { d.set_value(ok); });
    const bool failed = !d.get_future().get();
    disk.fail_data_sync = false;
    return failed;
  }
  // A write-back write whose outcome arrives through `p`.
  static void WbAsync(BlockCache& c, const std::string& fh, uint64_t off, const std::string& data,
                      std::promise<WbOutcome>* p) {
    c.WriteBack(MakeWb(fh, off, data), [p](WbOutcome o) { p->set_value(std::move(o)); });
  }
};

// A write over two blocks into a full cache: the first block's new slot is
// taken by evicting the oldest slot, which holds the second block and was
// already chosen as where the second block is now. Each block's data must
// stay its own.
TEST_F(WbRaceTest, AMultiBlockWriteThatEvictsItsOwnNextBlockKeepsEachBlockWhereItBelongs) {
  auto c = Open(16 * kBlock);  // 16 slots
  c->Observe("fh1", kV1);
  // Block 1 first: the oldest in probation, so the first victim.
  for (uint64_t b = 1; b <= 16; ++b) FillFromServer(*c, "fh1", b * kBlock, Pattern(kBlock, static_cast<char>('a' + b)));
  ASSERT_EQ(c->Stats().slots_used, 16u);
  const std::string data = Pattern(2 * kBlock, 'W');
  std::promise<WbOutcome> p;
  WbAsync(*c, "fh1", 0, data, &p);
  auto o = p.get_future().get();
  ASSERT_EQ(o.kind, WbOutcome::kStored);
  const std::string got = Collected(*c, "fh1", 0, 2 * kBlock);
  EXPECT_TRUE(got.substr(0, kBlock) == data.substr(0, kBlock)) << "block 0's dirty data is not what was written at 0";
  EXPECT_TRUE(got.substr(kBlock) == data.substr(kBlock)) << "block 1's dirty data is missing";
  auto r0 = c->Read("fh1", 0, kBlock);
  if (r0) {
    EXPECT_TRUE(*r0 == data.substr(0, kBlock)) << "block 0 serves other bytes";
  }
}

// A drop while a write-back write's pages go to a slot it holds (one just
// allocated for it, or, in place, the block's clean slot), then another
// file's fill: an online drop (mpnfsctl cache drop), another client's change
// seen (Observe with a new version), or the file gone from the server
// (Drop). The slot is not lent to the other file while the write holds it,
// and the write is either stored whole or refused. (Allocate never hands out
// a pinned slot. Were it to, DropAll is the case that shows it: through
// Observe and Drop the writer thread writes the fill after the write.)
enum class DropKind { kAll, kChanged, kGone };

// DropAsOf: only what was unflushed when the stamp was taken goes;
// a block written since stays (its writer was not asked); a flush since
// changes nothing; a file with nothing asked about left is "nothing".
TEST_F(WriteBackTest, DropAsOfKeepsOnlyTheBlocksWrittenSinceItsStamp) {
  auto c = OpenWb();
  ASSERT_EQ(Wb(*c, "fh1", 0, Pattern(8192, 'a')).kind, WbOutcome::kStored);
  uint64_t stamp = 0;
  ASSERT_EQ(c->DirtyWriters("fh1", &stamp).size(), 1u);
  ASSERT_EQ(Wb(*c, "fh1", kBlock, Pattern(4096, 'b')).kind, WbOutcome::kStored);  // (another block)
  EXPECT_EQ(c->DropAsOf("fh1", stamp), BlockCache::DropResult::kPartial);
  EXPECT_EQ(c->Stats().dirty_bytes, 4096u) << "the block written since the stamp must stay, and only it";
  // A flush since the stamp: what is left is still what was asked about.
  ASSERT_EQ(Wb(*c, "fh1", 0, Pattern(8192, 'c')).kind, WbOutcome::kStored);
  ASSERT_EQ(c->DirtyWriters("fh1", &stamp).size(), 1u);
  c->Flushed(c->CollectDirty(4096, "fh1", std::chrono::steady_clock::now()));
  ASSERT_GT(c->Stats().dirty_bytes, 0u);
  EXPECT_EQ(c->DropAsOf("fh1", stamp), BlockCache::DropResult::kDropped);
  EXPECT_EQ(c->Stats().dirty_bytes, 0u);
  EXPECT_EQ(c->DropAsOf("fh1", stamp), BlockCache::DropResult::kNothing);
  EXPECT_EQ(c->DropAsOf("never-cached", 0), BlockCache::DropResult::kNothing);
  // Only blocks written since the stamp: nothing asked about is left.
  ASSERT_EQ(Wb(*c, "fh2", 0, Pattern(4096, 'd')).kind, WbOutcome::kStored);
  ASSERT_TRUE(c->DirtyWriters("fh2", &stamp).size() == 1u);
  ASSERT_EQ(Wb(*c, "fh2", 0, Pattern(4096, 'e')).kind, WbOutcome::kStored);
  EXPECT_EQ(c->DropAsOf("fh2", stamp), BlockCache::DropResult::kNothing);
  EXPECT_EQ(c->Stats().dirty_bytes, 4096u);
}

// Dirty pages whose checksums cannot be read back from their file
// (crc_store.h) are reported as not collected, and stay dirty; once the
// file reads again they are collected whole.
TEST_F(WbRaceTest, DirtyPagesWhoseChecksumsCannotBeReadAreReportedAndKept) {
  paged_ = true;  // checksums of 2 of the 16 slots in RAM
  index_per_page_ = 2;
  GateDisk disk;
  auto c = Open(1 << 20, &disk);
  for (int i = 0; i < 16; ++i) {
    const std::string fh = "fh" + std::to_string(i);
    c->Observe(fh, kV1);
    ASSERT_EQ(Wb(*c, fh, 0, Pattern(kBlock, static_cast<char>('a' + i))).kind, WbOutcome::kStored);
  }
  c->Quiesce();
  ASSERT_GT(c->Stats().checksum_writes, 0u);
  ASSERT_LT(c->Stats().checksum_ram_bytes, 16u * (kBlock / 4096 * 4));  // some frames only in the file
  disk.fail_crc_reads = 1;  // one frame cannot be read back
  bool failed = false;
  auto runs = c->CollectDirty(UINT64_MAX, "", std::chrono::steady_clock::now(), nullptr, &failed);
  EXPECT_TRUE(failed);
  EXPECT_EQ(disk.fail_crc_reads, 0);
  // The other blocks are collected all the same (one unreadable frame must
  // not hold up the rest of the flush).
  EXPECT_EQ(runs.size(), 15u);
  EXPECT_EQ(c->Stats().dirty_blocks, 16u);
  runs = c->CollectDirty(UINT64_MAX, "", std::chrono::steady_clock::now(), nullptr, &failed);
  EXPECT_FALSE(failed);
  ASSERT_EQ(runs.size(), 16u);
  for (const auto& r : runs) {
    EXPECT_EQ(r.data, Pattern(kBlock, static_cast<char>('a' + std::stoi(r.fh.substr(2))))) << r.fh;
  }
  EXPECT_EQ(c->Stats().checksum_failures, 0u);
}

// The paged run of this suite (meson test block_cache_paged) does keep
// the checksums out of RAM.
TEST_F(BlockCacheTest, ThePagedRunReadsChecksumsBack) {
  if (!getenv("MPNFS_TEST_CRC_PAGED")) GTEST_SKIP() << "only in the paged run";
  auto c = Open();
  for (int i = 0; i < 16; ++i) {
    const std::string fh = "p" + std::to_string(i);
    c->Observe(fh, kV1);
    FillFromServer(*c, fh, 0, Pattern(kBlock, 'p'));
  }
  for (int i = 0; i < 16; ++i) EXPECT_TRUE(c->Read("p" + std::to_string(i), 0, kBlock).has_value());
  EXPECT_GT(c->Stats().checksum_reads, 0u);
}

class WbDropRaceTest : public WbRaceTest, public ::testing::WithParamInterface<std::tuple<DropKind, bool>> {};

TEST_P(WbDropRaceTest, ADropDuringAWriteBackWriteNeverLendsItsSlotToAnotherFile) {
  const auto [kind, in_place] = GetParam();
  GateDisk disk;
  auto c = Open(16 * kBlock, &disk);
  c->Observe("fhA", kV1);
  c->Observe("fhB", kV1);
  if (in_place) FillFromServer(*c, "fhA", 0, Pattern(kBlock, 'a'));
  const std::string a = Pattern(3 * 4096, 'A');
  disk.Arm(a.size());
  std::promise<WbOutcome> p;
  WbAsync(*c, "fhA", 0, a, &p);
  disk.AwaitHeld();
  switch (kind) {
    case DropKind::kAll: c->DropAll(); break;
    case DropKind::kChanged: c->Observe("fhA", kV2); break;
    case DropKind::kGone: c->Drop("fhA"); break;
  }
  const std::string b = Pattern(kBlock, 'B');
  uint64_t t = c->ReadStart("fhB");
  c->Fill("fhB", t, 0, b.data(), b.size());
  disk.Release();
  auto o = p.get_future().get();
  c->Quiesce();
  auto runs_b = c->CollectDirty(UINT64_MAX, "fhB", std::chrono::steady_clock::now());
  EXPECT_TRUE(runs_b.empty()) << "B has " << runs_b.size() << " dirty run(s): A's write";
  if (o.kind == WbOutcome::kStored) {
    EXPECT_TRUE(Collected(*c, "fhA", 0, a.size()) == a) << "A was stored but its dirty pages are not A's";
  }
  auto rb = c->Read("fhB", 0, 4096);
  ASSERT_TRUE(rb.has_value()) << "B's fill was lost";
  EXPECT_TRUE(*rb == b.substr(0, 4096)) << "B serves A's bytes";
}
INSTANTIATE_TEST_SUITE_P(AllChangedOrGone, WbDropRaceTest,
                         ::testing::Combine(::testing::Values(DropKind::kAll, DropKind::kChanged, DropKind::kGone),
                                            ::testing::Bool()));

// An online drop forgets the clean pages of a block with unflushed writes
// and keeps the unflushed ones.
TEST_F(WriteBackTest, DropAllForgetsTheCleanPagesOfADirtyBlock) {
  auto c = OpenWb();
  c->Observe("fh1", kV1);
  const std::string clean = Pattern(kBlock, 'c');
  FillFromServer(*c, "fh1", 0, clean);
  const std::string dirty = Pattern(4096, 'd');
  ASSERT_EQ(Wb(*c, "fh1", 0, dirty).kind, WbOutcome::kStored);
  ASSERT_EQ(c->Read("fh1", 4 * 4096, 4096), clean.substr(4 * 4096, 4096));
  c->DropAll();
  EXPECT_FALSE(c->Read("fh1", 4 * 4096, 4096).has_value()) << "a clean page survived the drop";
  EXPECT_EQ(Collected(*c, "fh1", 0, 4096), dirty) << "the unflushed page was lost";
}

TEST_F(WbRaceTest, DropAllDuringAWriteBackWriteAloneLeavesACoherentCache) {
  GateDisk disk;
  auto c = Open(16 * kBlock, &disk);
  c->Observe("fhA", kV1);
  const std::string a = Pattern(3 * 4096, 'A');
  disk.Arm(a.size());
  std::promise<WbOutcome> p;
  WbAsync(*c, "fhA", 0, a, &p);
  disk.AwaitHeld();
  c->DropAll();
  disk.Release();
  auto o = p.get_future().get();
  c->Quiesce();
  if (o.kind == WbOutcome::kStored) {
    EXPECT_TRUE(Collected(*c, "fhA", 0, a.size()) == a);
  }
}

// An fsync arriving while a commit writes and syncs the records of the
// file's write must wait for that sync (nothing of the file looks pending
// then, yet its records are not durable).
TEST_F(WbRaceTest, AnFsyncDuringACommitsIndexSyncWaitsForIt) {
  GateDisk disk;
  auto c = OpenWithAWriteNotCommitted(disk);
  ASSERT_NE(c, nullptr);
  {
    std::lock_guard l(disk.mu);
    disk.hold_index_sync = true;
  }
  std::promise<bool> first;
  c->Durable("fhA", [&first](bool ok) { first.set_value(ok); });
  disk.AwaitHeld();
  std::atomic<bool> answered{false};
  c->Durable("fhA", [&answered](bool) { answered = true; });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const bool early = answered.load();
  disk.Release();
  EXPECT_TRUE(first.get_future().get());
  EXPECT_FALSE(early) << "fsync answered while the commit's index sync was still pending";
  c->Quiesce();
  EXPECT_TRUE(answered.load());
}

// A dirty page rewritten in place (no record declares it yet) is torn on
// disk while the write runs: readers must keep away. Read misses, the
// overlay of a server read asks for the read again, the flusher waits; none
// may take the torn page for a damaged one (and drop an unflushed write).
TEST_F(WbRaceTest, ReadersKeepAwayFromADirtyPageBeingRewrittenInPlace) {
  GateDisk disk;
  auto c = OpenWithAWriteNotCommitted(disk);  // fhA [0, 8 KiB) = 'a', not committed
  ASSERT_NE(c, nullptr);
  {
    std::lock_guard l(disk.mu);
    disk.tear = true;
  }
  disk.Arm(8192);
  auto w = std::async(std::launch::async, [&] { return Wb(*c, "fhA", 0, Pattern(8192, 'b')).kind; });
  disk.AwaitHeld();  // half of the new data is on disk
  EXPECT_FALSE(c->Read("fhA", 0, 8192).has_value());
  std::string out;
  EXPECT_EQ(c->Overlay("fhA", c->ReadStart("fhA"), 0, std::string(8192, 's'), 8192, &out).kind,
            OverlayResult::kRetry);
  auto flusher = std::async(std::launch::async, [&] { return Collected(*c, "fhA", 0, 8192); });
  const bool waited = flusher.wait_for(std::chrono::milliseconds(100)) == std::future_status::timeout;
  disk.Release();
  EXPECT_EQ(w.get(), WbOutcome::kStored);
  EXPECT_TRUE(waited) << "the flusher read a page being rewritten";
  EXPECT_EQ(flusher.get(), Pattern(8192, 'b'));
  EXPECT_EQ(c->Stats().rewrites_in_place, 1u);
  EXPECT_EQ(c->Stats().checksum_failures, 0u);
  auto got = c->Read("fhA", 0, 8192);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, Pattern(8192, 'b'));
}

// Only the pages being rewritten are kept from readers: the block's other
// dirty pages are served meanwhile (with a flag for the whole block, reads
// of a block under continuous rewrites would retry until EIO).
TEST_F(WbRaceTest, ReadersOfOtherPagesAreServedWhileAPageIsRewrittenInPlace) {
  GateDisk disk;
  auto c = OpenWithAWriteNotCommitted(disk);  // fhA [0, 8 KiB) = 'a'
  ASSERT_NE(c, nullptr);
  {
    std::lock_guard l(disk.mu);
    disk.tear = true;
  }
  disk.Arm(4096);
  auto w = std::async(std::launch::async, [&] { return Wb(*c, "fhA", 0, Pattern(4096, 'b')).kind; });
  disk.AwaitHeld();
  const std::string a1 = Pattern(8192, 'a').substr(4096);  // page 1 of the first write
  auto page1 = c->Read("fhA", 4096, 4096);
  ASSERT_TRUE(page1.has_value());
  EXPECT_TRUE(*page1 == a1);
  EXPECT_FALSE(c->Read("fhA", 0, 4096).has_value());
  std::string out;
  const auto o = c->Overlay("fhA", c->ReadStart("fhA"), 4096, std::string(4096, 's'), 4096, &out);
  EXPECT_EQ(o.kind, OverlayResult::kOk);
  EXPECT_TRUE(out == a1);
  disk.Release();
  EXPECT_EQ(w.get(), WbOutcome::kStored);
  EXPECT_EQ(c->Stats().rewrites_in_place, 1u);
  EXPECT_EQ(c->Stats().checksum_failures, 0u);
}

// A rewrite in place that fails on the cache disk may tear the dirty page
// it covered; the write that page held is lost and fsync must say so:
// Durable() answers false, not only the flush that drops the torn page and
// marks the file's writes lost.
TEST_F(WbRaceTest, AFailedRewriteInPlaceIsReportedToFsync) {
  GateDisk disk;
  auto c = OpenWithAWriteNotCommitted(disk);  // fhA [0, 8 KiB) = 'a'
  ASSERT_NE(c, nullptr);
  {
    std::lock_guard l(disk.mu);
    disk.tear = true;
    disk.fail_torn = true;
  }
  disk.Arm(4096);
  EXPECT_EQ(Wb(*c, "fhA", 100, "XYZ").kind, WbOutcome::kUnavailable);  // sent around the cache
  // What the filesystem does before it sends that write around: a flush of
  // the dirty pages it overlaps (it finds page 0 torn).
  Collected(*c, "fhA", 0, 4096);
  std::promise<bool> d;
  c->Durable("fhA", [&d](bool ok) { d.set_value(ok); });
  EXPECT_FALSE(d.get_future().get()) << "fsync would say the lost write is durable";
  EXPECT_TRUE(c->TakeLost("fhA"));
  EXPECT_TRUE(Collected(*c, "fhA", 4096, 4096) == Pattern(8192, 'a').substr(4096));  // the other page is kept
}

// A reader holding the slot when the write comes: the page is copied, not
// rewritten under it, and the reader gets the data it planned for.
TEST_F(WbRaceTest, ADirtyPageBeingReadIsCopiedNotRewrittenInPlace) {
  GateDisk disk;
  auto c = OpenWithAWriteNotCommitted(disk);
  ASSERT_NE(c, nullptr);
  {
    std::lock_guard l(disk.mu);
    disk.read_armed = true;
  }
  auto flusher = std::async(std::launch::async, [&] { return Collected(*c, "fhA", 0, 8192); });
  {
    std::unique_lock l(disk.mu);
    disk.cv.wait(l, [&] { return disk.read_held; });
  }
  EXPECT_EQ(Wb(*c, "fhA", 0, Pattern(8192, 'b')).kind, WbOutcome::kStored);
  EXPECT_EQ(c->Stats().rewrites_in_place, 0u);
  EXPECT_EQ(c->Stats().copies, 1u);
  {
    std::lock_guard l(disk.mu);
    disk.read_release = true;
    disk.cv.notify_all();
  }
  EXPECT_EQ(flusher.get(), Pattern(8192, 'a'));  // what it planned for, whole
  EXPECT_EQ(c->Stats().checksum_failures, 0u);
  EXPECT_EQ(Collected(*c, "fhA", 0, 8192), Pattern(8192, 'b'));
}

// After a failed data sync, dirty pages the cache can no longer read back
// are not silently dropped: the file's fsync reports them.
TEST_F(WbRaceTest, DirtyPagesLostAfterAFailedDataSyncAreReportedToFsync) {
  GateDisk disk;
  auto c = OpenWithAWriteNotCommitted(disk);
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(FailTheCommit(*c, disk));
  // The data file cannot be read: the flush sends nothing, the pages stay.
  disk.fail_data_read = true;
  EXPECT_TRUE(c->CollectDirty(UINT64_MAX, "", std::chrono::steady_clock::now()).empty());
  disk.fail_data_read = false;
  EXPECT_TRUE(c->TakeLost("fhA")) << "unsendable writes were not reported";
  // The pages read back as something else (a dropped page cache page).
  {
    std::string zeros(1 << 20, '\0');
    const int fd = open((dir_ + "/data").c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(pwrite(fd, zeros.data(), zeros.size(), 0), static_cast<ssize_t>(zeros.size()));
    close(fd);
  }
  EXPECT_TRUE(c->CollectDirty(UINT64_MAX, "", std::chrono::steady_clock::now()).empty());
  EXPECT_TRUE(c->TakeLost("fhA")) << "the lost write was not reported";
  EXPECT_FALSE(c->TakeLost("fhA")) << "reported twice";
  EXPECT_FALSE(c->TakeLost("fhB"));
}

// An index broken by a disk error keeps declaring dirty the pages it
// declared dirty, however they are flushed: a restart would send them
// again. Until it is emptied, nothing may go to the server over them.
TEST_F(WbRaceTest, PagesFlushedUnderABrokenIndexTakeNoWriteAroundTheCacheUntilItIsEmptied) {
  GateDisk disk;
  auto c = OpenWithAWriteNotCommitted(disk);
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(FailTheCommit(*c, disk));  // the index is broken
  disk.fail_index_truncate = disk.fail_index_remove = true;  // ... and cannot be emptied yet
  auto runs = c->CollectDirty(UINT64_MAX, "", std::chrono::steady_clock::now());
  ASSERT_FALSE(runs.empty());
  c->Flushed(runs);  // (the flusher wrote them to the server)
  EXPECT_EQ(c->Stats().dirty_bytes, 0u);
  EXPECT_TRUE(c->StaleClaims("fhA"));
  EXPECT_TRUE(c->StaleClaims(""));
  EXPECT_FALSE(c->StaleClaims("fhB"));
  EXPECT_TRUE(c->HasDirty("fhA", 60000, 10)) << "a write around the cache could be undone by a restart";
  EXPECT_FALSE(c->HasDirty("fhB", 0, 10));
  bool sent = false;
  EXPECT_FALSE(c->Truncating("fhA", [&sent] { sent = true; }));
  EXPECT_FALSE(sent);
  c->EmptyBrokenIndex();
  EXPECT_TRUE(c->StaleClaims("fhA"));
  disk.fail_index_remove = false;  // (it cannot be truncated, but removed)
  c->EmptyBrokenIndex();
  EXPECT_FALSE(c->StaleClaims("fhA")) << "the index was not emptied once it could be";
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/index"));
  EXPECT_FALSE(c->HasDirty("fhA", 0, 8192));
  EXPECT_TRUE(c->Truncating("fhA", [&sent] { sent = true; }));
  EXPECT_TRUE(sent);
  c->TruncateDone("fhA");
}

// A file whose dirty claims were freed (its writes dropped, a truncate)
// by records not yet synced when the index breaks: the broken index may
// still declare them, so the file is fenced too.
TEST_F(WbRaceTest, ClaimsFreedNotYetDurablyWhenTheIndexBreaksAreFencedToo) {
  GateDisk disk;
  auto c = OpenWithAWriteNotCommitted(disk);
  ASSERT_NE(c, nullptr);
  std::promise<bool> d;
  c->Durable("fhA", [&d](bool ok) { d.set_value(ok); });
  ASSERT_TRUE(d.get_future().get());  // the index declares fhA's pages dirty
  uint64_t stamp = 0;
  ASSERT_FALSE(c->DirtyWriters("fhA", &stamp).empty());
  ASSERT_NE(c->DropAsOf("fhA", stamp), BlockCache::DropResult::kNothing);  // freed, in memory
  ASSERT_EQ(Wb(*c, "fhB", 0, Pattern(8192, 'b')).kind, WbOutcome::kStored);
  disk.fail_index_truncate = disk.fail_index_remove = true;
  ASSERT_TRUE(FailTheCommit(*c, disk, "fhB"));  // the free never became durable
  EXPECT_TRUE(c->StaleClaims("fhA")) << "a file the broken index may still declare dirty is not fenced";
  EXPECT_TRUE(c->HasDirty("fhA", 0, 10));
  EXPECT_TRUE(c->StaleClaims("fhB"));
}

// fsx (seed 4105, cache_block=64, write-back) READ BAD DATA: a read that
// starts after Truncating() forgot the file but reaches the server before
// the SETATTR (sent only after the index sync of Truncating's barrier, or
// on another path) brings back the data the truncate cuts. Its reply's
// attributes (the pre-truncate version) make the forgotten file "had" again
// and its Fill is taken; a later partial write beyond the new size then
// merges with that stale page instead of asking for the server's (zeros),
// and the flusher writes the stale bytes back to the server.
TEST_F(WriteBackTest, AReadDuringATruncateNeverFillsWhatTheTruncateCuts) {
  auto c = OpenWb();
  c->Observe("fh1", kV1);
  const std::string old = Pattern(kBlock, 'o');
  ASSERT_EQ(Wb(*c, "fh1", kBlock, old).kind, WbOutcome::kStored);
  c->Flushed(c->CollectDirty(UINT64_MAX, "fh1", std::chrono::steady_clock::now()));
  // The truncate to kBlock + 0x52ad: its flush is done; the cache forgets the
  // file, then the SETATTR leaves (here: at once, or after the index sync).
  std::promise<void> sent;
  ASSERT_TRUE(c->Truncating("fh1", [&sent] { sent.set_value(); }));
  // A read (kernel readahead, or an overlay retry of one) starts now and the
  // server answers it before it executes the SETATTR: old data, old version.
  const uint64_t token = c->ReadStart("fh1");
  c->Observe("fh1", kV1);
  c->Fill("fh1", token, kBlock, old.data(), old.size());
  sent.get_future().get();
  // The SETATTR's reply: our own change.
  const FileVersion truncated{kBlock + 0x52ad, 200, 200};
  c->OwnChange("fh1", kV1, truncated);
  c->TruncateDone("fh1");
  c->Quiesce();
  EXPECT_FALSE(c->Read("fh1", kBlock + 0x5000, 0x2ad).has_value())
      << "a page the truncate cut is served from the cache";
  // A read that started before the SETATTR was answered, answered later: no fill either.
  c->Fill("fh1", token, kBlock, old.data(), old.size());
  c->Quiesce();
  EXPECT_FALSE(c->Read("fh1", kBlock + 0x5000, 0x2ad).has_value());
  // fsx op 56769: a write past the end (the file grows over a hole).
  ASSERT_EQ(Wb(*c, "fh1", 3 * kBlock, Pattern(4096, 'h')).kind, WbOutcome::kStored);
  // fsx op 56785: a write ending inside page 0x16000 (past the new size).
  auto o = Wb(*c, "fh1", kBlock + 0x5800, Pattern(0x133a, 'w'));  // ends at kBlock + 0x6b3a
  EXPECT_EQ(o.kind, WbOutcome::kNeedPages) << "merged with a cached page the truncate cut";
  if (o.kind == WbOutcome::kStored) {
    const std::string page = Collected(*c, "fh1", kBlock + 0x6000, 4096);
    // (The corruption: the rest of the page holds the cut data, not zeros.)
    EXPECT_TRUE(page.substr(0xb3a) == std::string(4096 - 0xb3a, '\0'))
        << "stale bytes after the write: " << (page.substr(0xb3a) == old.substr(0x6b3a, 4096 - 0xb3a) ? "the cut data" : "other");
  }
  // Reads started after the truncate's answer fill as before (the count of
  // truncates in flight went back to zero).
  const std::string now(4096, '\0');
  FillFromServer(*c, "fh1", kBlock + 0x7000, now);
  EXPECT_TRUE(c->Read("fh1", kBlock + 0x7000, 4096).has_value());
  // A second truncate: no fill while it is in flight, fills again once answered
  // (a page below the new size: a read past the end is always a hit).
  c->Flushed(c->CollectDirty(UINT64_MAX, "fh1", std::chrono::steady_clock::now()));
  ASSERT_TRUE(c->Truncating("fh1", [] {}));
  c->Observe("fh1", truncated);
  FillFromServer(*c, "fh1", kBlock + 0x4000, now);
  EXPECT_FALSE(c->Read("fh1", kBlock + 0x4000, 4096).has_value()) << "a fill during a truncate";
  c->TruncateDone("fh1");
  FillFromServer(*c, "fh1", kBlock + 0x4000, now);
  EXPECT_TRUE(c->Read("fh1", kBlock + 0x4000, 4096).has_value()) << "fills stopped after a second truncate";
}

}  // namespace
}  // namespace mpnfs::cache
