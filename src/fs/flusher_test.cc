// Flusher (fs/flusher.h) against the fake NFS server and a write-back cache.
#include "fs/flusher.h"

#include <gtest/gtest.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <mutex>
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

  std::shared_ptr<cache::BlockCache> OpenCache(uint32_t dirty_age_s, cache::Disk* disk = nullptr) {
    cache::CacheOptions o;
    o.disk = disk;
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
    nfs::SetAttr sa;
    sa.mode = 0666;  // (writable by the other users of the tests)
    nfs_.Create(nfs_.root(), name, nfs::CreateMode::kUnchecked, sa, 0, engine::Cred{},
                [&got](Result<nfs::NewObject> r) { got.set_value(std::move(r)); });
    auto r = got.get_future().get();
    EXPECT_TRUE(r && r->fh);
    return r && r->fh ? *r->fh : nfs::Fh();
  }
  // Flushes everything while the server loses the first WRITE (answered
  // UNSTABLE, then a restart) before its COMMIT: the flush's result, and
  // the stability of each WRITE the server got.
  Result<Ok> FlushLosingTheFirstWrite(Flusher& flusher, std::vector<bool>* writes) {
    auto flush = std::async(std::launch::async, [&] { return flusher.FlushAll(); });
    const bool stepped = nfs_.WaitPending(1) && nfs_.StepOne();
    if (stepped) nfs_.Restart();
    nfs_.Resume();
    auto r = flush.get();
    EXPECT_TRUE(stepped);
    nfs_.Quiesce();
    for (const auto& h : nfs_.History()) {
      if (h.proc == testing::FakeNfs::Proc::kWrite) writes->push_back(h.stable);
    }
    return r;
  }
  static void Store(cache::BlockCache& c, const nfs::Fh& fh, const std::string& data, uint32_t uid = 0,
                    uint64_t off = 0) {
    c.Observe(fh, cache::FileVersion{});
    cache::WbWrite w;
    w.fh = fh;
    w.off = off;
    w.uid = uid;
    w.gid = uid;
    w.data = data.data();
    w.len = data.size();
    std::promise<cache::WbOutcome> got;
    c.WriteBack(std::move(w), [&got](cache::WbOutcome o) { got.set_value(std::move(o)); });
    EXPECT_EQ(got.get_future().get().kind, cache::WbOutcome::kStored);
  }

  // A server whose COMMIT answers with another verifier than the WRITEs had
  // (as if it restarted between them), and whose WRITEs never answer
  // FILE_SYNC, while `lying` is set; whose WRITEs to
  // `stale_writes` answer ESTALE, unapplied (the file itself still answers
  // GETATTR);
  // and whose GETATTR of `stale_fh` answers ESTALE to root (knfsd squashing
  // root with subtree_check), the export's root answering everyone.
  class LyingNfs : public testing::FakeNfs {
   public:
    std::atomic<bool> lying{false};
    nfs::Fh stale_fh;  // (set before the flusher starts)
    std::atomic<uint64_t> stale_write_calls{0};
    void set_stale_writes(const nfs::Fh& fh) {
      std::lock_guard lock(stale_mu_);
      stale_writes_ = fh;
    }
    void Commit(const nfs::Fh& fh, const nfs::Cred& c, nfs::Cb<nfs::CommitReply> cb) override {
      testing::FakeNfs::Commit(fh, c, [this, cb = std::move(cb)](Result<nfs::CommitReply> r) {
        if (r && lying) r->verf ^= 1;
        cb(std::move(r));
      });
    }
    void Write(const nfs::Fh& fh, uint64_t off, nfs::Buffer buf, size_t buf_off, size_t len, bool stable,
               const nfs::Cred& c, nfs::Cb<nfs::WriteReply> cb) override {
      bool stale;
      {
        std::lock_guard lock(stale_mu_);
        stale = !stale_writes_.empty() && fh == stale_writes_;
      }
      if (stale) {
        stale_write_calls++;
        // (Answered through the server's queue, nothing written.)
        return testing::FakeNfs::Getattr(fh, c, [cb = std::move(cb)](Result<nfs::Attr>) {
          cb(Error::Errno(ESTALE, "stale"));
        });
      }
      testing::FakeNfs::Write(fh, off, std::move(buf), buf_off, len, stable, c,
                              [this, cb = std::move(cb)](Result<nfs::WriteReply> r) {
                                if (r && lying) r->stable = false;  // (nothing is ever durable)
                                cb(std::move(r));
                              });
    }
    void Getattr(const nfs::Fh& fh, const nfs::Cred& c, nfs::Cb<nfs::Attr> cb) override {
      const bool stale = !stale_fh.empty() && fh == stale_fh && c.uid == 0;
      testing::FakeNfs::Getattr(fh, c, [stale, cb = std::move(cb)](Result<nfs::Attr> r) {
        cb(stale ? Result<nfs::Attr>(Error::Errno(ESTALE, "stale to root")) : std::move(r));
      });
    }

   private:
    std::mutex stale_mu_;
    nfs::Fh stale_writes_;
  };

  // Paused: runs the server's calls one by one until the export's root is
  // about to be asked a second time (a question about a stale file, before
  // its last answer). False if that never comes.
  bool StepUntilTheRootIsAskedAgain() {
    int roots = 0;
    while (nfs_.WaitPending(1)) {
      const auto q = nfs_.Queued().front();
      if (q.proc == testing::FakeNfs::Proc::kGetattr && q.fh == nfs_.root() && ++roots == 2) return true;
      if (!nfs_.StepOne(0)) return false;
    }
    return false;
  }
  // A write-back cache holding 8 KiB of `fill` written by `uid` to "f",
  // which is then removed on the server; the server paused and a FlushAll
  // started. Whatever happens to the test, the server resumes before the
  // flush is waited for (a failed ASSERT cannot hang it).
  struct GoneFlush {
    GoneFlush(FlusherTest& t, char fill, uint32_t uid = 0) : nfs(t.nfs_) {
      cache = t.OpenCache(/*dirty_age_s=*/3600);
      if (!cache) return;
      f = t.Create("f");
      Store(*cache, f, std::string(8192, fill), uid);
      t.RemoveOnServer("f");
      nfs.Pause();
      flusher = std::make_unique<Flusher>(nfs, cache, 1 << 20, nfs.root());
      flush = std::async(std::launch::async, [this] { return flusher->FlushAll(); });
    }
    ~GoneFlush() {
      nfs.Resume();
      if (flush.valid()) flush.wait();
    }
    LyingNfs& nfs;
    std::shared_ptr<cache::BlockCache> cache;
    nfs::Fh f;
    std::unique_ptr<Flusher> flusher;
    std::future<Result<Ok>> flush;
  };
  void RemoveOnServer(const std::string& name) {
    std::promise<Result<nfs::Wcc>> rm;
    nfs_.Remove(nfs_.root(), name, engine::Cred{}, [&rm](Result<nfs::Wcc> r) { rm.set_value(std::move(r)); });
    ASSERT_TRUE(static_cast<bool>(rm.get_future().get()));
  }

  std::string dir_;
  LyingNfs nfs_;
};

