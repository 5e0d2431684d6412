// GoneCheck (fs/gone_check.h) against the fake NFS server: which answers
// make a file gone, and how many files are asked about at once.
#include "fs/gone_check.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <memory>
#include <thread>
#include <mutex>
#include <optional>
#include <vector>

#include "test/fakes/fake_nfs.h"

namespace mpnfs::fs {
namespace {

using Answer = GoneCheck::Answer;
using Proc = testing::FakeNfs::Proc;

Answer Ask(GoneCheck& g, const nfs::Fh& fh, std::vector<nfs::Cred> writers) {
  std::promise<Answer> got;
  g.Ask(fh, std::move(writers), [&got](Answer a) { got.set_value(a); });
  return got.get_future().get();
}

class GoneCheckTest : public ::testing::Test {
 protected:
  ~GoneCheckTest() override {
    nfs_.Resume();
    nfs_.Quiesce();
  }
  nfs::Fh Create(const std::string& name) {
    std::promise<Result<nfs::NewObject>> got;
    nfs::SetAttr sa;
    sa.mode = 0666;
    nfs_.Create(nfs_.root(), name, nfs::CreateMode::kUnchecked, sa, 0, nfs::Cred{},
                [&got](Result<nfs::NewObject> r) { got.set_value(std::move(r)); });
    auto r = got.get_future().get();
    EXPECT_TRUE(r && r->fh);
    return r && r->fh ? *r->fh : nfs::Fh();
  }
  void Remove(const std::string& name) {
    std::promise<Result<nfs::Wcc>> rm;
    nfs_.Remove(nfs_.root(), name, nfs::Cred{}, [&rm](Result<nfs::Wcc> r) { rm.set_value(std::move(r)); });
    ASSERT_TRUE(static_cast<bool>(rm.get_future().get()));
  }
  // Asks about a live file, the server answering its calls one by one and
  // answering ESTALE for everything while `stale(file_answered)` says so
  // (file_answered: the file's GETATTR has been answered).
  Answer AskWhileStale(const std::function<bool(bool)>& stale) {
    GoneCheck g(nfs_, nfs_.root());
    const nfs::Fh f = Create("f");
    nfs_.Pause();
    auto p = std::make_shared<std::promise<Answer>>();  // (outlives a failed test)
    auto answer = p->get_future();
    g.Ask(f, {alice_}, [p](Answer a) { p->set_value(a); });
    bool file_answered = false;
    for (int k = 0; k < 20; ++k) {
      if (answer.wait_for(std::chrono::milliseconds(0)) == std::future_status::ready) break;
      if (!nfs_.WaitPending(1, std::chrono::seconds(5))) break;
      const bool file = nfs_.Queued().front().fh == f;
      nfs_.set_all_stale(stale(file_answered));
      nfs_.StepOne(0);
      file_answered = file_answered || file;
    }
    nfs_.set_all_stale(false);
    if (answer.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
      ADD_FAILURE() << "no answer";
      return Answer::kLive;
    }
    return answer.get();
  }

