// fs::Locks against an in-memory lock manager (NLM semantics: owners by
// caller_name, oh and svid; ranges split on unlock): owners of different
// mounts exclude each other, release rules follow POSIX, OFD and flock,
// waits retry until granted or interrupted, grace periods are waited out;
// and a randomized model test with fixed seeds checks every answer against
// an oracle that tracks each byte's holders.
#include "fs/locks.h"

#include <fcntl.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

namespace mpnfs::fs {
namespace {

using namespace std::chrono_literals;
namespace n4 = proto::nlm4;

// The server's lock table. Answers inline, on the caller's thread.
const nfs::Fh kHeldFile = "file-handle";

class FakeLockManager final : public nfs::LockClient {
 public:
  struct Held {
    std::string owner;  // oh + svid
    bool exclusive;
    uint64_t start, end;  // [start, end), end UINT64_MAX: to the end
  };

  // Each answer is given after the table's lock is let go (a callback may
  // make the next call at once, as on an engine thread).
  void Test(const nfs::Fh& fh, const nfs::LockOwner& o, const nfs::LockRange& r, const nfs::Cred&,
            nfs::Cb<n4::TestRes> cb) override {
    cb(DoTest(fh, o, r));
  }
  void Lock(const nfs::Fh& fh, const nfs::LockOwner& o, const nfs::LockRange& r, bool reclaim, const nfs::Cred&,
            nfs::Cb<n4::Stat> cb) override {
    {
      MutexLock lock(mu_);
      if (hold_locks_) {
        // Taken in, done later: as a LOCK that reaches the server late.
        held_calls_.push_back([this, fh, o, r, reclaim, cb] { cb(DoLock(fh, o, r, reclaim)); });
        return;
      }
    }
    cb(DoLock(fh, o, r, reclaim));
  }
  void Unlock(const nfs::Fh& fh, const nfs::LockOwner& o, uint64_t off, uint64_t len, const nfs::Cred&,
              nfs::Cb<n4::Stat> cb) override {
    cb(DoUnlock(fh, o, off, len));
  }

  size_t HeldCount(const nfs::Fh& fh) {
    MutexLock lock(mu_);
    return table_[fh].size();
  }
  void Grace(int n) {
    MutexLock lock(mu_);
    grace_ = n;
  }
  // The server restarts: it forgets every lock, and answers only reclaims
  // until EndGrace (`grace`), or none (a grace period that passed unseen).
  // `meanwhile`: a lock another host took before this client looked again.
  void Restart(bool grace, std::optional<std::pair<nfs::LockOwner, nfs::LockRange>> meanwhile = {}) {
    MutexLock lock(mu_);
    table_.clear();
    in_grace_ = grace;
    if (meanwhile) {
      const auto& [o, r] = *meanwhile;
      table_[kHeldFile].push_back(Held{Key(o), r.exclusive, r.offset, End(r)});
    }
  }
  void EndGrace() {
    MutexLock lock(mu_);
    in_grace_ = false;
  }
  int reclaims() {
    MutexLock lock(mu_);
    return reclaims_;
  }
  int test_calls() {
    MutexLock lock(mu_);
    return test_calls_;
  }
  // LOCK calls are kept (not done) until LetLocksIn().
  void HoldLocks() {
    MutexLock lock(mu_);
    hold_locks_ = true;
  }
  size_t LocksHeldBack() {
    MutexLock lock(mu_);
    return held_calls_.size();
  }
  void LetLocksIn() {
    std::vector<std::function<void()>> calls;
    {
      MutexLock lock(mu_);
      hold_locks_ = false;
      calls.swap(held_calls_);
    }
    for (auto& c : calls) c();
  }
  // A denial names no holder (as Linux's lockd answers TEST).
  void NameNoHolder() {
    MutexLock lock(mu_);
    name_holder_ = false;
  }
  // What `o` holds of byte `b`: 0 nothing, 1 a shared lock, 2 an exclusive one.
  int HoldsByte(const nfs::Fh& fh, const nfs::LockOwner& o, uint64_t b) {
    MutexLock lock(mu_);
    for (const Held& h : table_[fh]) {
      if (h.owner == Key(o) && h.start <= b && b < h.end) return h.exclusive ? 2 : 1;
    }
    return 0;
  }
  int lock_calls() {
    MutexLock lock(mu_);
    return lock_calls_;
  }
  int unlock_calls() {
    MutexLock lock(mu_);
    return unlock_calls_;
  }