// A WRITE the server answers short is continued from where it stopped
// (fs/whole_write.h), as the filesystem's writes are: a flush is not
// failed by it.
TEST_F(FlusherTest, AShortWriteIsContinuedNotFailed) {
  auto cache = OpenCache(/*dirty_age_s=*/3600);
  ASSERT_NE(cache, nullptr);
  const nfs::Fh f = Create("f");
  const std::string data(12288, 's');
  Store(*cache, f, data);
  nfs_.set_write_max(5000);
  {
    Flusher flusher(nfs_, cache, 1 << 20, nfs_.root());
    auto r = flusher.FlushAll();
    EXPECT_TRUE(static_cast<bool>(r)) << (r ? "" : r.error().what);
  }
  EXPECT_TRUE(nfs_.StableContents(f) == data);
  EXPECT_EQ(cache->Stats().dirty_bytes, 0u);
  EXPECT_GE(nfs_.stats().Calls(testing::FakeNfs::Proc::kWrite), 3u);
  nfs_.Quiesce();
}

// Each part of a WRITE continued after a short answer has its own
// verifier: the server restarting between two parts lost the first, and
// the COMMIT (with the new verifier) must not make the run clean.
TEST_F(FlusherTest, APartLostBetweenTwoPartsOfAShortWriteIsWrittenAgain) {
  auto cache = OpenCache(/*dirty_age_s=*/3600);
  ASSERT_NE(cache, nullptr);
  const nfs::Fh f = Create("f");
  const std::string data(8192, 'p');
  Store(*cache, f, data);
  nfs_.set_write_max(4096);
  nfs_.Pause();
  Flusher flusher(nfs_, cache, 1 << 20, nfs_.root());
  auto flush = std::async(std::launch::async, [&] { return flusher.FlushAll(); });
  bool stepped = nfs_.WaitPending(1) && nfs_.StepOne();  // the first part, answered UNSTABLE
  if (stepped) nfs_.Restart();                            // ... and lost
  nfs_.Resume();
  auto r = flush.get();
  ASSERT_TRUE(stepped);
  EXPECT_TRUE(static_cast<bool>(r)) << (r ? "" : r.error().what);
  EXPECT_TRUE(nfs_.StableContents(f) == data) << "a part the server lost was taken as committed";
  nfs_.Quiesce();
}