  testing::FakeNfs nfs_;
  const nfs::Cred alice_{1000, 1000, {}};
  const nfs::Cred bob_{2000, 2000, {}};
};

TEST_F(GoneCheckTest, ARemovedFileIsGoneAndALiveOneIsNot) {
  GoneCheck g(nfs_, nfs_.root());
  const nfs::Fh live = Create("live"), removed = Create("removed");
  Remove("removed");
  EXPECT_EQ(Ask(g, removed, {alice_}), Answer::kGone);
  EXPECT_EQ(Ask(g, live, {alice_}), Answer::kLive);
  // Three GETATTRs for the gone one (root, file, root), two for the live one.
  EXPECT_EQ(nfs_.stats().Calls(Proc::kGetattr), 5u);
}

// A server that answers ESTALE for `fh` to the users in `stale_to` only (as
// knfsd's subtree_check does to a user who cannot search its directories).
class PerUserNfs : public testing::FakeNfs {
 public:
  nfs::Fh fh;
  std::vector<uint32_t> stale_to;
  void Getattr(const nfs::Fh& f, const nfs::Cred& c, nfs::Cb<nfs::Attr> cb) override {
    const bool stale = f == fh && std::find(stale_to.begin(), stale_to.end(), c.uid) != stale_to.end();
    testing::FakeNfs::Getattr(f, c, [stale, cb = std::move(cb)](Result<nfs::Attr> r) {
      cb(stale ? Result<nfs::Attr>(Error::Errno(ESTALE, "stale to this user")) : std::move(r));
    });
  }
};

// Each writer is asked as itself, and one answer that is not ESTALE keeps
// the file: whichever writer it comes from, and whether it comes first or
// last.
TEST(GoneCheckWritersTest, AFileThatAnswersOneOfItsWritersIsLive) {
  PerUserNfs nfs;
  GoneCheck g(nfs, nfs.root());
  const nfs::Cred alice{1000, 1000, {}}, bob{2000, 2000, {}};
  std::promise<Result<nfs::NewObject>> made;
  nfs.Create(nfs.root(), "f", nfs::CreateMode::kUnchecked, nfs::SetAttr{}, 0, nfs::Cred{},
             [&made](Result<nfs::NewObject> r) { made.set_value(std::move(r)); });
  auto m = made.get_future().get();
  ASSERT_TRUE(m && m->fh);
  nfs.fh = *m->fh;
  nfs.stale_to = {alice.uid};
  for (const auto& writers : {std::vector<nfs::Cred>{alice, bob}, std::vector<nfs::Cred>{bob, alice}}) {
    for (bool stale_answers_last : {false, true}) {
      nfs.Pause();
      std::promise<Answer> p;
      auto answer = p.get_future();
      g.Ask(nfs.fh, writers, [&p](Answer a) { p.set_value(a); });
      ASSERT_TRUE(nfs.WaitPending(1));
      ASSERT_TRUE(nfs.StepOne(0));  // the root
      ASSERT_TRUE(nfs.WaitPending(2));  // the file, as each writer
      const auto queued = nfs.Queued();
      ASSERT_EQ(queued.size(), 2u);
      const size_t to_alice = queued[0].cred.uid == alice.uid ? 0 : 1;
      ASSERT_EQ(queued[to_alice].cred.uid, alice.uid);
      ASSERT_EQ(queued[1 - to_alice].cred.uid, bob.uid);
      const size_t first = stale_answers_last ? 1 - to_alice : to_alice;
      ASSERT_TRUE(nfs.StepOne(first));
      nfs.Resume();
      EXPECT_EQ(answer.get(), Answer::kLive) << "writers " << writers[0].uid << "," << writers[1].uid
                                             << "; the stale answer " << (stale_answers_last ? "last" : "first");
      ASSERT_TRUE(nfs.Quiesce());
    }
  }
  nfs.stale_to = {alice.uid, bob.uid};
  EXPECT_EQ(Ask(g, nfs.fh, {alice, bob}), Answer::kGone);
}

TEST_F(GoneCheckTest, AFileStaleToEveryWriterIsGone) {
  GoneCheck g(nfs_, nfs_.root());
  const nfs::Fh f = Create("f");
  Remove("f");
  EXPECT_EQ(Ask(g, f, {alice_, bob_}), Answer::kGone);
  uint64_t asked_as_alice = 0, asked_as_bob = 0;
  for (const auto& c : nfs_.History()) {
    if (c.proc != Proc::kGetattr || c.fh != f) continue;
    asked_as_alice += c.cred.uid == alice_.uid;
    asked_as_bob += c.cred.uid == bob_.uid;
  }
  EXPECT_EQ(asked_as_alice, 1u);
  EXPECT_EQ(asked_as_bob, 1u);
}

// A server stale for every handle while its exports load: a live file looks
// gone. The root's answers before and after each catch it, also when the
// server came back in between.
TEST_F(GoneCheckTest, AServerStaleForEverythingBeforeTheFileAnswersCannotTell) {
  // Stale until the file has been asked about; back before the root is
  // asked again.
  EXPECT_EQ(AskWhileStale([](bool file_answered) { return !file_answered; }), Answer::kNoExport);
}

TEST_F(GoneCheckTest, AServerStaleForEverythingAfterTheFileAnswersCannotTell) {
  // Answering until the file is asked about; stale from then on.
  int calls = 0;
  EXPECT_EQ(AskWhileStale([&calls](bool) { return calls++ > 0; }), Answer::kNoExport);
}

// A kernel dropping its inode cache forgets thousands of files at once: at
// most max_in_flight are asked about at a time, the rest in order after.
TEST_F(GoneCheckTest, AtMostSoManyFilesAreAskedAboutAtOnce) {
  GoneCheck g(nfs_, nfs_.root(), /*max_in_flight=*/3);
  std::vector<nfs::Fh> files;
  for (int i = 0; i < 10; ++i) {
    files.push_back(Create("f" + std::to_string(i)));
    Remove("f" + std::to_string(i));
  }
  nfs_.Pause();
  // (Shared with the callbacks: they outlive a test that failed early.)
  struct Answers {
    std::mutex mu;
    std::vector<std::pair<nfs::Fh, Answer>> got;
    std::promise<void> all;
  };
  auto answers = std::make_shared<Answers>();
  for (const auto& f : files) {
    g.Ask(f, {alice_}, [answers, f, n = files.size()](Answer a) {
      std::lock_guard lock(answers->mu);
      answers->got.emplace_back(f, a);
      if (answers->got.size() == n) answers->all.set_value();
    });
  }
  ASSERT_TRUE(nfs_.WaitPending(3));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(nfs_.Pending(), 3u) << "more files than allowed asked about at once";
  size_t most = 0;
  while (nfs_.StepOne(0)) {
    most = std::max(most, nfs_.Pending());
  }
  nfs_.Resume();
  ASSERT_EQ(answers->all.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_LE(most, 3u);
  std::lock_guard lock(answers->mu);
  ASSERT_EQ(answers->got.size(), files.size());
  for (const auto& [f, a] : answers->got) EXPECT_EQ(a, Answer::kGone);
  EXPECT_EQ(answers->got.back().first, files.back()) << "queued asks run in order";
}

// Every ask frees its place: asks keep being answered one after another
// with one place (an ask that kept its place would leave the next queued
// for ever).
TEST_F(GoneCheckTest, EachAskFreesItsPlaceForTheNext) {
  GoneCheck g(nfs_, nfs_.root(), /*max_in_flight=*/1);
  const nfs::Fh f = Create("f");
  Remove("f");
  for (int i = 0; i < 5; ++i) {
    auto p = std::make_shared<std::promise<Answer>>();
    auto answer = p->get_future();
    g.Ask(f, {alice_}, [p](Answer a) { p->set_value(a); });
    ASSERT_EQ(answer.wait_for(std::chrono::seconds(10)), std::future_status::ready) << "ask " << i << " never ran";
    EXPECT_EQ(answer.get(), Answer::kGone);
  }
}

// Asks still in flight or queued when the GoneCheck goes finish, and their
// `done` runs (under ASan this would show a use after free).
TEST_F(GoneCheckTest, AsksOutliveTheirGoneCheck) {
  const nfs::Fh f = Create("f");
  Remove("f");
  auto answered = std::make_shared<std::atomic<int>>(0);
  nfs_.Pause();
  {
    GoneCheck g(nfs_, nfs_.root(), /*max_in_flight=*/3);
    for (int i = 0; i < 20; ++i) g.Ask(f, {alice_}, [answered](Answer a) { *answered += a == Answer::kGone; });
    ASSERT_TRUE(nfs_.WaitPending(3));
  }
  nfs_.Resume();
  for (int i = 0; i < 500 && *answered < 20; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(answered->load(), 20);
}

// After Cancel() nothing more is sent; what was asked is kept (kLive).
TEST_F(GoneCheckTest, ACancelledCheckSendsNothingMoreAndKeepsEverything) {
  const nfs::Fh f = Create("f");
  Remove("f");
  GoneCheck g(nfs_, nfs_.root(), /*max_in_flight=*/2);
  auto answers = std::make_shared<std::vector<Answer>>();
  auto mu = std::make_shared<std::mutex>();
  nfs_.Pause();
  for (int i = 0; i < 6; ++i) {
    g.Ask(f, {alice_}, [answers, mu](Answer a) {
      std::lock_guard lock(*mu);
      answers->push_back(a);
    });
  }
  ASSERT_TRUE(nfs_.WaitPending(2));  // the root, for the first two
  g.Cancel();
  const uint64_t sent = nfs_.stats().Calls(Proc::kGetattr);
  g.Ask(f, {alice_}, [answers, mu](Answer a) {
    std::lock_guard lock(*mu);
    answers->push_back(a);
  });
  nfs_.Resume();
  ASSERT_TRUE(nfs_.Quiesce());
  EXPECT_EQ(nfs_.stats().Calls(Proc::kGetattr), sent) << "sent after Cancel()";
  std::lock_guard lock(*mu);
  ASSERT_EQ(answers->size(), 7u);
  for (Answer a : *answers) EXPECT_EQ(a, Answer::kLive);
}

// Cancel() between the file's answer and the root's second one: kLive, not
// kGone.
TEST_F(GoneCheckTest, ACheckCancelledAfterTheFileAnsweredKeepsTheWrites) {
  const nfs::Fh f = Create("f");
  Remove("f");
  GoneCheck g(nfs_, nfs_.root());
  auto p = std::make_shared<std::promise<Answer>>();
  auto answer = p->get_future();
  nfs_.Pause();
  g.Ask(f, {alice_}, [p](Answer a) { p->set_value(a); });
  int roots = 0;
  while (nfs_.WaitPending(1)) {
    if (nfs_.Queued().front().fh == nfs_.root() && ++roots == 2) break;
    ASSERT_TRUE(nfs_.StepOne(0));
  }
  ASSERT_EQ(roots, 2);
  g.Cancel();
  nfs_.Resume();
  ASSERT_EQ(answer.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(answer.get(), Answer::kLive);
}

// A client that answers on the calling thread (as a stopped engine may):
// thousands of queued asks are then finished one after another by the
// first, not nested one inside the other's answer.
class SyncNfs : public testing::FakeNfs {
 public:
  std::atomic<bool> hold{true};
  std::mutex mu;
  std::vector<nfs::Cb<nfs::Attr>> held;
  void Getattr(const nfs::Fh& /*fh*/, const nfs::Cred& /*c*/, nfs::Cb<nfs::Attr> cb) override {
    if (hold) {
      std::lock_guard lock(mu);
      held.push_back(std::move(cb));
      return;
    }
    cb(Error::Errno(ESTALE, "stale"));
  }
};

TEST(GoneCheckSyncTest, AsksQueuedBehindAnAnswerOnTheSameThreadDoNotNest) {
  SyncNfs nfs;
  GoneCheck g(nfs, nfs.root(), /*max_in_flight=*/1);
  constexpr int kAsks = 200000;
  int answered = 0;
  for (int i = 0; i < kAsks; ++i) {
    g.Ask("fh", {nfs::Cred{}}, [&answered](Answer a) {
      EXPECT_EQ(a, Answer::kNoExport);
      ++answered;
    });
  }
  ASSERT_EQ(nfs.held.size(), 1u);
  nfs.hold = false;
  auto first = std::move(nfs.held[0]);
  first(Error::Errno(ESTALE, "stale"));  // (nested, this would overflow the stack)
  EXPECT_EQ(answered, kAsks);
}

}  // namespace
}  // namespace mpnfs::fs