 private:
  n4::TestRes DoTest(const nfs::Fh& fh, const nfs::LockOwner& o, const nfs::LockRange& r) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    ++calls_;
    ++test_calls_;
    n4::TestRes res;
    if (grace_ > 0 || in_grace_) {
      if (grace_ > 0) --grace_;
      res.stat = n4::Stat::kDeniedGracePeriod;
      return res;
    }
    if (const Held* h = ConflictLocked(fh, Key(o), r)) {
      res.stat = n4::Stat::kDenied;
      res.holder = n4::Holder{h->exclusive, 0, name_holder_ ? h->owner.substr(0, h->owner.size() - 4) : "",
                              h->start, h->end == UINT64_MAX ? 0 : h->end - h->start};
    }
    return res;
  }
  // A reclaim is granted only in a grace period (as NFS-Ganesha does).
  n4::Stat DoLock(const nfs::Fh& fh, const nfs::LockOwner& o, const nfs::LockRange& r, bool reclaim)
      EXCLUDES(mu_) {
    MutexLock lock(mu_);
    ++calls_;
    ++lock_calls_;
    if (reclaim) {
      ++reclaims_;
      if (!in_grace_) return n4::Stat::kDeniedGracePeriod;
    } else if (grace_ > 0 || in_grace_) {
      if (grace_ > 0) --grace_;
      return n4::Stat::kDeniedGracePeriod;
    }
    if (ConflictLocked(fh, Key(o), r)) return n4::Stat::kDenied;
    RemoveLocked(fh, Key(o), r.offset, End(r));
    table_[fh].push_back(Held{Key(o), r.exclusive, r.offset, End(r)});
    return n4::Stat::kGranted;
  }
  n4::Stat DoUnlock(const nfs::Fh& fh, const nfs::LockOwner& o, uint64_t off, uint64_t len) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    ++calls_;
    ++unlock_calls_;
    if (in_grace_) return n4::Stat::kDeniedGracePeriod;
    RemoveLocked(fh, Key(o), off, len == 0 ? UINT64_MAX : off + len);
    return n4::Stat::kGranted;
  }

  static std::string Key(const nfs::LockOwner& o) {
    std::string k = o.oh;
    for (int s = 24; s >= 0; s -= 8) k.push_back(static_cast<char>(o.svid >> s));
    return k;
  }
  static uint64_t End(const nfs::LockRange& r) { return r.length == 0 ? UINT64_MAX : r.offset + r.length; }
  const Held* ConflictLocked(const nfs::Fh& fh, const std::string& owner, const nfs::LockRange& r)
      REQUIRES(mu_) {
    for (const Held& h : table_[fh]) {
      if (h.owner != owner && h.start < End(r) && r.offset < h.end && (h.exclusive || r.exclusive)) return &h;
    }
    return nullptr;
  }
  // Takes [start, end) out of the owner's locks (splitting them).
  void RemoveLocked(const nfs::Fh& fh, const std::string& owner, uint64_t start, uint64_t end) REQUIRES(mu_) {
    std::vector<Held> out;
    for (const Held& h : table_[fh]) {
      if (h.owner != owner || h.end <= start || end <= h.start) {
        out.push_back(h);
        continue;
      }
      if (h.start < start) out.push_back(Held{h.owner, h.exclusive, h.start, start});
      if (end < h.end) out.push_back(Held{h.owner, h.exclusive, end, h.end});
    }
    table_[fh] = std::move(out);
  }

  Mutex mu_;
  std::map<nfs::Fh, std::vector<Held>> table_ GUARDED_BY(mu_);
  int grace_ GUARDED_BY(mu_) = 0;
  bool in_grace_ GUARDED_BY(mu_) = false;
  int reclaims_ GUARDED_BY(mu_) = 0;
  int test_calls_ GUARDED_BY(mu_) = 0;
  bool name_holder_ GUARDED_BY(mu_) = true;
  bool hold_locks_ GUARDED_BY(mu_) = false;
  std::vector<std::function<void()>> held_calls_ GUARDED_BY(mu_);
  int calls_ GUARDED_BY(mu_) = 0;
  int lock_calls_ GUARDED_BY(mu_) = 0;
  int unlock_calls_ GUARDED_BY(mu_) = 0;
};