// Data the server lost before its COMMIT (a restart: the verifier
// changed) is written again at once, FILE_SYNC, in the same round, as the
// filesystem's kept writes are (nfs::CommitCovers): not UNSTABLE again
// with another COMMIT, which a server restarting again could lose again.
TEST_F(FlusherTest, DataLostBeforeItsCommitIsWrittenAgainFileSyncAtOnce) {
  auto cache = OpenCache(/*dirty_age_s=*/3600);
  ASSERT_NE(cache, nullptr);
  const nfs::Fh f = Create("f");
  const std::string data(8192, 'v');
  Store(*cache, f, data);
  nfs_.Pause();
  Flusher flusher(nfs_, cache, 1 << 20, nfs_.root());
  std::vector<bool> writes;  // each WRITE's stability
  auto r = FlushLosingTheFirstWrite(flusher, &writes);
  EXPECT_TRUE(static_cast<bool>(r)) << (r ? "" : r.error().what);
  EXPECT_TRUE(nfs_.StableContents(f) == data);
  EXPECT_EQ(writes, (std::vector<bool>{false, true})) << "not written again FILE_SYNC";
  EXPECT_EQ(nfs_.stats().Calls(testing::FakeNfs::Proc::kCommit), 1u) << "a second COMMIT round";
  EXPECT_EQ(cache->Stats().dirty_bytes, 0u);
}

// The FILE_SYNC resend of data a COMMIT did not cover asks the hook too: a
// write of the filesystem's own over those bytes holds it back, and the
// pages stay dirty for a later round (not taken as clean).
TEST_F(FlusherTest, AResendTheHookHoldsBackStaysDirtyForALaterRound) {
  auto cache = OpenCache(/*dirty_age_s=*/3600);
  ASSERT_NE(cache, nullptr);
  const nfs::Fh f = Create("f");
  const std::string data(8192, 'h');
  Store(*cache, f, data);
  std::atomic<int> asked{0};
  nfs_.Pause();
  Flusher flusher(nfs_, cache, 1 << 20, nfs_.root(),
                  [&asked](const std::string&, uint64_t, uint64_t) { return ++asked != 2; });
  std::vector<bool> writes;
  auto r = FlushLosingTheFirstWrite(flusher, &writes);
  EXPECT_TRUE(static_cast<bool>(r)) << (r ? "" : r.error().what);
  EXPECT_EQ(asked, 3) << "the resend was not asked about, or the next round did not come";
  EXPECT_EQ(writes, (std::vector<bool>{false, false})) << "the held-back resend was sent";
  EXPECT_TRUE(nfs_.StableContents(f) == data);
  EXPECT_EQ(cache->Stats().dirty_bytes, 0u);
}

