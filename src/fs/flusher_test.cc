// Flusher (fs/flusher.h) against the fake NFS server and a write-back cache.
#include "fs/flusher.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <optional>
#include <thread>
#include <vector>

#include "test/fakes/fake_nfs.h"

namespace mpnfs::fs {
namespace {

class FlusherTest : public ::testing::Test {
 protected:
  FlusherTest() {
    char tmpl[] = "/tmp/mpnfs-flusher-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  ~FlusherTest() override { std::filesystem::remove_all(dir_); }

  std::shared_ptr<cache::BlockCache> OpenCache(uint32_t dirty_age_s) {
    cache::CacheOptions o;
    o.dir = dir_;
    o.size = 16 << 20;
    o.block = 64 << 10;
    o.mode = cache::CacheMode::kWriteBack;
    o.seq_cutoff = 0;
    o.dirty_age_s = dirty_age_s;
    auto c = cache::BlockCache::Open(o);
    EXPECT_TRUE(static_cast<bool>(c));
    return c ? std::shared_ptr<cache::BlockCache>(std::move(*c)) : nullptr;
  }
  nfs::Fh Create(const std::string& name) {
    std::promise<Result<nfs::NewObject>> got;
    nfs_.Create(nfs_.root(), name, nfs::CreateMode::kUnchecked, nfs::SetAttr{}, 0, engine::Cred{},
                [&got](Result<nfs::NewObject> r) { got.set_value(std::move(r)); });
    auto r = got.get_future().get();
    EXPECT_TRUE(r && r->fh);
    return r && r->fh ? *r->fh : nfs::Fh();
  }
  static void Store(cache::BlockCache& c, const nfs::Fh& fh, const std::string& data) {
    c.Observe(fh, cache::FileVersion{});
    cache::WbWrite w;
    w.fh = fh;
    w.data = data.data();
    w.len = data.size();
    std::promise<cache::WbOutcome> got;
    c.WriteBack(std::move(w), [&got](cache::WbOutcome o) { got.set_value(std::move(o)); });
    EXPECT_EQ(got.get_future().get().kind, cache::WbOutcome::kStored);
  }

  // A server whose COMMIT answers with another verifier than the WRITEs had
  // (as if it restarted between them) while `lying` is set.
  class LyingNfs : public testing::FakeNfs {
   public:
    std::atomic<bool> lying{false};
    void Commit(const nfs::Fh& fh, const nfs::Cred& c, nfs::Cb<nfs::CommitReply> cb) override {
      testing::FakeNfs::Commit(fh, c, [this, cb = std::move(cb)](Result<nfs::CommitReply> r) {
        if (r && lying) r->verf ^= 1;
        cb(std::move(r));
      });
    }
  };

  std::string dir_;
  LyingNfs nfs_;
};

// Found by fsx under write-back: a flush request before every truncate kept
// the flusher busy, and a block dirty for longer than dirty_age waited
// (182 s with dirty_age=30). Requests that keep coming must not starve the
// background rounds.
TEST_F(FlusherTest, FlushRequestsThatKeepComingDoNotStarveTheAgeRounds) {
  auto cache = OpenCache(/*dirty_age_s=*/1);
  ASSERT_NE(cache, nullptr);
  const nfs::Fh old = Create("old"), busy = Create("busy");
  const std::string data(8192, 'o');
  Store(*cache, old, data);
  {
    // (The flusher goes first, explicitly: its callbacks use the rest.)
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> served{0};
    std::optional<Flusher> flusher;
    flusher.emplace(nfs_, cache, 1 << 20, nfs_.root());
    // Requests for another file, one after another without a pause, for
    // as long as the test runs (each answered at once: nothing to flush).
    std::function<void()> again = [&] {
      if (stop) return;
      flusher->Flush(busy, [&](Result<Ok>) {
        served++;
        again();
      });
    };
    for (int i = 0; i < 4; ++i) again();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    while (nfs_.Contents(old) != data && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    stop = true;
    EXPECT_GT(served.load(), 100u) << "the requests did not keep the flusher busy: the test shows nothing";
    EXPECT_TRUE(nfs_.Contents(old) == data) << "a block dirty for longer than dirty_age was not flushed";
    EXPECT_TRUE(static_cast<bool>(flusher->FlushAll()));
    flusher.reset();
  }
  nfs_.Quiesce();
}

// A background round that makes nothing clean (every COMMIT says the
// server lost the writes) must not go round again at once: it spun,
// sending WRITEs as fast as the server answered.
TEST_F(FlusherTest, ARoundThatMakesNoProgressIsNotRepeatedAtOnce) {
  auto cache = OpenCache(/*dirty_age_s=*/1);
  ASSERT_NE(cache, nullptr);
  const nfs::Fh f = Create("f");
  const std::string data(8192, 'f');
  Store(*cache, f, data);
  nfs_.lying = true;
  {
    Flusher flusher(nfs_, cache, 1 << 20, nfs_.root());
    // The first age round comes after 1 s; then 3 s of rounds that all fail.
    std::this_thread::sleep_for(std::chrono::seconds(4));
    const uint64_t writes = nfs_.stats().Calls(testing::FakeNfs::Proc::kWrite);
    EXPECT_GE(writes, 1u) << "no round ran: the test shows nothing";
    EXPECT_LE(writes, 10u) << "rounds that make no progress were repeated at once";
    EXPECT_GT(cache->Stats().dirty_bytes, 0u) << "the lost writes must stay dirty";
    nfs_.lying = false;
    EXPECT_TRUE(static_cast<bool>(flusher.FlushAll()));
  }
  EXPECT_EQ(nfs_.Contents(f), data);
  nfs_.Quiesce();
}

// Found by review: a background round whose files were all gone from the
// server (ESTALE: their pages are dropped) counted as making no progress, and
// the next round waited 1 s; files removed by another client then delayed
// the flush of the others by a second each.
TEST_F(FlusherTest, FilesGoneFromTheServerDoNotDelayTheFlushOfOthers) {
  auto cache = OpenCache(/*dirty_age_s=*/1);
  ASSERT_NE(cache, nullptr);
  std::vector<nfs::Fh> gone;
  for (int i = 0; i < 4; ++i) gone.push_back(Create("g" + std::to_string(i)));
  const nfs::Fh kept = Create("k");
  const std::string data(8192, 'k');
  for (const auto& g : gone) {
    ASSERT_LT(g, kept) << "the test needs the gone files' rounds first (rounds go in handle order)";
    Store(*cache, g, std::string(1 << 20, 'g'));  // (one age round each)
  }
  Store(*cache, kept, data);
  for (int i = 0; i < 4; ++i) {
    std::promise<Result<nfs::Wcc>> rm;
    nfs_.Remove(nfs_.root(), "g" + std::to_string(i), engine::Cred{},
                [&rm](Result<nfs::Wcc> r) { rm.set_value(std::move(r)); });
    ASSERT_TRUE(static_cast<bool>(rm.get_future().get()));
  }
  const auto t0 = std::chrono::steady_clock::now();
  {
    Flusher flusher(nfs_, cache, 1 << 20, nfs_.root());
    while (nfs_.Contents(kept) != data && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(15)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const auto took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_EQ(nfs_.Contents(kept), data);
    // (Due after 1 s; four rounds of dropped files before it took 4 s more.)
    EXPECT_LT(took, 3.5) << "the gone files delayed the flush by " << took - 1 << " s";
    // (Clean once the COMMIT's answer is in, after the data reached the server.)
    for (int i = 0; i < 500 && cache->Stats().dirty_bytes != 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(cache->Stats().dirty_bytes, 0u);
  }
  nfs_.Quiesce();
}

// Found by review: a flush whose WRITE was answered ESTALE dropped the
// file's writes, also when the server answered ESTALE for everything (its
// exports not loaded yet after a restart, a failover). The file is still
// there: the writes are kept, and reach it once the server answers again.
TEST_F(FlusherTest, AServerStaleForEverythingDoesNotMakeAFlushDropWrites) {
  auto cache = OpenCache(/*dirty_age_s=*/3600);
  ASSERT_NE(cache, nullptr);
  const nfs::Fh f = Create("f");
  const std::string data(8192, 's');
  Store(*cache, f, data);
  nfs_.set_all_stale(true);
  {
    Flusher flusher(nfs_, cache, 1 << 20, nfs_.root());
    auto r = flusher.FlushAll();
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().err, ESTALE) << r.error().what;
    EXPECT_GE(nfs_.stats().Calls(testing::FakeNfs::Proc::kWrite), 1u) << "nothing was sent: the test shows nothing";
    EXPECT_EQ(cache->Stats().dirty_bytes, data.size()) << "the writes of a file the server still has were dropped";
    nfs_.set_all_stale(false);
    ASSERT_TRUE(flusher.FlushAll().ok());
  }
  EXPECT_EQ(nfs_.Contents(f), data);
  EXPECT_EQ(cache->Stats().dirty_bytes, 0u);
  nfs_.Quiesce();
}

// A WRITE answered ESTALE for a file that still answers keeps its writes
// too (the flush fails; the next one sends them).
TEST_F(FlusherTest, AWriteAnsweredStaleForAFileThatStillAnswersKeepsItsWrites) {
  auto cache = OpenCache(/*dirty_age_s=*/3600);
  ASSERT_NE(cache, nullptr);
  const nfs::Fh f = Create("f");
  const std::string data(8192, 'w');
  Store(*cache, f, data);
  nfs_.FailNext(testing::FakeNfs::Proc::kWrite, ESTALE);
  {
    Flusher flusher(nfs_, cache, 1 << 20, nfs_.root());
    auto r = flusher.FlushAll();
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(cache->Stats().dirty_bytes, data.size()) << "the writes of a file the server still has were dropped";
    ASSERT_TRUE(flusher.FlushAll().ok());
  }
  EXPECT_EQ(nfs_.Contents(f), data);
  nfs_.Quiesce();
}

// A file removed on the server (by another client) loses its writes at the
// flush, unsent again, and the flush of the others goes on.
TEST_F(FlusherTest, AFileRemovedOnTheServerLosesItsWritesAtTheFlush) {
  auto cache = OpenCache(/*dirty_age_s=*/3600);
  ASSERT_NE(cache, nullptr);
  const nfs::Fh gone = Create("gone"), kept = Create("kept");
  Store(*cache, gone, std::string(8192, 'g'));
  Store(*cache, kept, std::string(8192, 'k'));
  std::promise<Result<nfs::Wcc>> rm;
  nfs_.Remove(nfs_.root(), "gone", engine::Cred{}, [&rm](Result<nfs::Wcc> r) { rm.set_value(std::move(r)); });
  ASSERT_TRUE(static_cast<bool>(rm.get_future().get()));
  {
    Flusher flusher(nfs_, cache, 1 << 20, nfs_.root());
    auto r = flusher.FlushAll();
    ASSERT_TRUE(r.ok()) << r.error().what;
    const uint64_t writes = nfs_.stats().Calls(testing::FakeNfs::Proc::kWrite);
    ASSERT_TRUE(flusher.FlushAll().ok());
    EXPECT_EQ(nfs_.stats().Calls(testing::FakeNfs::Proc::kWrite), writes) << "a gone file's writes were sent again";
  }
  EXPECT_EQ(nfs_.Contents(kept), std::string(8192, 'k'));
  EXPECT_EQ(cache->Stats().dirty_bytes, 0u);
  nfs_.Quiesce();
}

}  // namespace
}  // namespace mpnfs::fs
