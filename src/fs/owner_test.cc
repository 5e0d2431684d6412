// The write-back ownership record (fs/owner.h) against the in-memory server.
#include "fs/owner.h"

#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "nfs/wait.h"
#include "test/fakes/fake_nfs.h"

namespace mpnfs::fs {
namespace {

using mpnfs::testing::FakeNfs;

const std::string kA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const std::string kB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

std::optional<OwnerRecord> Current(FakeNfs& nfs) {
  auto r = ReadOwner(nfs, nfs.root());
  EXPECT_TRUE(r.ok()) << r.error().what;
  return r.ok() ? *r : std::nullopt;
}

TEST(OwnerTest, OfTwoClaimsAtOnceExactlyOneWins) {
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    FakeNfs nfs;
    nfs.Seed(seed);
    nfs.set_reorder(true);  // the two gateways' calls interleave at random
    nfs.set_max_delay_us(300);
    auto a = std::async(std::launch::async, [&] { return ClaimOwner(nfs, nfs.root(), "/ca", kA); });
    auto b = std::async(std::launch::async, [&] { return ClaimOwner(nfs, nfs.root(), "/cb", kB); });
    auto ra = a.get(), rb = b.get();
    ASSERT_TRUE(ra.ok() && rb.ok()) << "seed " << seed;
    ASSERT_NE(ra->has_value(), rb->has_value()) << "seed " << seed << ": exactly one claim wins";
    const std::string& winner = ra->has_value() ? kB : kA;
    const OwnerRecord& seen = ra->has_value() ? **ra : **rb;
    // The loser saw the winner's record, or its still empty beginning.
    EXPECT_TRUE(seen.cache_id == winner || seen.cache_id.empty()) << seen.text;
    auto now = Current(nfs);
    ASSERT_TRUE(now);
    EXPECT_EQ(now->cache_id, winner) << "seed " << seed;
    EXPECT_EQ(now->cache_dir, winner == kA ? "/ca" : "/cb");
  }
}

TEST(OwnerTest, ACacheClaimsItsOwnRecordAgain) {
  FakeNfs nfs;
  auto first = ClaimOwner(nfs, nfs.root(), "/a-much-longer-directory-name-first", kA);
  ASSERT_TRUE(first.ok() && !first->has_value());
  // Again, as after a crash (the record stayed): ours, taken over.
  auto again = ClaimOwner(nfs, nfs.root(), "/ca", kA);
  ASSERT_TRUE(again.ok()) << again.error().what;
  EXPECT_FALSE(again->has_value());
  auto now = Current(nfs);
  ASSERT_TRUE(now);
  EXPECT_EQ(now->cache_dir, "/ca");
  EXPECT_EQ(nfs.Contents(now->fh), now->text) << "no tail of the longer record left";
  auto attr = nfs.Attributes(now->fh);
  ASSERT_TRUE(attr);
  EXPECT_EQ(attr->mode, 0644u);
  EXPECT_EQ(attr->size, now->text.size());
  // Another cache is refused, naming the owner.
  auto other = ClaimOwner(nfs, nfs.root(), "/cb", kB);
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(other->has_value());
  EXPECT_EQ((*other)->cache_dir, "/ca");
  EXPECT_NE(OwnerRefusal(**other, "srv:/x").find("owned by the write-back cache /ca"), std::string::npos);
}

TEST(OwnerTest, AClaimCutShortBeforeItsContentIsFinishedByTheSameCacheOnly) {
  FakeNfs nfs;
  // A crash right after the CREATE: an empty record, the verifier in its times.
  auto made = nfs::Wait<nfs::NewObject>([&](nfs::Cb<nfs::NewObject> cb) {
    nfs.Create(nfs.root(), kOwnerName, nfs::CreateMode::kExclusive, {}, OwnerVerifier(kA), {}, cb);
  });
  ASSERT_TRUE(made.ok());
  auto other = ClaimOwner(nfs, nfs.root(), "/cb", kB);
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(other->has_value()) << "another cache must not take it";
  EXPECT_TRUE((*other)->cache_id.empty());
  EXPECT_NE(OwnerRefusal(**other, "srv:/x").find("being claimed by another write-back cache"),
            std::string::npos);
  auto mine = ClaimOwner(nfs, nfs.root(), "/ca", kA);
  ASSERT_TRUE(mine.ok()) << mine.error().what;
  EXPECT_FALSE(mine->has_value());
  auto now = Current(nfs);
  ASSERT_TRUE(now);
  EXPECT_EQ(now->cache_id, kA);
}

TEST(OwnerTest, ACopyOfTheCacheOnAnotherHostIsRefused) {
  // A cache directory cloned to another machine has the same id; the record
  // names the host that claimed it, and only that host takes it over.
  FakeNfs nfs;
  auto made = nfs::Wait<nfs::NewObject>([&](nfs::Cb<nfs::NewObject> cb) {
    nfs.Create(nfs.root(), kOwnerName, nfs::CreateMode::kUnchecked, {}, 0, {}, cb);
  });
  ASSERT_TRUE(made.ok() && made->fh);
  const std::string text = "host: some-other-host.invalid\ncache_dir: /ca\ncache_id: " + kA + "\n";
  auto bytes = std::make_shared<nfs::Bytes>(text.size());
  std::copy(text.begin(), text.end(), bytes->data());
  auto w = nfs::Wait<nfs::WriteReply>([&](nfs::Cb<nfs::WriteReply> cb) {
    nfs.Write(*made->fh, 0, bytes, 0, text.size(), true, {}, cb);
  });
  ASSERT_TRUE(w.ok());
  auto copy = ClaimOwner(nfs, nfs.root(), "/ca", kA);
  ASSERT_TRUE(copy.ok()) << copy.error().what;
  ASSERT_TRUE(copy->has_value()) << "the same id from another host must not take the export";
  EXPECT_EQ((*copy)->host, "some-other-host.invalid");
  EXPECT_EQ(nfs.Contents(*made->fh), text) << "the record is left as it was";
}

TEST(OwnerTest, AReleasedExportIsClaimedByTheNextCache) {
  FakeNfs nfs;
  ASSERT_TRUE(ClaimOwner(nfs, nfs.root(), "/ca", kA).ok());
  ASSERT_TRUE(ReleaseOwner(nfs, nfs.root(), kA).ok());
  EXPECT_FALSE(Current(nfs));
  auto b = ClaimOwner(nfs, nfs.root(), "/cb", kB);
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(b->has_value());
  EXPECT_EQ(Current(nfs)->cache_id, kB);
}

TEST(OwnerTest, ReleaseLeavesAnotherCachesRecord) {
  // Released by A, claimed by B meanwhile: A's (late or repeated) release
  // must not free the export B holds.
  FakeNfs nfs;
  ASSERT_TRUE(ClaimOwner(nfs, nfs.root(), "/ca", kA).ok());
  ASSERT_TRUE(ReleaseOwner(nfs, nfs.root(), kA).ok());
  auto b = ClaimOwner(nfs, nfs.root(), "/cb", kB);
  ASSERT_TRUE(b.ok() && !b->has_value());
  auto again = ReleaseOwner(nfs, nfs.root(), kA);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().err, EPERM);
  auto now = Current(nfs);
  ASSERT_TRUE(now);
  EXPECT_EQ(now->cache_id, kB);
  EXPECT_TRUE(ReleaseOwner(nfs, nfs.root(), kB).ok());
  EXPECT_FALSE(Current(nfs));
  EXPECT_TRUE(ReleaseOwner(nfs, nfs.root(), kB).ok()) << "nothing to release is fine";
}

}  // namespace
}  // namespace mpnfs::fs