// A cache disk whose data file syncs (which make the index durable), and
// index truncation and removal (which empty it), fail while the flags are
// set.
struct FailingIndexDisk : cache::Disk {
  std::atomic<bool> fail_sync{false}, fail_empty{false};
  struct F : cache::File {
    std::unique_ptr<cache::File> f;
    FailingIndexDisk* d = nullptr;
    bool data = false, index = false;
    bool ReadAt(char* p, size_t n, uint64_t off) override { return f->ReadAt(p, n, off); }
    bool WriteAt(const char* p, size_t n, uint64_t off) override { return f->WriteAt(p, n, off); }
    bool Sync() override { return data && d->fail_sync ? (errno = EIO, false) : f->Sync(); }
    bool Truncate(uint64_t size) override {
      return index && d->fail_empty ? (errno = EIO, false) : f->Truncate(size);
    }
    bool Allocate(uint64_t size) override { return f->Allocate(size); }
    uint64_t Size() override { return f->Size(); }
  };
  Result<std::unique_ptr<cache::File>> Open(const std::string& path, int flags) override {
    auto r = cache::RealDisk().Open(path, flags);
    if (!r) return r;
    auto f = std::make_unique<F>();
    f->f = std::move(*r);
    f->d = this;
    f->data = path.ends_with("/data");
    f->index = path.ends_with("/index");
    return std::unique_ptr<cache::File>(std::move(f));
  }
  bool Exists(const std::string& p) override { return cache::RealDisk().Exists(p); }
  bool Rename(const std::string& a, const std::string& b) override { return cache::RealDisk().Rename(a, b); }
  bool Remove(const std::string& p) override {
    if (fail_empty && p.ends_with("/index")) return errno = EIO, false;
    return cache::RealDisk().Remove(p);
  }
  bool SyncDir(const std::string& dir) override { return cache::RealDisk().SyncDir(dir); }
  uint64_t Allocated(const std::string& p) override { return cache::RealDisk().Allocated(p); }
};

// Pages flushed after the cache disk's index broke are still declared
// unflushed on the disk: a flush of the file (before a write around the
// cache or a truncate) fails while the index cannot be emptied, rather
// than let something be written over them that a restart would undo.
TEST_F(FlusherTest, AFlushFailsWhileABrokenIndexStillDeclaresItsPagesUnflushed) {
  FailingIndexDisk disk;
  auto cache = OpenCache(/*dirty_age_s=*/3600, &disk);
  ASSERT_NE(cache, nullptr);
  const nfs::Fh f = Create("f"), g = Create("g");
  Store(*cache, f, std::string(8192, 'f'));
  Store(*cache, g, std::string(8192, 'g'));
  disk.fail_sync = true;
  std::promise<bool> durable;
  cache->Durable(f, [&durable](bool ok) { durable.set_value(ok); });
  ASSERT_FALSE(durable.get_future().get());  // the index is broken
  disk.fail_sync = false;
  disk.fail_empty = true;
  Flusher flusher(nfs_, cache, 1 << 20, nfs_.root());
  auto flush = [&](const nfs::Fh& fh) {
    std::promise<Result<Ok>> p;
    flusher.Flush(fh, [&p](Result<Ok> r) { p.set_value(std::move(r)); });
    return p.get_future().get();
  };
  auto r = flush(f);
  ASSERT_FALSE(static_cast<bool>(r)) << "a flush said a file may be written over while a restart would undo it";
  EXPECT_EQ(r.error().err, EIO);
  EXPECT_EQ(nfs_.Contents(g), std::string(8192, 'g')) << "the other files are flushed for the index to be emptied";
  disk.fail_empty = false;
  r = flush(f);
  EXPECT_TRUE(static_cast<bool>(r)) << r.error().what;
  EXPECT_FALSE(cache->StaleClaims(""));
  nfs_.Quiesce();
}

// Flush requests that keep coming (fsx under write-back sends one before
// every truncate) must not starve the background rounds: a block dirty for
// longer than dirty_age is flushed while they come.
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
    const uint64_t rounds = nfs_.stats().Calls(testing::FakeNfs::Proc::kCommit);  // (one per round)
    EXPECT_GE(rounds, 1u) << "no round ran: the test shows nothing";
    EXPECT_LE(rounds, 5u) << "rounds that make no progress were repeated at once";
    EXPECT_GT(cache->Stats().dirty_bytes, 0u) << "the lost writes must stay dirty";
    nfs_.lying = false;
    EXPECT_TRUE(static_cast<bool>(flusher.FlushAll()));
  }
  EXPECT_EQ(nfs_.Contents(f), data);
  nfs_.Quiesce();
}