std::array<char, 8> Instance(char c) {
  std::array<char, 8> a;
  a.fill(c);
  return a;
}

template <class T, class Start>
Result<T> Wait(Start start) {
  auto p = std::make_shared<std::promise<Result<T>>>();
  auto f = p->get_future();
  start([p](Result<T> r) { p->set_value(std::move(r)); });
  if (f.wait_for(30s) != std::future_status::ready) return Error::Errno(ETIMEDOUT, "callback never ran");
  return f.get();
}

const nfs::Fh kFile = kHeldFile;

bool WaitUntil(const std::function<bool()>& done) {
  for (auto until = std::chrono::steady_clock::now() + 20s; std::chrono::steady_clock::now() < until;) {
    if (done()) return true;
    std::this_thread::sleep_for(1ms);
  }
  return done();
}
const int kA = 1, kB = 2;  // open files (only their addresses count)

Locks::Request Req(uint64_t owner, int type, uint64_t start = 0, uint64_t len = 0, uint32_t pid = 100) {
  return Locks::Request{owner, pid, type, start, len};
}

Result<Ok> Set(Locks& l, const void* file, const Locks::Request& r, bool wait = false,
               std::function<bool()> interrupted = {}) {
  return Wait<Ok>([&](auto cb) { l.Set(kFile, file, r, wait, interrupted, {}, cb); });
}

TEST(Locks, OwnersOfTwoMountsExcludeEachOtherAndGetlkNamesTheHolder) {
  FakeLockManager server;
  Locks a(server, Instance('a')), b(server, Instance('b'));
  // The same 64-bit owner id on two mounts is two owners.
  ASSERT_TRUE(Set(a, &kA, Req(7, F_WRLCK, 0, 10, 4242)).ok());
  auto denied = Set(b, &kB, Req(7, F_WRLCK, 5, 10));
  ASSERT_FALSE(denied.ok());
  EXPECT_EQ(denied.error().err, EAGAIN);
  EXPECT_TRUE(Set(b, &kB, Req(7, F_WRLCK, 10, 10)).ok()) << "bytes 10.. are free";
  // F_GETLK: this mount's own holder by its pid, another's by its svid.
  auto mine = Wait<std::optional<Locks::Conflict>>([&](auto cb) { a.Get(kFile, Req(8, F_RDLCK, 0, 1), {}, cb); });
  ASSERT_TRUE(mine.ok() && *mine);
  EXPECT_EQ((*mine)->pid, 4242);
  EXPECT_EQ((*mine)->type, F_WRLCK);
  EXPECT_EQ((*mine)->length, 10u);
  auto theirs = Wait<std::optional<Locks::Conflict>>([&](auto cb) { b.Get(kFile, Req(9, F_RDLCK, 0, 1), {}, cb); });
  ASSERT_TRUE(theirs.ok() && *theirs);
  EXPECT_EQ((*theirs)->pid, 0) << "the fake reports svid 0 for another host's holder";
  auto none = Wait<std::optional<Locks::Conflict>>([&](auto cb) { b.Get(kFile, Req(9, F_WRLCK, 20, 5), {}, cb); });
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(*none);
}

