// Flusher (fs/flusher.h) against the fake NFS server and a write-back cache.
#include "fs/flusher.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <optional>
#include <thread>

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

  std::string dir_;
  testing::FakeNfs nfs_;
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
    flusher.emplace(nfs_, cache, 1 << 20);
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

}  // namespace
}  // namespace mpnfs::fs