// A background round whose files were all gone from the server (ESTALE:
// their pages are dropped) made progress: the next round does not wait 1 s,
// or files removed by another client would delay the flush of the others
// by a second each.
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

// A flush whose WRITE is answered ESTALE while the server answers ESTALE
// for everything (its exports not loaded yet after a restart, a failover)
// has not lost the file: the writes are kept, and reach it once the server
// answers again.
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
    EXPECT_EQ(r.error().err, EIO) << r.error().what;
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
  RemoveOnServer("gone");
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

// The cache disk, with reads of the data file that fail while asked to.
struct DataReadsFail : cache::Disk {
  std::atomic<bool> fail{false};
  struct F : cache::File {
    std::unique_ptr<cache::File> f;
    DataReadsFail* d;
    bool ReadAt(char* p, size_t n, uint64_t off) override {
      if (d->fail) return errno = EIO, false;
      return f->ReadAt(p, n, off);
    }
    bool WriteAt(const char* p, size_t n, uint64_t off) override { return f->WriteAt(p, n, off); }
    bool Sync() override { return f->Sync(); }
    bool Truncate(uint64_t size) override { return f->Truncate(size); }
    bool Allocate(uint64_t size) override { return f->Allocate(size); }
    uint64_t Size() override { return f->Size(); }
  };
  Result<std::unique_ptr<cache::File>> Open(const std::string& path, int flags) override {
    auto r = cache::RealDisk().Open(path, flags);
    if (!r || path.size() < 5 || path.substr(path.size() - 5) != "/data") return r;
    auto g = std::make_unique<F>();
    g->f = std::move(*r);
    g->d = this;
    return std::unique_ptr<cache::File>(std::move(g));
  }
  bool Exists(const std::string& p) override { return cache::RealDisk().Exists(p); }
  bool Rename(const std::string& a, const std::string& b) override { return cache::RealDisk().Rename(a, b); }
  bool Remove(const std::string& p) override { return cache::RealDisk().Remove(p); }
  bool SyncDir(const std::string& d) override { return cache::RealDisk().SyncDir(d); }
  uint64_t Allocated(const std::string& p) override { return cache::RealDisk().Allocated(p); }
};

// Unflushed pages the cache disk cannot give back are not "all flushed":
// FlushAll fails, or a detach, a truncate or an unmount would go on as if
// they were on the server.
TEST_F(FlusherTest, AFlushThatCannotReadUnflushedPagesFails) {
  DataReadsFail disk;
  auto cache = OpenCache(/*dirty_age_s=*/3600, &disk);
  ASSERT_NE(cache, nullptr);
  const nfs::Fh f = Create("f");
  const std::string data(8192, 'r');
  Store(*cache, f, data);
  {
    Flusher flusher(nfs_, cache, 1 << 20, nfs_.root());
    disk.fail = true;
    EXPECT_FALSE(flusher.FlushAll().ok());
    EXPECT_EQ(cache->Stats().dirty_bytes, data.size());
    disk.fail = false;
    ASSERT_TRUE(flusher.FlushAll().ok());
  }
  EXPECT_EQ(cache->Stats().dirty_bytes, 0u);
  EXPECT_EQ(nfs_.Contents(f), data);
  nfs_.Quiesce();
}