TEST(Locks, ACloseByTheOwnerReleasesAllItsLocksAndTheLastCloseOfAFileItsOwnOnes) {
  FakeLockManager server;
  Locks a(server, Instance('a'));
  ASSERT_TRUE(Set(a, &kA, Req(1, F_WRLCK, 0, 10)).ok());   // a process, through file A
  ASSERT_TRUE(Set(a, &kB, Req(1, F_WRLCK, 20, 10)).ok());  // the same process, through file B
  ASSERT_TRUE(Set(a, &kB, Req(2, F_RDLCK, 40, 10)).ok());  // an OFD/flock owner of file B
  EXPECT_TRUE(a.MayHold(kFile, 1));
  EXPECT_TRUE(a.MayHoldThrough(kFile, &kA));
  // The last close of file A: owner 1 locked through B too, so it stays.
  ASSERT_TRUE(Wait<Ok>([&](auto cb) { a.ReleaseFile(kFile, &kA, {}, cb); }).ok());
  EXPECT_EQ(server.HeldCount(kFile), 3u);
  // Owner 1 closes (flush): all of its locks go.
  ASSERT_TRUE(Wait<Ok>([&](auto cb) { a.ReleaseOwner(kFile, 1, {}, cb); }).ok());
  EXPECT_EQ(server.HeldCount(kFile), 1u);
  EXPECT_FALSE(a.MayHold(kFile, 1));
  // The last close of file B: owner 2 locked only through it.
  ASSERT_TRUE(Wait<Ok>([&](auto cb) { a.ReleaseFile(kFile, &kB, {}, cb); }).ok());
  EXPECT_EQ(server.HeldCount(kFile), 0u);
  EXPECT_FALSE(a.MayHold());
  // A close with nothing recorded sends nothing.
  const int unlocks = server.unlock_calls();
  ASSERT_TRUE(Wait<Ok>([&](auto cb) { a.ReleaseOwner(kFile, 1, {}, cb); }).ok());
  EXPECT_EQ(server.unlock_calls(), unlocks);
}

TEST(Locks, AWaitIsGrantedWhenTheHolderReleasesOrEndsWithEintr) {
  FakeLockManager server;
  Locks a(server, Instance('a')), b(server, Instance('b'));
  ASSERT_TRUE(Set(a, &kA, Req(1, F_WRLCK)).ok());
  std::promise<Result<Ok>> got;
  b.Set(kFile, &kB, Req(1, F_WRLCK), true, {}, {}, [&](Result<Ok> r) { got.set_value(r); });
  auto f = got.get_future();
  EXPECT_EQ(f.wait_for(300ms), std::future_status::timeout) << "granted while held";
  ASSERT_TRUE(Wait<Ok>([&](auto cb) { a.ReleaseOwner(kFile, 1, {}, cb); }).ok());
  ASSERT_EQ(f.wait_for(5s), std::future_status::ready);
  EXPECT_TRUE(f.get().ok());
  // Interrupted: EINTR, and it stops asking.
  std::atomic<bool> stop{false};
  std::promise<Result<Ok>> got2;
  a.Set(kFile, &kA, Req(2, F_WRLCK), true, [&] { return stop.load(); }, {},
        [&](Result<Ok> r) { got2.set_value(r); });
  std::this_thread::sleep_for(100ms);
  stop = true;
  auto f2 = got2.get_future();
  ASSERT_EQ(f2.wait_for(5s), std::future_status::ready);
  auto r2 = f2.get();
  ASSERT_FALSE(r2.ok());
  EXPECT_EQ(r2.error().err, EINTR);
  const int calls = server.lock_calls();
  std::this_thread::sleep_for(Locks::kMaxPoll + 200ms);
  EXPECT_EQ(server.lock_calls(), calls);
}

TEST(Locks, TheGracePeriodIsWaitedOutEvenWithoutF_SETLKW) {
  FakeLockManager server;
  Locks a(server, Instance('a'));
  server.Grace(2);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(Set(a, &kA, Req(1, F_WRLCK)).ok());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 2 * Locks::kGracePoll);
  EXPECT_EQ(server.lock_calls(), 3);
}

TEST(Locks, NoLockIsAskedForUntilTheStateFileSaysTheMountMayHoldOneAndItIsToldWhenNoneIsHeld) {
  FakeLockManager server;
  Mutex mu;
  std::vector<bool> marks;
  bool fail = true;
  CondVar changed;
  Locks a(server, Instance('a'), [&](bool held) -> Result<Ok> {
    MutexLock lock(mu);
    marks.push_back(held);
    changed.SignalAll();
    if (held && fail) return Error::Errno(EROFS, "state file: read-only");
    return Ok{};
  });
  auto marked = [&](std::vector<bool> want) {
    MutexLock lock(mu);
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (marks != want && std::chrono::steady_clock::now() < deadline) changed.WaitUntil(mu, deadline);
    return marks == want;
  };
  auto r = Set(a, &kA, Req(1, F_WRLCK));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().err, ENOLCK);
  EXPECT_EQ(server.lock_calls(), 0);
  {
    MutexLock lock(mu);
    fail = false;
  }
  ASSERT_TRUE(Set(a, &kA, Req(1, F_WRLCK)).ok());
  ASSERT_TRUE(Set(a, &kA, Req(1, F_RDLCK, 100, 1)).ok());
  EXPECT_TRUE(marked({true, true})) << "asked once more after its failure, then not while held";
  // Refused for an owner with nothing granted: forgotten, nothing to hold.
  Locks b(server, Instance('b'), [&](bool held) -> Result<Ok> {
    MutexLock lock(mu);
    marks.push_back(held);
    changed.SignalAll();
    return Ok{};
  });
  ASSERT_FALSE(Set(b, &kB, Req(1, F_WRLCK)).ok());
  EXPECT_FALSE(b.MayHold());
  EXPECT_TRUE(marked({true, true, true, false}));
  // Everything released: the mount holds nothing.
  ASSERT_TRUE(Wait<Ok>([&](auto cb) { a.ReleaseOwner(kFile, 1, {}, cb); }).ok());
  EXPECT_TRUE(marked({true, true, true, false, false}));
}