// The question goes as the user who wrote: a server that squashes root and
// checks the path answers ESTALE to root for a live file.
TEST_F(FlusherTest, AFlushAsksAboutAStaleFileAsTheUserWhoWroteIt) {
  auto cache = OpenCache(/*dirty_age_s=*/3600);
  ASSERT_NE(cache, nullptr);
  const nfs::Fh f = Create("f");
  const std::string data(8192, 'u');
  Store(*cache, f, data, /*uid=*/1000);
  nfs_.stale_fh = f;
  nfs_.FailNext(testing::FakeNfs::Proc::kWrite, ESTALE);
  {
    Flusher flusher(nfs_, cache, 1 << 20, nfs_.root());
    ASSERT_FALSE(flusher.FlushAll().ok());
    EXPECT_EQ(cache->Stats().dirty_bytes, data.size()) << "asked as root, a live file looked gone";
    bool asked_as_writer = false;
    for (const auto& c : nfs_.History()) {
      asked_as_writer = asked_as_writer || (c.proc == testing::FakeNfs::Proc::kGetattr && c.fh == f && c.cred.uid == 1000);
    }
    EXPECT_TRUE(asked_as_writer);
    ASSERT_TRUE(flusher.FlushAll().ok());
  }
  EXPECT_EQ(nfs_.Contents(f), data);
  nfs_.Quiesce();
}

// Pages written while the server was being asked, by a user nobody asked
// about, are not dropped with the others: the file is asked about again, as
// that user too, before anything of theirs goes.
TEST_F(FlusherTest, WritesMadeWhileTheServerIsAskedAreNotDroppedWithoutAsking) {
  GoneFlush g(*this, 'b', /*uid=*/2000);
  ASSERT_NE(g.cache, nullptr);
  auto& cache = g.cache;
  const nfs::Fh& f = g.f;
  auto& flush = g.flush;
  // The WRITE (stale), the root, the file (stale): then, before the root
  // is asked again, another user's write.
  ASSERT_TRUE(StepUntilTheRootIsAskedAgain()) << "the server was not asked: the test shows nothing";
  Store(*cache, f, std::string(4096, 'a'), /*uid=*/1000, /*off=*/65536);
  nfs_.Resume();
  auto r = flush.get();
  ASSERT_TRUE(r.ok()) << r.error().what;
  EXPECT_EQ(cache->Stats().dirty_bytes, 0u);
  bool asked_as_later_writer = false;
  for (const auto& c : nfs_.History()) {
    asked_as_later_writer = asked_as_later_writer ||
                            (c.proc == testing::FakeNfs::Proc::kGetattr && c.fh == f && c.cred.uid == 1000);
  }
  EXPECT_TRUE(asked_as_later_writer) << "dropped a write made while the server was asked, without asking";
  nfs_.Quiesce();
}

// A file whose writes are kept (ESTALE the server could not confirm) does
// not fail the background rounds it is in nor hold up the files after it,
// and a flush request does not send it again round after round.
TEST_F(FlusherTest, AFileWhoseWritesAreKeptDoesNotHoldUpTheOthers) {
  auto cache = OpenCache(/*dirty_age_s=*/1);
  ASSERT_NE(cache, nullptr);
  const nfs::Fh kept = Create("a"), other = Create("b");
  ASSERT_LT(kept, other) << "the test needs the kept file's runs first (rounds go in handle order)";
  const std::string kept_data(2 << 20, 'k');  // (more than an age round carries)
  Store(*cache, kept, kept_data);
  const std::string data(8192, 'o');
  Store(*cache, other, data);
  nfs_.set_stale_writes(kept);  // (the file itself answers: kept)
  {
    Flusher flusher(nfs_, cache, 1 << 20, nfs_.root());
    const auto t0 = std::chrono::steady_clock::now();
    while (nfs_.Contents(other) != data && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_EQ(nfs_.Contents(other), data) << "the background rounds never got past the kept file";
    EXPECT_GE(cache->Stats().dirty_bytes, kept_data.size()) << "the kept file's writes were dropped";
    // A flush request sends the kept file's writes once (two WRITEs of
    // 1 MiB), then goes on without it.
    Store(*cache, other, data, 0, 8192);
    const uint64_t before = nfs_.stale_write_calls;
    auto r = flusher.FlushAll();
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().err, EIO);
    EXPECT_GE(nfs_.stale_write_calls - before, 1u) << "the kept file's writes were not sent: the test shows nothing";
    // (Two more if a background round met it meanwhile; without the skip,
    // ten rounds of two.)
    EXPECT_LE(nfs_.stale_write_calls - before, 4u) << "a flush request sent the kept file's writes again and again";
    EXPECT_EQ(nfs_.Contents(other), data + data);
    // The server answers again: the background flushes the kept file too,
    // unasked, once its wait is over.
    nfs_.set_stale_writes("");
    const auto t1 = std::chrono::steady_clock::now();
    while (cache->Stats().dirty_bytes != 0 && std::chrono::steady_clock::now() - t1 < std::chrono::seconds(40)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_EQ(cache->Stats().dirty_bytes, 0u) << "the kept file was left out for good";
  }
  EXPECT_EQ(nfs_.Contents(kept), kept_data);
  nfs_.Quiesce();
}

// A file another question (the filesystem's, at FORGET) dropped while the
// flusher's was going on is not an error: nothing of it is left.
TEST_F(FlusherTest, AFileDroppedWhileTheFlusherAsksIsNotAnError) {
  GoneFlush g(*this, 'd');
  ASSERT_NE(g.cache, nullptr);
  auto& cache = g.cache;
  const nfs::Fh& f = g.f;
  auto& flush = g.flush;
  ASSERT_TRUE(StepUntilTheRootIsAskedAgain()) << "the server was not asked: the test shows nothing";
  cache->Drop(f);
  nfs_.Resume();
  auto r = flush.get();
  EXPECT_TRUE(r.ok()) << r.error().what;
  EXPECT_EQ(cache->Stats().flush_errors, 0u);
  nfs_.Quiesce();
}

// An interrupted flusher sends nothing more, and its thread does not go
// round at once either: with dirty blocks past dirty_age it would
// otherwise spin on rounds that end at once (EINTR), taking a core while
// the process ends. (The process's CPU time: nothing else runs in it.)
TEST_F(FlusherTest, AnInterruptedFlusherDoesNotSpin) {
  auto cache = OpenCache(/*dirty_age_s=*/1);
  ASSERT_NE(cache, nullptr);
  const nfs::Fh f = Create("f");
  Store(*cache, f, std::string(8192, 'i'));
  {
    Flusher flusher(nfs_, cache, 1 << 20, nfs_.root());
    flusher.Interrupt();
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // past dirty_age
    auto cpu = [] {
      timespec t{};
      clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
      return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) / 1e9;
    };
    const double before = cpu();
    std::this_thread::sleep_for(std::chrono::seconds(1));
    const double used = cpu() - before;
    EXPECT_LT(used, 0.05) << "the interrupted flusher took " << used << " s of CPU in 1 s";
    auto r = flusher.FlushAll();
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().err, EINTR);
  }
  EXPECT_EQ(nfs_.stats().Calls(testing::FakeNfs::Proc::kWrite), 0u) << "sent after Interrupt()";
  EXPECT_EQ(cache->Stats().dirty_bytes, 8192u);
  nfs_.Quiesce();
}

// Interrupt() (SIGTERM at unmount) also stops the questions: nothing more
// is sent, and the writes stay.
TEST_F(FlusherTest, InterruptStopsTheQuestionsAboutAGoneFile) {
  GoneFlush g(*this, 'i');
  ASSERT_NE(g.cache, nullptr);
  auto& cache = g.cache;
  auto& flusher = *g.flusher;
  auto& flush = g.flush;
  // The WRITE (stale); then the root's GETATTR waits.
  bool asking = false;
  while (!asking && nfs_.WaitPending(1)) {
    asking = nfs_.Queued().front().proc == testing::FakeNfs::Proc::kGetattr;
    if (!asking) {
      ASSERT_TRUE(nfs_.StepOne(0));
    }
  }
  ASSERT_TRUE(asking) << "the server was never asked: the test shows nothing";
  flusher.Interrupt();
  auto r = flush.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().err, EINTR);
  const uint64_t asked = nfs_.stats().Calls(testing::FakeNfs::Proc::kGetattr);
  nfs_.Resume();
  ASSERT_TRUE(nfs_.Quiesce());
  EXPECT_EQ(nfs_.stats().Calls(testing::FakeNfs::Proc::kGetattr), asked) << "asked on after Interrupt()";
  EXPECT_EQ(cache->Stats().dirty_bytes, 8192u);
}

}  // namespace
}  // namespace mpnfs::fs