// A LOCK that got no answer may have been granted: kept, so that the close
// still unlocks. The end of the mount fails waits at their next try and
// gives back a lock granted after it.
class SilentOnce final : public nfs::LockClient {
 public:
  explicit SilentOnce(nfs::LockClient& inner) : inner_(inner) {}
  void Test(const nfs::Fh& fh, const nfs::LockOwner& o, const nfs::LockRange& r, const nfs::Cred& c,
            nfs::Cb<n4::TestRes> cb) override {
    inner_.Test(fh, o, r, c, std::move(cb));
  }
  void Lock(const nfs::Fh& fh, const nfs::LockOwner& o, const nfs::LockRange& r, bool reclaim, const nfs::Cred& c,
            nfs::Cb<n4::Stat> cb) override {
    if (silent_.exchange(false)) {  // executed, its reply lost
      return inner_.Lock(fh, o, r, reclaim, c, [cb](Result<n4::Stat>) { cb(Error::Errno(ETIMEDOUT, "no reply")); });
    }
    inner_.Lock(fh, o, r, reclaim, c, std::move(cb));
  }
  void Unlock(const nfs::Fh& fh, const nfs::LockOwner& o, uint64_t off, uint64_t len, const nfs::Cred& c,
              nfs::Cb<n4::Stat> cb) override {
    inner_.Unlock(fh, o, off, len, c, std::move(cb));
  }
  std::atomic<bool> silent_{true};

 private:
  nfs::LockClient& inner_;
};

TEST(Locks, ALockLeftUnansweredIsStillUnlockedAtTheClose) {
  FakeLockManager server;
  SilentOnce net(server);
  Locks a(net, Instance('a'));
  EXPECT_FALSE(Set(a, &kA, Req(1, F_WRLCK)).ok());
  EXPECT_EQ(server.HeldCount(kFile), 1u) << "the server granted it";
  EXPECT_TRUE(a.MayHold(kFile, 1));
  ASSERT_TRUE(Wait<Ok>([&](auto cb) { a.ReleaseOwner(kFile, 1, {}, cb); }).ok());
  EXPECT_EQ(server.HeldCount(kFile), 0u);
}

TEST(Locks, TheEndOfTheMountEndsWaitsAndRefusesNewLocks) {
  FakeLockManager server;
  Locks a(server, Instance('a')), b(server, Instance('b'));
  ASSERT_TRUE(Set(a, &kA, Req(1, F_WRLCK)).ok());
  std::promise<Result<Ok>> got;
  b.Set(kFile, &kB, Req(1, F_WRLCK), true, {}, {}, [&](Result<Ok> r) { got.set_value(r); });
  b.Shutdown();
  auto f = got.get_future();
  ASSERT_EQ(f.wait_for(5s), std::future_status::ready);
  auto r = f.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().err, ESHUTDOWN);
  auto late = Set(b, &kB, Req(2, F_WRLCK, 100, 1));
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.error().err, ESHUTDOWN);
  EXPECT_FALSE(b.MayHold());
  EXPECT_EQ(server.HeldCount(kFile), 1u) << "only a's lock";
}

// Randomized: three mounts, three owners each, one file of 32 bytes; random
// locks (shared, exclusive), unlocks, closes by an owner and last closes of
// the open file. The oracle keeps, per byte, which owners hold it and how, and
// says whether each request must be granted; Locks' answers must agree,
// and at the end every owner's release leaves the server's table empty.
TEST(Locks, AServerRestartedInItsGracePeriodGetsEveryLockReclaimedAsItWas) {
  FakeLockManager server;
  Locks a(server, Instance('a'), {}, 5ms), b(server, Instance('b'));
  ASSERT_TRUE(Set(a, &kA, Req(1, F_WRLCK, 0, 10)).ok());
  ASSERT_TRUE(Set(a, &kA, Req(1, F_RDLCK, 5, 3)).ok());  // a downgrade splits it in three
  ASSERT_TRUE(Set(a, &kA, Req(2, F_RDLCK, 100, 0)).ok());  // to the end
  ASSERT_TRUE(Set(a, &kA, Req(3, F_WRLCK, 50, 10)).ok());
  ASSERT_TRUE(Set(a, &kA, Req(3, F_UNLCK, 50, 10)).ok());
  server.Restart(true);
  const auto o1 = a.OwnerOf(1), o2 = a.OwnerOf(2), o3 = a.OwnerOf(3);
  ASSERT_TRUE(WaitUntil([&] {
    return server.HoldsByte(kFile, o1, 0) == 2 && server.HoldsByte(kFile, o1, 5) == 1 &&
           server.HoldsByte(kFile, o1, 8) == 2 && server.HoldsByte(kFile, o2, uint64_t{1} << 40) == 1;
  })) << "the locks were not reclaimed";
  EXPECT_GT(server.reclaims(), 0);
  EXPECT_EQ(server.HoldsByte(kFile, o1, 10), 0);
  EXPECT_EQ(server.HoldsByte(kFile, o3, 55), 0) << "an unlocked range came back";
  // Requests made in the grace period (a lock, an unlock) wait it out;
  // then B is excluded as before the restart.
  auto waiting = std::async(std::launch::async, [&] { return Set(a, &kA, Req(4, F_WRLCK, 60, 1)); });
  auto unlocking = std::async(std::launch::async, [&] { return Set(a, &kA, Req(2, F_UNLCK, 200, 0)); });
  std::this_thread::sleep_for(50ms);
  server.EndGrace();
  EXPECT_TRUE(waiting.get().ok());
  EXPECT_TRUE(unlocking.get().ok());
  EXPECT_EQ(server.HoldsByte(kFile, o2, 200), 0);
  EXPECT_EQ(server.HoldsByte(kFile, o2, 199), 1);
  EXPECT_FALSE(Set(b, &kB, Req(1, F_WRLCK, 0, 1)).ok());
  EXPECT_FALSE(Set(b, &kB, Req(1, F_WRLCK, 6, 1)).ok());
  EXPECT_TRUE(Set(b, &kB, Req(1, F_RDLCK, 6, 1)).ok());
  EXPECT_FALSE(Set(b, &kB, Req(1, F_WRLCK, 150, 1)).ok());
  EXPECT_TRUE(Set(b, &kB, Req(1, F_WRLCK, 1000, 1)).ok());
  EXPECT_EQ(a.LostLocks(), 0u);
}

TEST(Locks, LocksAServerForgotAreAskedForAgainAndOneAnotherHostTookMeanwhileIsCountedLost) {
  FakeLockManager server;
  Locks a(server, Instance('a'), {}, 5ms), b(server, Instance('b'));
  ASSERT_TRUE(Set(a, &kA, Req(1, F_WRLCK, 0, 10)).ok());
  ASSERT_TRUE(Set(a, &kA, Req(2, F_WRLCK, 20, 10)).ok());
  // The server restarted and its grace period passed unseen; B locked
  // bytes 25-34 in the meantime.
  server.Restart(false, std::make_pair(b.OwnerOf(1), nfs::LockRange{true, 25, 10}));
  ASSERT_TRUE(WaitUntil([&] { return a.LostLocks() == 1 && server.HoldsByte(kFile, a.OwnerOf(1), 9) == 2; }));
  EXPECT_EQ(server.HoldsByte(kFile, a.OwnerOf(2), 20), 0) << "a lost lock was taken in part";
  // The lost range is no longer A's: once B lets go, a second forgetful
  // restart has A ask for what it still holds, and for that only.
  ASSERT_TRUE(Set(b, &kB, Req(1, F_UNLCK)).ok());
  const int reasks = server.lock_calls();
  server.Restart(false);
  ASSERT_TRUE(WaitUntil([&] { return server.HoldsByte(kFile, a.OwnerOf(1), 9) == 2; }));
  EXPECT_GT(server.lock_calls(), reasks);
  for (uint64_t byte : {20, 25, 29}) EXPECT_EQ(server.HoldsByte(kFile, a.OwnerOf(2), byte), 0) << byte;
  EXPECT_EQ(a.LostLocks(), 1u);
  EXPECT_FALSE(Set(b, &kB, Req(1, F_WRLCK, 0, 1)).ok());
  ASSERT_TRUE(Wait<Ok>([&](auto cb) { a.ReleaseAll({}, cb); }).ok());
  EXPECT_EQ(server.HoldsByte(kFile, a.OwnerOf(1), 0), 0);
}

TEST(Locks, AServerThatKeepsItsLocksIsOnlyTestedNeverAskedAgain) {
  for (bool names_holder : {true, false}) {
    SCOPED_TRACE(names_holder ? "the server names the holder" : "the server names no holder");
    FakeLockManager server;
    if (!names_holder) server.NameNoHolder();
    Locks a(server, Instance('a'), {}, 2ms);
    ASSERT_TRUE(Set(a, &kA, Req(1, F_WRLCK, 0, 10)).ok());
    ASSERT_TRUE(Set(a, &kA, Req(2, F_RDLCK, 20, 10)).ok());
    const int locks = server.lock_calls(), tests = server.test_calls();
    std::this_thread::sleep_for(100ms);  // some 50 checks
    EXPECT_GT(server.test_calls(), tests + 5) << "the locks were not tested";
    EXPECT_EQ(server.lock_calls(), locks);
    EXPECT_EQ(server.reclaims(), 0);
  }
}

TEST(Locks, ALockLostToAnotherHostIsSeenAlsoWhenTheServerNamesNoHolder) {
  FakeLockManager server;
  server.NameNoHolder();
  Locks a(server, Instance('a'), {}, 2ms), b(server, Instance('b'));
  ASSERT_TRUE(Set(a, &kA, Req(1, F_WRLCK, 0, 10)).ok());
  // Forgotten by a restart; B holds the same bytes now, in another range.
  server.Restart(false, std::make_pair(b.OwnerOf(1), nfs::LockRange{true, 0, 20}));
  ASSERT_TRUE(WaitUntil([&] { return a.LostLocks() == 1; }));
  EXPECT_EQ(server.HoldsByte(kFile, a.OwnerOf(1), 0), 0);
}

TEST(Locks, RequestsOnAFileWaitWhileItsLocksAreAskedForAgain) {
  FakeLockManager server;
  Locks a(server, Instance('a'), {}, 2ms);
  ASSERT_TRUE(Set(a, &kA, Req(1, F_WRLCK, 0, 10)).ok());
  // The server restarted and forgot the lock; A's LOCK asking for it again
  // reaches the server late. The unlock and the close made meanwhile must
  // not get there first (the LOCK would then take back a lock nobody holds).
  server.HoldLocks();
  server.Restart(false);
  ASSERT_TRUE(WaitUntil([&] { return server.LocksHeldBack() > 0; }));
  auto unlocking = std::async(std::launch::async, [&] { return Set(a, &kA, Req(1, F_UNLCK, 0, 10)); });
  auto closing = std::async(std::launch::async, [&] {
    return Wait<Ok>([&](auto cb) { a.ReleaseOwner(kFile, 1, {}, cb); });
  });
  EXPECT_EQ(unlocking.wait_for(50ms), std::future_status::timeout) << "the unlock did not wait";
  EXPECT_EQ(closing.wait_for(0ms), std::future_status::timeout) << "the close did not wait";
  server.LetLocksIn();
  EXPECT_TRUE(unlocking.get().ok());
  EXPECT_TRUE(closing.get().ok());
  EXPECT_EQ(server.HoldsByte(kFile, a.OwnerOf(1), 0), 0) << "the LOCK landed after the unlock";
}

TEST(Locks, RandomRequestsFromThreeMountsAgreeWithAByteOracle) {
  for (uint32_t seed : {1u, 2u, 3u, 4u, 5u}) {
    FakeLockManager server;
    std::vector<std::unique_ptr<Locks>> mounts;
    for (char c : {'a', 'b', 'c'}) mounts.push_back(std::make_unique<Locks>(server, Instance(c), nullptr, 5ms));
    constexpr int kBytes = 32;
    // oracle[byte][owner index (mount * 3 + owner)]: 0 none, 1 shared, 2 exclusive
    std::vector<std::array<int, 9>> oracle(kBytes, std::array<int, 9>{});
    std::mt19937 rng(seed);
    const int files[3] = {0, 0, 0};  // one open file per mount (only addresses count)
    for (int step = 0; step < 1500; ++step) {
      const int m = static_cast<int>(rng() % 3), o = static_cast<int>(rng() % 3), who = m * 3 + o;
      const uint64_t start = rng() % kBytes, len = 1 + rng() % 8;
      const uint64_t end = std::min<uint64_t>(kBytes, start + len);
      const int op = static_cast<int>(rng() % 10);
      SCOPED_TRACE(testing::Message() << "seed " << seed << " step " << step);
      if (step % 250 == 249) {
        // The server restarts: in its grace period every mount reclaims
        // exactly what it held.
        server.Restart(true);
        ASSERT_TRUE(WaitUntil([&] {
          for (uint64_t b = 0; b < kBytes; ++b) {
            for (int k = 0; k < 9; ++k) {
              if (server.HoldsByte(kFile, mounts[k / 3]->OwnerOf(static_cast<uint64_t>(k % 3) + 1), b) !=
                  oracle[b][k]) {
                return false;
              }
            }
          }
          return true;
        })) << "the reclaimed locks differ from what was held";
        server.EndGrace();
        continue;
      }
      if (op < 6) {
        const bool excl = op < 3;
        bool free = true;
        for (uint64_t b = start; b < end; ++b) {
          for (int k = 0; k < 9; ++k) {
            if (k != who && oracle[b][k] != 0 && (excl || oracle[b][k] == 2)) free = false;
          }
        }
        auto r = Set(*mounts[m], &files[m], Req(static_cast<uint64_t>(o) + 1, excl ? F_WRLCK : F_RDLCK, start,
                                               end - start));
        ASSERT_EQ(r.ok(), free);
        if (free) {
          for (uint64_t b = start; b < end; ++b) oracle[b][who] = excl ? 2 : 1;
        }
      } else if (op < 8) {
        ASSERT_TRUE(Set(*mounts[m], &files[m], Req(static_cast<uint64_t>(o) + 1, F_UNLCK, start, end - start)).ok());
        for (uint64_t b = start; b < end; ++b) oracle[b][who] = 0;
      } else if (op < 9) {
        // A close by the owner: all of its locks go.
        ASSERT_TRUE(Wait<Ok>([&](auto cb) { mounts[m]->ReleaseOwner(kFile, static_cast<uint64_t>(o) + 1, {}, cb); }).ok());
        for (auto& b : oracle) b[who] = 0;
      } else {
        // The last close of the mount's open file, through which all its
        // owners locked: all of them lose their locks.
        ASSERT_TRUE(Wait<Ok>([&](auto cb) { mounts[m]->ReleaseFile(kFile, &files[m], {}, cb); }).ok());
        for (auto& b : oracle) {
          for (int k = m * 3; k < m * 3 + 3; ++k) b[k] = 0;
        }
      }
      // F_GETLK agrees too: a probe of one byte by an owner holding nothing.
      const uint64_t probe = rng() % kBytes;
      bool held_excl = false;
      for (int k = 0; k < 9; ++k) held_excl |= oracle[probe][k] == 2;
      auto g = Wait<std::optional<Locks::Conflict>>(
          [&](auto cb) { mounts[0]->Get(kFile, Req(99, F_RDLCK, probe, 1), {}, cb); });
      ASSERT_TRUE(g.ok());
      ASSERT_EQ(g->has_value(), held_excl) << "byte " << probe;
    }
    for (auto& mount : mounts) ASSERT_TRUE(Wait<Ok>([&](auto cb) { mount->ReleaseAll({}, cb); }).ok());
    EXPECT_EQ(server.HeldCount(kFile), 0u);
  }
}

}  // namespace
}  // namespace mpnfs::fs
