// fs::Filesystem against the in-memory NFSv3 server (test/fakes/fake_nfs.h),
// and the fake's own knobs that those tests rely on.
#include "fs/filesystem.h"

#include <fcntl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "cache/disk.h"
#include "test/fakes/fake_nfs.h"

namespace mpnfs::fs {
namespace {

using mpnfs::testing::FakeNfs;
using Proc = FakeNfs::Proc;
using namespace std::chrono_literals;

// Runs `start(cb)` and waits for cb's result (ETIMEDOUT after 30 s, so that a
// lost callback fails the test instead of hanging it).
template <class T, class Start>
Result<T> Wait(Start start) {
  auto p = std::make_shared<std::promise<Result<T>>>();
  auto f = p->get_future();
  start([p](Result<T> r) { p->set_value(std::move(r)); });
  if (f.wait_for(30s) != std::future_status::ready) {
    return Error::Errno(ETIMEDOUT, "callback never ran");
  }
  return f.get();
}

nfs::Buffer Buf(const std::string& s) {
  auto b = std::make_shared<nfs::Bytes>(s.size());
  std::memcpy(b->data(), s.data(), s.size());
  return b;
}

std::string Pattern(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  std::mt19937 rng(seed);
  for (auto& ch : s) ch = static_cast<char>('a' + rng() % 26);
  return s;
}

// The index of the first queued call of `p` (the queue's size if none).
size_t IndexOf(FakeNfs& nfs, Proc p) {
  auto q = nfs.Queued();
  for (size_t i = 0; i < q.size(); ++i) {
    if (q[i].proc == p) return i;
  }
  return q.size();
}

constexpr uint64_t kRoot = InodeTable::kRootIno;

class FilesystemTest : public ::testing::Test {
 protected:
  void SetUp() override { Mount(FsOptions{}); }
  void TearDown() override {
    EXPECT_TRUE(nfs_.Quiesce()) << "calls still queued at the end of the test";
    fs_.reset();
  }
  void Mount(FsOptions o) {
    if (fs_) {
      ASSERT_TRUE(nfs_.Quiesce());
    }
    fs_ = std::make_unique<Filesystem>(nfs_, nfs_.root(), o);
  }

  // Synchronous wrappers: one Filesystem call, waited for.
  Result<std::pair<EntryOut, OpenOut>> Create(uint64_t parent, const std::string& name,
                                              int flags = O_CREAT | O_WRONLY, mode_t mode = 0644) {
    return Wait<std::pair<EntryOut, OpenOut>>(
        [&](auto cb) { fs_->Create(cred_, parent, name, mode, flags, cb); });
  }
  Result<OpenOut> Open(uint64_t ino, int flags) {
    return Wait<OpenOut>([&](auto cb) { fs_->Open(cred_, ino, flags, cb); });
  }
  // `flags`: the write's own (a pwritev2 RWF_DSYNC write has O_DSYNC).
  Result<size_t> Write(OpenFile* f, const std::string& data, uint64_t off, int flags = 0) {
    return Wait<size_t>([&](auto cb) { fs_->Write(cred_, f, Buf(data), off, flags, cb); });
  }
  Result<std::string> Read(OpenFile* f, size_t size, uint64_t off) {
    return Wait<std::string>([&](auto cb) {
      fs_->Read(cred_, f, size, off, [cb](Result<std::string_view> r) {
        if (!r) return cb(r.error());
        cb(std::string(*r));  // the view lives only during this callback
      });
    });
  }
  Result<Ok> Flush(OpenFile* f) {
    return Wait<Ok>([&](auto cb) { fs_->Flush(cred_, f, cb); });
  }
  Result<Ok> Fsync(OpenFile* f) {
    return Wait<Ok>([&](auto cb) { fs_->Fsync(cred_, f, cb); });
  }
  // close(2): flush, then release.
  void Close(OpenFile* f) {
    auto r = Flush(f);
    EXPECT_TRUE(r.ok()) << r.error().what;
    fs_->Release(f);
  }
  Result<EntryOut> Lookup(uint64_t parent, const std::string& name) {
    return Wait<EntryOut>([&](auto cb) { fs_->Lookup(cred_, parent, name, cb); });
  }
  Result<EntryOut> Mkdir(uint64_t parent, const std::string& name, mode_t mode = 0755) {
    return Wait<EntryOut>([&](auto cb) { fs_->Mkdir(cred_, parent, name, mode, cb); });
  }
  Result<Ok> Unlink(uint64_t parent, const std::string& name) {
    return Wait<Ok>([&](auto cb) { fs_->Unlink(cred_, parent, name, cb); });
  }
  Result<Ok> Rmdir(uint64_t parent, const std::string& name) {
    return Wait<Ok>([&](auto cb) { fs_->Rmdir(cred_, parent, name, cb); });
  }
  Result<Ok> Rename(uint64_t parent, const std::string& name, uint64_t newparent,
                    const std::string& newname) {
    return Wait<Ok>(
        [&](auto cb) { fs_->Rename(cred_, parent, name, newparent, newname, 0, cb); });
  }
  // The names a directory listing gives (with "." and ".."), sorted.
  Result<std::vector<std::string>> List(uint64_t ino, bool plus) {
    auto d = Wait<DirHandle*>([&](auto cb) { fs_->Opendir(cred_, ino, cb); });
    if (!d) return d.error();
    auto r = Wait<DirHandle*>([&](auto cb) { fs_->Readdir(cred_, *d, 0, plus, cb); });
    std::vector<std::string> names;
    if (r) {
      MutexLock lock((*d)->mu);
      for (const auto& e : (*d)->entries) {
        names.push_back(e.name);
        if (plus && e.name != "." && e.name != "..") {
          EXPECT_TRUE(e.fh && e.attr) << "READDIRPLUS entry without handle or attributes";
        }
      }
    }
    fs_->Releasedir(*d);
    if (!r) return r.error();
    std::sort(names.begin(), names.end());
    return names;
  }
  // A new file in the root holding `data`, written UNSTABLE through a second
  // open of it (the first write through the open that created a file may go
  // FILE_SYNC, and then nothing is kept for a resend), still open.
  OpenFile* CreateWith(const std::string& name, const std::string& data) {
    auto c = Create(kRoot, name);
    EXPECT_TRUE(c.ok()) << c.error().what;
    if (!c) return nullptr;
    auto o = Open(c->first.ino, O_RDWR);
    EXPECT_TRUE(o.ok()) << o.error().what;
    Close(c->second.file);
    if (!o) return nullptr;
    auto w = Write(o->file, data, 0);
    EXPECT_TRUE(w.ok()) << w.error().what;
    return o->file;
  }
  std::string ContentsOf(const std::string& path) {
    auto fh = nfs_.FhOf(path);
    EXPECT_TRUE(fh) << path << " does not exist on the server";
    return fh ? nfs_.Contents(*fh) : std::string();
  }
  std::string StableOf(const std::string& path) {
    auto fh = nfs_.FhOf(path);
    EXPECT_TRUE(fh) << path << " does not exist on the server";
    return fh ? nfs_.StableContents(*fh) : std::string();
  }

  FakeNfs nfs_;  // declared first: outlives the filesystem
  std::unique_ptr<Filesystem> fs_;
  Cred cred_{1000, 1000, {}};
};

TEST_F(FilesystemTest, CreateWriteReleaseThenReadBackThroughNewOpen) {
  auto c = Create(kRoot, "f");
  ASSERT_TRUE(c.ok()) << c.error().what;
  OpenFile* w = c->second.file;
  const std::string a = "hello, ", b = Pattern(100000, 1);
  ASSERT_TRUE(Write(w, a, 0).ok());
  ASSERT_TRUE(Write(w, b, a.size()).ok());
  Close(w);

  auto o = Open(c->first.ino, O_RDONLY);
  ASSERT_TRUE(o.ok()) << o.error().what;
  auto r = Read(o->file, a.size() + b.size() + 10, 0);  // past the end: a short read
  ASSERT_TRUE(r.ok()) << r.error().what;
  EXPECT_EQ(*r, a + b);
  auto mid = Read(o->file, 5, 3);
  ASSERT_TRUE(mid.ok());
  EXPECT_EQ(*mid, (a + b).substr(3, 5));
  fs_->Release(o->file);
  EXPECT_EQ(ContentsOf("f"), a + b);

  auto e = Lookup(kRoot, "f");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->ino, c->first.ino);
  EXPECT_EQ(static_cast<size_t>(e->st.st_size), a.size() + b.size());
  EXPECT_EQ(e->st.st_uid, 1000u);
}

TEST_F(FilesystemTest, MkdirReaddirUnlinkRename) {
  auto d = Mkdir(kRoot, "d");
  ASSERT_TRUE(d.ok()) << d.error().what;
  EXPECT_TRUE(S_ISDIR(d->st.st_mode));
  for (const char* name : {"a", "b"}) {
    auto c = Create(d->ino, name);
    ASSERT_TRUE(c.ok()) << c.error().what;
    Close(c->second.file);
  }
  using Names = std::vector<std::string>;
  for (bool plus : {false, true}) {
    auto l = List(d->ino, plus);
    ASSERT_TRUE(l.ok()) << l.error().what;
    EXPECT_EQ(*l, (Names{".", "..", "a", "b"})) << "plus=" << plus;
  }

  ASSERT_TRUE(Rename(d->ino, "a", d->ino, "c").ok());
  auto sub = Mkdir(kRoot, "e");
  ASSERT_TRUE(sub.ok());
  ASSERT_TRUE(Rename(d->ino, "b", sub->ino, "b2").ok());
  EXPECT_EQ(List(d->ino, false).value(), (Names{".", "..", "c"}));
  EXPECT_EQ(List(sub->ino, true).value(), (Names{".", "..", "b2"}));
  EXPECT_TRUE(nfs_.FhOf("e/b2"));
  EXPECT_FALSE(nfs_.FhOf("d/b"));

  auto gone = Lookup(d->ino, "a");
  ASSERT_TRUE(gone.ok());
  EXPECT_EQ(gone->ino, 0u) << "a renamed-away name must be a negative entry";

  auto busy = Rmdir(kRoot, "d");
  ASSERT_FALSE(busy.ok());
  EXPECT_EQ(busy.error().err, ENOTEMPTY);
  ASSERT_TRUE(Unlink(d->ino, "c").ok());
  EXPECT_EQ(List(d->ino, true).value(), (Names{".", ".."}));
  auto twice = Unlink(d->ino, "c");
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.error().err, ENOENT);
  ASSERT_TRUE(Rmdir(kRoot, "d").ok());
  EXPECT_EQ(List(kRoot, false).value(), (Names{".", "..", "e"}));
}

TEST_F(FilesystemTest, ReaddirPagesThroughALargeDirectory) {
  nfs_.set_dir_page_entries(7);  // many READDIR calls, resumed by cookie
  auto d = Mkdir(kRoot, "big");
  ASSERT_TRUE(d.ok());
  std::vector<std::string> want = {".", ".."};
  for (int i = 0; i < 50; ++i) {
    const std::string name = "n" + std::to_string(i);
    auto c = Create(d->ino, name);
    ASSERT_TRUE(c.ok());
    fs_->Release(c->second.file);
    want.push_back(name);
  }
  std::sort(want.begin(), want.end());
  const uint64_t before = nfs_.stats().Calls(Proc::kReaddirplus);
  auto l = List(d->ino, true);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(*l, want);
  EXPECT_GE(nfs_.stats().Calls(Proc::kReaddirplus) - before, 52u / 7);
}

TEST_F(FilesystemTest, SyncMountWriteIsStableWhenItReturns) {
  FsOptions o;
  o.sync = true;
  Mount(o);
  const std::string data = Pattern(10000, 2);
  OpenFile* f = CreateWith("s", data);
  ASSERT_NE(f, nullptr);
  // No Quiesce: the write's answer means the server holds it durably.
  EXPECT_EQ(StableOf("s"), data);
  const auto st = nfs_.stats();
  EXPECT_GE(st.writes_file_sync, 1u);
  EXPECT_EQ(st.writes_unstable, 0u);
  Close(f);
}

TEST_F(FilesystemTest, FsyncCommitsUnstableWrites) {
  // (Larger than a small new file, whose first write goes FILE_SYNC.)
  const std::string data = Pattern(Filesystem::kSmallFileSync + 5000, 3);
  OpenFile* f = CreateWith("u", data);
  ASSERT_NE(f, nullptr);
  ASSERT_TRUE(nfs_.Quiesce());
  EXPECT_EQ(ContentsOf("u"), data);
  EXPECT_EQ(StableOf("u"), "") << "an UNSTABLE write must not be durable before COMMIT";
  ASSERT_TRUE(Fsync(f).ok());
  EXPECT_EQ(StableOf("u"), data);
  const auto st = nfs_.stats();
  EXPECT_GE(st.commits, 1u);
  EXPECT_EQ(st.writes_file_sync, 0u);
  Close(f);
}

TEST_F(FilesystemTest, RestartAfterUnstableWriteThenFsyncResendsTheData) {
  const std::string data = Pattern(70000, 4);
  OpenFile* f = CreateWith("r", data);
  ASSERT_NE(f, nullptr);
  ASSERT_TRUE(nfs_.Quiesce());
  ASSERT_EQ(ContentsOf("r"), data);
  const uint64_t verf = nfs_.write_verifier();

  nfs_.Restart();
  EXPECT_NE(nfs_.write_verifier(), verf);
  EXPECT_EQ(ContentsOf("r"), "") << "the server lost the UNSTABLE data";

  ASSERT_TRUE(Fsync(f).ok());
  EXPECT_EQ(StableOf("r"), data);
  EXPECT_EQ(ContentsOf("r"), data);
  EXPECT_GE(nfs_.stats().writes_file_sync, 1u) << "the resend goes FILE_SYNC";
  Close(f);
}

TEST_F(FilesystemTest, ShortWritesAreCompleted) {
  nfs_.set_write_max(1000);
  const std::string data = Pattern(10000, 5);
  OpenFile* f = CreateWith("short", data);
  ASSERT_NE(f, nullptr);
  ASSERT_TRUE(Flush(f).ok());
  EXPECT_EQ(StableOf("short"), data);
  EXPECT_GE(nfs_.stats().Calls(Proc::kWrite), 10u);
  fs_->Release(f);
}

// Many non-overlapping writes (and a large one split across connections),
// executed in random order after random delays, some twice: the file ends as
// written. Seeded; run with several seeds.
class ReorderTest : public FilesystemTest, public ::testing::WithParamInterface<uint64_t> {};

TEST_P(ReorderTest, NonOverlappingWritesInAnyOrderLandRight) {
  nfs_.Seed(GetParam());
  nfs_.set_reorder(true);
  nfs_.set_max_delay_us(300);
  nfs_.set_drop_prob(0.2);
  nfs_.set_parallelism(4);
  FsOptions o;
  o.wsize = 64 << 10;
  Mount(o);
  auto c = Create(kRoot, "m");
  ASSERT_TRUE(c.ok());
  OpenFile* f = c->second.file;

  constexpr size_t kChunk = 4096, kChunks = 64;
  std::string want(kChunks * kChunk, '\0');
  std::vector<size_t> order(kChunks);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<uint32_t>(GetParam())));
  for (size_t i : order) {
    const std::string piece = Pattern(kChunk, static_cast<uint32_t>(i + 10));
    want.replace(i * kChunk, kChunk, piece);
    ASSERT_TRUE(Write(f, piece, i * kChunk).ok());
  }
  // One large write, split into several WRITEs sent at once.
  const std::string big = Pattern(1 << 20, 99);
  want += big;
  ASSERT_TRUE(Write(f, big, kChunks * kChunk).ok());
  ASSERT_TRUE(Flush(f).ok());
  EXPECT_EQ(ContentsOf("m"), want);
  EXPECT_EQ(StableOf("m"), want);
  EXPECT_EQ(nfs_.overlap_violations(), 0u);
  EXPECT_GT(nfs_.stats().dropped_replies, 0u);

  auto r = Read(f, want.size(), 0);
  ASSERT_TRUE(r.ok()) << r.error().what;
  EXPECT_TRUE(*r == want);
  fs_->Release(f);
}

INSTANTIATE_TEST_SUITE_P(Seeds, ReorderTest, ::testing::Values(1, 2, 3, 42, 1234));

// ------------------------------------------------------------ write ordering

// Rewrites of one range, write-behind, with the server answering in random
// order after random delays and re-executing some calls: the server ends
// with the last version, and never sees two overlapping WRITEs in flight.
// `window` small makes writes park (wait for room) too.
struct RewriteCase {
  uint64_t seed;
  uint64_t window;
};
class RewriteOrderTest : public FilesystemTest, public ::testing::WithParamInterface<RewriteCase> {};

TEST_P(RewriteOrderTest, OverlappingRewritesLandInOrder) {
  nfs_.Seed(GetParam().seed);
  nfs_.set_reorder(true);
  nfs_.set_max_delay_us(200);
  nfs_.set_drop_prob(0.1);
  nfs_.set_parallelism(4);
  FsOptions o;
  o.wsize = 64 << 10;
  o.write_behind = GetParam().window;
  Mount(o);
  auto c = Create(kRoot, "rw");
  ASSERT_TRUE(c.ok());
  OpenFile* f = c->second.file;
  std::mt19937 rng(static_cast<uint32_t>(GetParam().seed));
  std::string want;
  for (int i = 0; i < 48; ++i) {
    // Mostly the whole 256 KiB (split into 4 WRITEs), sometimes a small
    // piece inside it: every later write overlaps earlier ones.
    const size_t len = i % 3 == 2 ? 1 + rng() % 8192 : 256 << 10;
    const uint64_t off = len == (256 << 10) ? 0 : rng() % ((256 << 10) - len);
    const std::string data = Pattern(len, static_cast<uint32_t>(i));
    if (want.size() < off + len) want.resize(off + len, '\0');
    want.replace(off, len, data);
    ASSERT_TRUE(Write(f, data, off).ok());
  }
  ASSERT_TRUE(Flush(f).ok());
  EXPECT_TRUE(ContentsOf("rw") == want) << "the server holds an older version of some bytes";
  EXPECT_TRUE(StableOf("rw") == want);
  EXPECT_EQ(nfs_.overlap_violations(), 0u);
  fs_->Release(f);
}

INSTANTIATE_TEST_SUITE_P(Seeds, RewriteOrderTest,
                         ::testing::Values(RewriteCase{1, 64 << 20}, RewriteCase{2, 64 << 20},
                                           RewriteCase{3, 64 << 20}, RewriteCase{4, 300 << 10},
                                           RewriteCase{5, 300 << 10}, RewriteCase{6, 64 << 10}));

TEST_F(FilesystemTest, ODsyncDirectWriteIsFileSyncWhenItReturns) {
  auto c = Create(kRoot, "log");
  ASSERT_TRUE(c.ok());
  fs_->Release(c->second.file);
  for (int flags : {O_WRONLY | O_DIRECT | O_DSYNC, O_WRONLY | O_DIRECT | O_SYNC, O_WRONLY | O_DSYNC}) {
    auto o = Open(c->first.ino, flags);
    ASSERT_TRUE(o.ok());
    const std::string data = Pattern(8192, static_cast<uint32_t>(flags));
    const auto before = nfs_.stats();
    ASSERT_TRUE(Write(o->file, data, 0).ok());
    // No fsync, no Quiesce: the answer means the server has it durably.
    EXPECT_EQ(StableOf("log").substr(0, 8192), data) << std::hex << flags;
    const auto after = nfs_.stats();
    EXPECT_EQ(after.writes_unstable, before.writes_unstable) << std::hex << flags;
    EXPECT_GT(after.writes_file_sync, before.writes_file_sync) << std::hex << flags;
    Close(o->file);
  }
}

// pwritev2(RWF_DSYNC) or (RWF_SYNC) on a file opened without O_DSYNC: the
// kernel marks that one write O_DSYNC, and sends no FSYNC after it when the
// open is direct. It is durable when answered, and the open's next plain
// write is not.
TEST_F(FilesystemTest, AWritesOwnDsyncFlagMakesItFileSyncWhenItReturns) {
  auto c = Create(kRoot, "rwf");
  ASSERT_TRUE(c.ok());
  fs_->Release(c->second.file);
  // (RWF_SYNC's O_SYNC holds O_DSYNC's bit.)
  for (int open_flags : {O_WRONLY | O_DIRECT, O_WRONLY}) {
    auto o = Open(c->first.ino, open_flags);
    ASSERT_TRUE(o.ok());
    const std::string data = Pattern(8192, static_cast<uint32_t>(open_flags));
    const auto before = nfs_.stats();
    ASSERT_TRUE(Write(o->file, data, 0, open_flags | O_DSYNC).ok());
    // No fsync, no Quiesce: the answer means the server has it durably.
    EXPECT_EQ(StableOf("rwf").substr(0, 8192), data) << std::hex << open_flags;
    const auto after = nfs_.stats();
    EXPECT_EQ(after.writes_unstable, before.writes_unstable) << std::hex << open_flags;
    EXPECT_GT(after.writes_file_sync, before.writes_file_sync) << std::hex << open_flags;
    // The flag was the write's, not the open's.
    ASSERT_TRUE(Write(o->file, data, 8192, open_flags).ok());
    ASSERT_TRUE(nfs_.Quiesce());
    EXPECT_GT(nfs_.stats().writes_unstable, after.writes_unstable) << std::hex << open_flags;
    Close(o->file);
  }
}

// A write whose own flags have O_DIRECT (fcntl F_SETFL after a page-cache
// open) is answered by the server, not acknowledged ahead of it: its error
// is its own.
TEST_F(FilesystemTest, AWritesOwnODirectFlagIsNotWrittenBehind) {
  auto c = Create(kRoot, "fcntl", O_CREAT | O_WRONLY);
  ASSERT_TRUE(c.ok());
  fs_->Release(c->second.file);
  auto o = Open(c->first.ino, O_WRONLY);
  ASSERT_TRUE(o.ok());
  nfs_.FailNext(Proc::kWrite, ENOSPC, 1);
  auto w = Write(o->file, "direct now", 0, O_WRONLY | O_DIRECT);
  ASSERT_FALSE(w.ok()) << "acknowledged before the server refused it";
  EXPECT_EQ(w.error().err, ENOSPC);
  // Without the flag the same open writes behind (the control).
  nfs_.FailNext(Proc::kWrite, ENOSPC, 1);
  EXPECT_TRUE(Write(o->file, "behind", 0, O_WRONLY).ok());
  ASSERT_TRUE(nfs_.Quiesce());
  auto f = Fsync(o->file);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.error().err, ENOSPC);
  fs_->Release(o->file);
}

// A write lost by a server restart is resent at fsync, but never over the
// bytes a newer write (made after the restart) holds.
TEST_F(FilesystemTest, ResendAfterRestartNeverReplacesNewerData) {
  const std::string a = Pattern(8192, 1), b = Pattern(4096, 2);
  OpenFile* f = CreateWith("n", a);
  ASSERT_EQ(StableOf("n"), "") << "written stable: a restart would lose nothing";
  ASSERT_NE(f, nullptr);
  ASSERT_TRUE(nfs_.Quiesce());
  nfs_.Restart();  // `a` is lost
  ASSERT_TRUE(Write(f, b, 0).ok());
  ASSERT_TRUE(nfs_.Quiesce());
  ASSERT_TRUE(Fsync(f).ok());
  const std::string want = b + a.substr(4096);
  EXPECT_TRUE(StableOf("n") == want) << "an older write was resent over a newer one";
  EXPECT_TRUE(ContentsOf("n") == want);
  Close(f);
}

// A resend leaves out the bytes of a newer write only if that write
// succeeds: a newer write still on its way when the resend is decided
// that then fails (its caller hears of it) leaves them to the older data,
// not to whatever the restarted server holds, which fsync would otherwise
// pass as written.
TEST_F(FilesystemTest, ANewerWriteThatFailsLeavesItsBytesToTheResend) {
  const std::string a = Pattern(8192, 1), b = Pattern(4096, 2);
  OpenFile* f = CreateWith("h", a);
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(StableOf("h"), "") << "written stable: a restart would lose nothing";
  auto d = Open(f->inode->ino(), O_WRONLY | O_DIRECT);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(nfs_.Quiesce());
  nfs_.Restart();  // `a` is lost
  nfs_.Pause();
  auto direct = std::make_shared<std::promise<Result<size_t>>>();
  fs_->Write(cred_, d->file, Buf(b), 0, O_WRONLY | O_DIRECT,
             [direct](Result<size_t> r) { direct->set_value(std::move(r)); });
  ASSERT_TRUE(nfs_.WaitPending(1));  // the direct WRITE, held
  auto sync = std::make_shared<std::promise<Result<Ok>>>();
  fs_->Fsync(cred_, f, [sync](Result<Ok> r) { sync->set_value(std::move(r)); });
  ASSERT_TRUE(nfs_.WaitPending(2));
  // The COMMIT: a new verifier; the resend is decided while the direct
  // WRITE is still out.
  ASSERT_TRUE(nfs_.StepOne(IndexOf(nfs_, Proc::kCommit)));
  nfs_.FailNext(Proc::kWrite, EIO, 1);
  ASSERT_TRUE(nfs_.StepOne(0));  // the direct WRITE (queued first) fails
  nfs_.Resume();
  auto fd = direct->get_future();
  auto fsy = sync->get_future();
  ASSERT_EQ(fd.wait_for(30s), std::future_status::ready);
  ASSERT_EQ(fsy.wait_for(30s), std::future_status::ready);
  EXPECT_FALSE(fd.get().ok());
  auto r = fsy.get();
  ASSERT_TRUE(nfs_.Quiesce());
  const bool whole = StableOf("h") == a;
  EXPECT_TRUE(whole || !r.ok()) << "fsync succeeded with bytes of the file lost";
  EXPECT_TRUE(whole) << "the bytes the failed write left were not resent";
  fs_->Release(d->file);
  Close(f);
}

// Two lost writes of one range, resent with replies in any order: the newer
// one's bytes win.
TEST_F(FilesystemTest, ResendOfTwoLostOverlappingWritesKeepsTheNewer) {
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    nfs_.Seed(seed);
    nfs_.set_reorder(true);
    nfs_.set_max_delay_us(300);
    const std::string name = "two" + std::to_string(seed);
    const std::string a = Pattern(65536, 1), b = Pattern(65536, 2);
    OpenFile* f = CreateWith(name, a);
    ASSERT_EQ(StableOf(name), "") << "written stable: a restart would lose nothing";
    ASSERT_NE(f, nullptr);
    ASSERT_TRUE(Write(f, b, 0).ok());
    ASSERT_TRUE(nfs_.Quiesce());
    nfs_.Restart();
    ASSERT_TRUE(Fsync(f).ok());
    EXPECT_TRUE(StableOf(name) == b) << "seed " << seed;
    Close(f);
  }
}

TEST_F(FilesystemTest, ResendAfterRestartDoesNotUndoALaterTruncate) {
  OpenFile* f = CreateWith("t", Pattern(8192, 3));
  ASSERT_EQ(StableOf("t"), "") << "written stable: a restart would lose nothing";
  ASSERT_NE(f, nullptr);
  ASSERT_TRUE(nfs_.Quiesce());
  nfs_.Restart();
  nfs::SetAttr sa;
  sa.size = 1000;
  ASSERT_TRUE(Wait<AttrOut>([&](auto cb) { fs_->Setattr(cred_, f->inode->ino(), sa, cb); }).ok());
  ASSERT_TRUE(Fsync(f).ok());
  EXPECT_EQ(StableOf("t"), Pattern(8192, 3).substr(0, 1000));
  Close(f);
}

// errseq: a write-behind failure is reported once to every file open at the
// time (read-only ones excepted at close), and to none opened later.
TEST_F(FilesystemTest, WriteBehindErrorReachesEveryOpenFileOnce) {
  auto c = Create(kRoot, "e", O_CREAT | O_WRONLY);
  ASSERT_TRUE(c.ok());
  OpenFile* w1 = c->second.file;
  auto w2 = Open(c->first.ino, O_WRONLY);
  auto ro = Open(c->first.ino, O_RDONLY);
  ASSERT_TRUE(w2.ok() && ro.ok());
  nfs_.FailNext(Proc::kWrite, ENOSPC, 1);
  ASSERT_TRUE(Write(w1, "data", 0).ok());  // acknowledged, then refused
  ASSERT_TRUE(nfs_.Quiesce());
  auto late = Open(c->first.ino, O_WRONLY);
  ASSERT_TRUE(late.ok());

  auto r1 = Fsync(w1);
  ASSERT_FALSE(r1.ok());
  EXPECT_EQ(r1.error().err, ENOSPC);
  EXPECT_TRUE(Fsync(w1).ok()) << "reported twice to one open file";
  auto r2 = Flush(w2->file);
  ASSERT_FALSE(r2.ok()) << "the other writer's close did not hear of the lost write";
  EXPECT_EQ(r2.error().err, ENOSPC);
  EXPECT_TRUE(Flush(ro->file).ok()) << "a read-only close reported a write error";
  EXPECT_TRUE(Flush(late->file).ok()) << "an open made after the error saw it";
  for (OpenFile* f : {w1, w2->file, ro->file, late->file}) fs_->Release(f);
}

// A write-behind failure is reported at fsync or close, never by a later
// write: the kernel splits a large write(2) into several WRITEs and turns a
// refused later piece into a short count, losing the error, and a refused
// mmap writeback is dropped. Until an fsync that has nothing to report
// commits, the file's writes wait for the server and return their own
// errors.
TEST_F(FilesystemTest, AWriteBehindFailureIsReportedAtFsyncAndLaterWritesWaitForTheServer) {
  auto c = Create(kRoot, "ek", O_CREAT | O_WRONLY);
  ASSERT_TRUE(c.ok());
  OpenFile* behind = c->second.file;
  auto direct = Open(c->first.ino, O_WRONLY | O_DIRECT);
  auto plain = Open(c->first.ino, O_WRONLY);
  ASSERT_TRUE(direct.ok() && plain.ok());
  nfs_.FailNext(Proc::kWrite, ENOSPC, 1);
  ASSERT_TRUE(Write(behind, "data", 0).ok());  // acknowledged, then refused
  ASSERT_TRUE(nfs_.Quiesce());
  // Later writes of every kind are made, and report nothing.
  const std::pair<OpenFile*, int> writes[] = {{direct->file, O_WRONLY | O_DIRECT},
                                              {plain->file, O_WRONLY | O_DSYNC},
                                              {behind, O_WRONLY}};
  std::string expect(4, '\0');
  for (auto [f, flags] : writes) {
    const std::string piece = "w" + std::to_string(flags);
    ASSERT_TRUE(Write(f, piece, expect.size(), flags).ok()) << std::hex << flags;
    expect += piece;
  }
  // Not written behind now: a refused write returns its own error (another
  // errno: it is the writer's alone, not recorded for the others).
  nfs_.FailNext(Proc::kWrite, EIO, 1);
  auto own = Write(plain->file, "own", expect.size(), O_WRONLY);
  ASSERT_FALSE(own.ok()) << "acknowledged ahead of the server after a failure";
  EXPECT_EQ(own.error().err, EIO);
  ASSERT_TRUE(nfs_.Quiesce());
  EXPECT_EQ(ContentsOf("ek"), expect);
  // Each descriptor hears of the first failure once, at fsync. An fsync
  // that reports it does not end the rule; one with nothing to report does.
  auto r0 = Fsync(behind);
  ASSERT_FALSE(r0.ok()) << "the write-behind failure was not reported";
  EXPECT_EQ(r0.error().err, ENOSPC);
  nfs_.FailNext(Proc::kWrite, EIO, 1);
  EXPECT_FALSE(Write(behind, "x", expect.size(), O_WRONLY).ok())
      << "written behind again after an fsync that reported a failure";
  ASSERT_TRUE(nfs_.Quiesce());
  for (OpenFile* f : {direct->file, plain->file}) {
    auto r = Fsync(f);
    ASSERT_FALSE(r.ok()) << "the write-behind failure was not reported";
    EXPECT_EQ(r.error().err, ENOSPC);
  }
  for (OpenFile* f : {behind, direct->file, plain->file}) {
    EXPECT_TRUE(Fsync(f).ok()) << "reported twice";
  }
  // An fsync that reported nothing committed: write-behind resumes.
  nfs_.FailNext(Proc::kWrite, ENOSPC, 1);
  EXPECT_TRUE(Write(plain->file, "again", 0, O_WRONLY).ok());
  ASSERT_TRUE(nfs_.Quiesce());
  auto r = Fsync(plain->file);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().err, ENOSPC);
  for (OpenFile* f : {behind, direct->file, plain->file}) fs_->Release(f);
}

// An fsync that waits for a COMMIT round already running hears of the data
// that round's resend lost (after a server restart), though the round run
// for it then has nothing left to commit.
TEST_F(FilesystemTest, AnFsyncJoiningACommitHearsOfDataItsResendLost) {
  OpenFile* a = CreateWith("join", Pattern(8192, 9));
  ASSERT_NE(a, nullptr);
  auto b = Open(a->inode->ino(), O_WRONLY);
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(nfs_.Quiesce());
  nfs_.Restart();  // the UNSTABLE data is lost; the next COMMIT sees a new verifier
  nfs_.Pause();
  auto first = std::make_shared<std::promise<Result<Ok>>>();
  fs_->Fsync(cred_, a, [first](Result<Ok> r) { first->set_value(std::move(r)); });
  ASSERT_TRUE(nfs_.WaitPending(1));  // its COMMIT, held
  auto joined = std::make_shared<std::promise<Result<Ok>>>();
  fs_->Fsync(cred_, b->file, [joined](Result<Ok> r) { joined->set_value(std::move(r)); });
  nfs_.FailNext(Proc::kWrite, EIO, 1);  // the resend fails
  nfs_.Resume();
  auto fa = first->get_future(), fb = joined->get_future();
  ASSERT_EQ(fa.wait_for(30s), std::future_status::ready);
  ASSERT_EQ(fb.wait_for(30s), std::future_status::ready);
  EXPECT_FALSE(fa.get().ok()) << "the fsync whose round lost the data returned 0";
  auto rb = fb.get();
  ASSERT_FALSE(rb.ok()) << "the fsync that joined the round returned 0";
  EXPECT_EQ(rb.error().err, EIO);
  // Reporting it did not end the rule that writes wait for the server.
  nfs_.FailNext(Proc::kWrite, ENOSPC, 1);
  EXPECT_FALSE(Write(b->file, "x", 0, O_WRONLY).ok()) << "written behind after a lost resend";
  ASSERT_TRUE(nfs_.Quiesce());
  EXPECT_TRUE(Fsync(a).ok()) << "reported twice";
  EXPECT_TRUE(Fsync(b->file).ok()) << "reported twice";
  fs_->Release(a);
  fs_->Release(b->file);
}

// The same when the round run for the joined fsync fails its own COMMIT:
// the data the resend lost is what it reports (the COMMIT's data is kept
// and retried).
TEST_F(FilesystemTest, AJoinedFsyncReportsALostResendBeforeItsOwnCommitsFailure) {
  OpenFile* a = CreateWith("join2", Pattern(8192, 10));
  ASSERT_NE(a, nullptr);
  auto b = Open(a->inode->ino(), O_WRONLY);
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(nfs_.Quiesce());
  nfs_.Restart();
  nfs_.Pause();
  auto first = std::make_shared<std::promise<Result<Ok>>>();
  fs_->Fsync(cred_, a, [first](Result<Ok> r) { first->set_value(std::move(r)); });
  ASSERT_TRUE(nfs_.WaitPending(1));  // round 1's COMMIT, held
  ASSERT_TRUE(Write(b->file, "later", 65536).ok());  // written behind: its WRITE is held
  ASSERT_TRUE(nfs_.WaitPending(2));
  auto joined = std::make_shared<std::promise<Result<Ok>>>();
  fs_->Fsync(cred_, b->file, [joined](Result<Ok> r) { joined->set_value(std::move(r)); });
  ASSERT_TRUE(nfs_.StepOne(1));  // the later WRITE: b's fsync then joins round 1
  ASSERT_TRUE(nfs_.StepOne(0));  // round 1's COMMIT: a new verifier, the resend is held
  nfs_.FailNext(Proc::kWrite, EIO, 1);     // the resend fails
  nfs_.FailNext(Proc::kCommit, EROFS, 1);  // and round 2's COMMIT
  nfs_.Resume();
  auto fa = first->get_future(), fb = joined->get_future();
  ASSERT_EQ(fa.wait_for(30s), std::future_status::ready);
  ASSERT_EQ(fb.wait_for(30s), std::future_status::ready);
  auto ra = fa.get();
  ASSERT_FALSE(ra.ok());
  EXPECT_EQ(ra.error().err, EIO);
  auto rb = fb.get();
  ASSERT_FALSE(rb.ok());
  EXPECT_EQ(rb.error().err, EIO) << "the COMMIT's error hid the lost data";
  EXPECT_TRUE(Fsync(b->file).ok()) << "the kept data was not committed by the next fsync";
  fs_->Release(a);
  fs_->Release(b->file);
}

TEST_F(FilesystemTest, ReadOnlyCloseDoesNotCommitAndFsyncCommitsAsTheWriter) {
  auto c = Create(kRoot, "shared", O_CREAT | O_WRONLY, 0666);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(Write(c->second.file, Pattern(Filesystem::kSmallFileSync + 4096, 5), 0).ok());
  ASSERT_TRUE(nfs_.Quiesce());
  const Cred reader{2000, 2000, {}};
  auto ro = Wait<OpenOut>([&](auto cb) { fs_->Open(reader, c->first.ino, O_RDONLY, cb); });
  ASSERT_TRUE(ro.ok()) << ro.error().what;
  const auto before = nfs_.stats().commits;
  ASSERT_TRUE(Wait<Ok>([&](auto cb) { fs_->Flush(reader, ro->file, cb); }).ok());
  EXPECT_EQ(nfs_.stats().commits, before) << "a read-only close sent a COMMIT";
  // Nor does its RELEASE (not the file's last).
  auto ro2 = Wait<OpenOut>([&](auto cb) { fs_->Open(reader, c->first.ino, O_RDONLY, cb); });
  ASSERT_TRUE(ro2.ok()) << ro2.error().what;
  ASSERT_TRUE(Wait<Ok>([&](auto cb) { fs_->Flush(reader, ro2->file, cb); }).ok());
  fs_->Release(ro2->file);
  ASSERT_TRUE(nfs_.Quiesce());
  EXPECT_EQ(nfs_.stats().commits, before) << "a read-only release sent a COMMIT";
  ASSERT_TRUE(Wait<Ok>([&](auto cb) { fs_->Fsync(reader, ro->file, cb); }).ok());
  bool saw = false;
  for (const auto& rec : nfs_.History()) {
    if (rec.proc == Proc::kCommit) {
      saw = true;
      EXPECT_EQ(rec.cred.uid, cred_.uid) << "COMMIT went with the reader's identity";
    }
  }
  EXPECT_TRUE(saw);
  fs_->Release(ro->file);
  Close(c->second.file);
}

// kernel_cache: the kernel keeps a file's pages at every open, but for the
// cases where they may not be the server's data: a write-behind the server
// refused (the pages hold what it never got), a write refused and answered
// so (the kernel keeps a refused mmap writeback's pages), and an uncached
// write (the kernel's pages may be older than the server's). The default mount drops
// them in those cases too, even when the file's mtime did not move.
TEST_F(FilesystemTest, OpensKeepTheKernelsPagesUnlessAWriteFailedOrWentUncached) {
  for (const bool kernel_cache : {true, false}) {
    SCOPED_TRACE(kernel_cache ? "kernel_cache" : "default");
    FsOptions o;
    o.kernel_cache = kernel_cache;
    Mount(o);
    const std::string name = kernel_cache ? "kc" : "dflt";
    auto c = Create(kRoot, name, O_CREAT | O_WRONLY);
    ASSERT_TRUE(c.ok());
    const uint64_t ino = c->first.ino;
    ASSERT_TRUE(Write(c->second.file, std::string(8192, 'a'), 0).ok());
    Close(c->second.file);
    auto keeps = [&](int flags) {
      auto r = Open(ino, flags);
      EXPECT_TRUE(r.ok());
      if (!r.ok()) return false;
      const bool keep = r->keep_cache;
      Close(r->file);
      return keep;
    };
    keeps(O_RDONLY);  // (the default mount's first open after a write of its own drops them)
    EXPECT_TRUE(keeps(O_RDONLY)) << "nothing changed since the last open";

    auto w = Open(ino, O_WRONLY);
    ASSERT_TRUE(w.ok());
    nfs_.FailNext(Proc::kWrite, ENOSPC, 1);
    ASSERT_TRUE(Write(w->file, std::string(4096, 'b'), 0).ok());  // acknowledged, then refused
    ASSERT_TRUE(nfs_.Quiesce());
    EXPECT_FALSE(keeps(O_RDONLY)) << "pages of a refused write-behind kept";
    EXPECT_TRUE(keeps(O_RDONLY));
    EXPECT_FALSE(Flush(w->file).ok());  // (the writer hears of it)
    fs_->Release(w->file);
    keeps(O_RDONLY);

    auto d = Open(ino, O_WRONLY | O_DIRECT);
    ASSERT_TRUE(d.ok());
    ASSERT_TRUE(Write(d->file, std::string(4096, 'c'), 4096).ok());
    Close(d->file);
    EXPECT_FALSE(keeps(O_RDONLY)) << "pages kept across an uncached write";
    if (kernel_cache) {
      EXPECT_TRUE(keeps(O_RDONLY));
    }
    keeps(O_RDONLY);

    // A refused write answered as such (synchronous): the kernel keeps the
    // pages of a refused mmap writeback as they were.
    auto s = Open(ino, O_WRONLY | O_DSYNC);
    ASSERT_TRUE(s.ok());
    nfs_.FailNext(Proc::kWrite, ENOSPC, 1);
    ASSERT_FALSE(Write(s->file, std::string(4096, 'd'), 0).ok());
    Close(s->file);
    EXPECT_FALSE(keeps(O_RDONLY)) << "pages kept across a refused write";
    EXPECT_TRUE(keeps(O_RDONLY));
  }
}

// Close-to-open for the size: the kernel reads up to the size it holds, so
// an open that finds the server's size or mtime other than those the kernel
// was last given asks it to fetch them again (and, once two differing ones
// were given, until an open has asked once).
TEST_F(FilesystemTest, AnOpenAsksTheKernelAgainForAttributesAnotherClientChanged) {
  std::mutex mu;
  std::vector<uint64_t> asked;
  fs_->SetAttrInvalidator([&](uint64_t ino) {
    std::lock_guard lock(mu);
    asked.push_back(ino);
  });
  auto taken = [&] {
    std::lock_guard lock(mu);
    return std::exchange(asked, {});
  };
  OpenFile* f = CreateWith("g", "abc");
  ASSERT_NE(f, nullptr);
  const uint64_t ino = f->inode->ino();
  const nfs::Fh fh = f->inode->fh();
  Close(f);
  auto open_close = [&] {
    auto o = Open(ino, O_RDONLY);
    ASSERT_TRUE(o.ok());
    Close(o->file);
  };
  ASSERT_TRUE(Wait<AttrOut>([&](auto cb) { fs_->Getattr(cred_, ino, cb); }).ok());
  open_close();
  taken();  // (our own write moved them since the create's reply)
  open_close();
  EXPECT_TRUE(taken().empty()) << "asked again with nothing changed";

  // Another client appends.
  ASSERT_TRUE(Wait<nfs::WriteReply>([&](auto cb) { nfs_.Write(fh, 3, Buf("more"), 0, 4, true, cred_, cb); }).ok());
  open_close();
  EXPECT_EQ(taken(), std::vector<uint64_t>{ino});
  // The kernel fetches them (those the open saw): nothing more to ask.
  auto a = Wait<AttrOut>([&](auto cb) { fs_->Getattr(cred_, ino, cb); });
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->st.st_size, 7);
  open_close();
  EXPECT_TRUE(taken().empty());
  // Two replies with differing attributes (another append between them)
  // may reach the kernel in either order: the next open asks once.
  ASSERT_TRUE(Wait<nfs::WriteReply>([&](auto cb) { nfs_.Write(fh, 7, Buf("x"), 0, 1, true, cred_, cb); }).ok());
  ASSERT_TRUE(Wait<AttrOut>([&](auto cb) { fs_->Getattr(cred_, ino, cb); }).ok());
  open_close();
  EXPECT_EQ(taken(), std::vector<uint64_t>{ino});
  open_close();
  EXPECT_TRUE(taken().empty());
}

// Close-to-open for appends: the kernel puts an O_APPEND write at the size
// it holds, stale once another client appended (it fetches no attributes
// at open). The write lands at the end the open found on the server, and
// the next at the end of that one; the kernel's pages, which hold the data
// at its own offset, are dropped. nocto leaves the offset to the kernel.
TEST_F(FilesystemTest, AnAppendGoesAtTheEndTheOpenFoundNotWhereTheKernelPutsIt) {
  OpenFile* f = CreateWith("log", "A1\n");
  ASSERT_NE(f, nullptr);
  const uint64_t ino = f->inode->ino();
  const nfs::Fh fh = f->inode->fh();
  Close(f);
  std::vector<uint64_t> dropped;  // inodes whose kernel pages are dropped
  fs_->SetDataInvalidator([&](uint64_t i) { dropped.push_back(i); });
  // Another client appends; the kernel still holds size 3.
  ASSERT_TRUE(Wait<nfs::WriteReply>([&](auto cb) { nfs_.Write(fh, 3, Buf("B1\n"), 0, 3, true, cred_, cb); }).ok());
  auto o = Open(ino, O_WRONLY | O_APPEND);
  ASSERT_TRUE(o.ok());
  ASSERT_TRUE(Write(o->file, "A2\n", 3, O_WRONLY | O_APPEND).ok());
  EXPECT_EQ(dropped, std::vector<uint64_t>{ino}) << "the kernel's pages hold A2 at offset 3";
  ASSERT_TRUE(Write(o->file, "A3\n", 9, O_WRONLY | O_APPEND).ok());  // where the kernel puts it, having fetched the size
  EXPECT_EQ(dropped.size(), 1u);
  // A page writeback (mmap) through the same open file says no O_APPEND:
  // it stays where it is.
  ASSERT_TRUE(Write(o->file, "a", 0, 0).ok());
  Close(o->file);
  EXPECT_EQ(ContentsOf("log"), "a1\nB1\nA2\nA3\n");
  // A plain open's writes keep their offsets.
  auto p = Open(ino, O_WRONLY);
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(Write(p->file, "xx", 0, O_WRONLY).ok());
  Close(p->file);
  EXPECT_EQ(ContentsOf("log"), "xx\nB1\nA2\nA3\n");
}

// The appends the gateway does not place: O_APPEND set by fcntl on a plain
// open (no O_APPEND open found the size), and O_DIRECT appends (the kernel
// sends the pieces of a large one at once): where the kernel puts them.
TEST_F(FilesystemTest, AppendsWithoutAnEndFoundAtOpenOrWithODirectGoWhereTheKernelPutsThem) {
  OpenFile* f = CreateWith("fl", "");
  ASSERT_NE(f, nullptr);
  const uint64_t ino = f->inode->ino();
  const nfs::Fh fh = f->inode->fh();
  Close(f);
  // Written by another client: this gateway knows no end of the file.
  ASSERT_TRUE(Wait<nfs::WriteReply>([&](auto cb) { nfs_.Write(fh, 0, Buf("0123456789"), 0, 10, true, cred_, cb); }).ok());
  auto p = Open(ino, O_WRONLY);  // then fcntl(F_SETFL, O_APPEND)
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(Write(p->file, "ab", 10, O_WRONLY | O_APPEND).ok());
  Close(p->file);
  EXPECT_EQ(ContentsOf("fl"), "0123456789ab");
  auto d = Open(ino, O_WRONLY | O_APPEND | O_DIRECT);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(Write(d->file, "XY", 4, O_WRONLY | O_APPEND | O_DIRECT).ok());
  fs_->Release(d->file);
  EXPECT_EQ(ContentsOf("fl"), "0123XY6789ab");
}

// An O_APPEND open while another append of this gateway is placed and not
// yet answered (a direct_io mount waits for the server) does not take the
// end back below it: the second append lands after the first.
TEST_F(FilesystemTest, AnOpenDoesNotTakeTheEndBelowAnAppendStillOnItsWay) {
  FsOptions o;
  o.direct_io = true;
  Mount(o);
  OpenFile* f = CreateWith("two", "x\n");
  ASSERT_NE(f, nullptr);
  const uint64_t ino = f->inode->ino();
  Close(f);
  auto first = Open(ino, O_WRONLY | O_APPEND);
  ASSERT_TRUE(first.ok());
  nfs_.Pause();
  auto w1 = std::make_shared<std::promise<Result<size_t>>>();
  fs_->Write(cred_, first->file, Buf("A\n"), 2, O_WRONLY | O_APPEND,
             [w1](Result<size_t> r) { w1->set_value(std::move(r)); });
  ASSERT_TRUE(nfs_.WaitPending(1));  // its WRITE, held
  auto second = std::make_shared<std::promise<Result<OpenOut>>>();
  fs_->Open(cred_, ino, O_WRONLY | O_APPEND, [second](Result<OpenOut> r) { second->set_value(std::move(r)); });
  ASSERT_TRUE(nfs_.WaitPending(2));
  ASSERT_TRUE(nfs_.StepOne(IndexOf(nfs_, Proc::kAccess)));  // the open sees size 2
  auto s = second->get_future();
  ASSERT_EQ(s.wait_for(30s), std::future_status::ready);
  auto o2 = s.get();
  ASSERT_TRUE(o2.ok());
  nfs_.Resume();
  ASSERT_TRUE(Write(o2->file, "B\n", 2, O_WRONLY | O_APPEND).ok());
  auto f1 = w1->get_future();
  ASSERT_EQ(f1.wait_for(30s), std::future_status::ready);
  ASSERT_TRUE(f1.get().ok());
  fs_->Release(first->file);
  fs_->Release(o2->file);
  EXPECT_EQ(ContentsOf("two"), "x\nA\nB\n");
}

TEST_F(FilesystemTest, WithNoctoAnAppendGoesWhereTheKernelPutsIt) {
  FsOptions o;
  o.cto = false;
  Mount(o);
  OpenFile* f = CreateWith("log", "A1\n");
  ASSERT_NE(f, nullptr);
  const uint64_t ino = f->inode->ino();
  const nfs::Fh fh = f->inode->fh();
  Close(f);
  ASSERT_TRUE(Wait<nfs::WriteReply>([&](auto cb) { nfs_.Write(fh, 3, Buf("B1\n"), 0, 3, true, cred_, cb); }).ok());
  auto a = Open(ino, O_WRONLY | O_APPEND);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(Write(a->file, "A2\n", 3, O_WRONLY | O_APPEND).ok());
  Close(a->file);
  EXPECT_EQ(ContentsOf("log"), "A1\nA2\n");
}

// lookupcache=: how long the kernel may keep a name found (entry_timeout
// of a lookup's, a create's reply) and a name not found (a negative entry).
TEST_F(FilesystemTest, LookupcacheSetsHowLongFoundAndMissingNamesAreCached) {
  using LC = FsOptions::LookupCache;
  for (const auto& [mode, found, missing] : {std::tuple{LC::kAll, 30.0, 30.0}, std::tuple{LC::kPositive, 30.0, 0.0},
                                             std::tuple{LC::kNone, 0.0, 0.0}}) {
    FsOptions o;
    o.lookupcache = mode;
    Mount(o);
    const std::string name = "lc" + std::to_string(static_cast<int>(mode));
    auto c = Create(kRoot, name);
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(c->first.entry_timeout, found);
    Close(c->second.file);
    auto hit = Lookup(kRoot, name);
    ASSERT_TRUE(hit.ok());
    EXPECT_NE(hit->ino, 0u);
    EXPECT_EQ(hit->entry_timeout, found);
    auto miss = Lookup(kRoot, name + "-not-there");
    ASSERT_TRUE(miss.ok());
    EXPECT_EQ(miss->ino, 0u);
    EXPECT_EQ(miss->entry_timeout, missing);
  }
}

TEST_F(FilesystemTest, OpenWithOTruncTruncates) {
  OpenFile* f = CreateWith("ot", "a long line of old text\n");
  ASSERT_NE(f, nullptr);
  Close(f);
  auto ino = Lookup(kRoot, "ot");
  ASSERT_TRUE(ino.ok());
  const auto mtime = nfs_.Attributes(*nfs_.FhOf("ot"))->mtime;
  auto o = Open(ino->ino, O_WRONLY | O_TRUNC);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(ContentsOf("ot"), "");
  EXPECT_GT(nfs_.Attributes(*nfs_.FhOf("ot"))->mtime, mtime);
  ASSERT_TRUE(Write(o->file, "x\n", 0).ok());
  Close(o->file);
  EXPECT_EQ(ContentsOf("ot"), "x\n");
}

// open(O_CREAT|O_TRUNC) of an existing file that reaches us as CREATE: the
// truncate comes after this mount's write-behind to it, even when the server
// runs the CREATE first.
TEST_F(FilesystemTest, CreateWithOTruncOfAnExistingFileComesAfterItsWriteBehind) {
  OpenFile* f = CreateWith("ct", "");
  ASSERT_NE(f, nullptr);
  ASSERT_TRUE(nfs_.Quiesce());
  nfs_.Pause();
  ASSERT_TRUE(Write(f, "stale data", 0).ok());  // acknowledged, WRITE queued
  std::promise<Result<std::pair<EntryOut, OpenOut>>> created;
  fs_->Create(cred_, kRoot, "ct", 0644, O_CREAT | O_WRONLY | O_TRUNC,
              [&](Result<std::pair<EntryOut, OpenOut>> r) { created.set_value(std::move(r)); });
  ASSERT_TRUE(nfs_.WaitPending(2));
  const auto q = nfs_.Queued();
  size_t create_at = q.size();
  for (size_t i = 0; i < q.size(); ++i) {
    if (q[i].proc == Proc::kCreate) create_at = i;
  }
  ASSERT_LT(create_at, q.size());
  ASSERT_TRUE(nfs_.StepOne(create_at));  // the server runs the CREATE first
  nfs_.Resume();
  auto r = created.get_future().get();
  ASSERT_TRUE(r.ok()) << r.error().what;
  ASSERT_TRUE(nfs_.Quiesce());
  EXPECT_EQ(ContentsOf("ct"), "") << "a write made before the open landed after its truncate";
  EXPECT_EQ(r->first.st.st_size, 0);
  fs_->Release(r->second.file);
  Close(f);
}

TEST_F(FilesystemTest, OTruncNeedsWritePermission) {
  OpenFile* f = CreateWith("ro", "keep");
  ASSERT_NE(f, nullptr);
  Close(f);
  auto e = Lookup(kRoot, "ro");
  ASSERT_TRUE(e.ok());
  const Cred other{2000, 2000, {}};
  auto o = Wait<OpenOut>([&](auto cb) { fs_->Open(other, e->ino, O_RDONLY | O_TRUNC, cb); });
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.error().err, EACCES);
  EXPECT_EQ(ContentsOf("ro"), "keep");
}

// --------------- resends, small new files, directory attributes, hidden names

// A newer FILE_SYNC (O_DSYNC) write over kept UNSTABLE data: after a restart
// the resend of the older write must not replace it.
TEST_F(FilesystemTest, ResendAfterRestartNeverReplacesANewerStableWrite) {
  const std::string a = Pattern(Filesystem::kSmallFileSync + 8192, 1), b = Pattern(4096, 2);
  OpenFile* f = CreateWith("sn", a);
  ASSERT_NE(f, nullptr);
  ASSERT_TRUE(nfs_.Quiesce());
  auto o = Open(f->inode->ino(), O_WRONLY | O_DSYNC);
  ASSERT_TRUE(o.ok());
  ASSERT_TRUE(Write(o->file, b, 0).ok());
  EXPECT_EQ(StableOf("sn"), b);
  nfs_.Restart();
  ASSERT_TRUE(Fsync(f).ok());
  EXPECT_TRUE(StableOf("sn") == b + a.substr(4096)) << "older write resent over a newer FILE_SYNC one";
  Close(o->file);
  Close(f);
}

// A truncate made after the write returned, while a background round resends it.
TEST_F(FilesystemTest, TruncateIsNotUndoneByAResendInFlight) {
  FsOptions o;
  o.commit_threshold = 1;
  Mount(o);
  auto c = Create(kRoot, "tb");
  ASSERT_TRUE(c.ok());
  OpenFile* f = c->second.file;
  ASSERT_TRUE(nfs_.Quiesce());
  nfs_.Pause();
  ASSERT_TRUE(Write(f, Pattern(Filesystem::kSmallFileSync + 8192, 3), 0).ok());  // acknowledged
  ASSERT_TRUE(nfs_.WaitPending(1));
  ASSERT_TRUE(nfs_.StepOne());  // WRITE runs; background COMMIT queued
  ASSERT_TRUE(nfs_.WaitPending(1));
  ASSERT_EQ(nfs_.Queued()[0].proc, Proc::kCommit);
  nfs_.Restart();
  ASSERT_TRUE(nfs_.StepOne());  // COMMIT: verifier changed: resend queued
  ASSERT_TRUE(nfs_.WaitPending(1));
  ASSERT_EQ(nfs_.Queued()[0].proc, Proc::kWrite);
  nfs::SetAttr sa;
  sa.size = 0;
  std::promise<Result<AttrOut>> tr;
  fs_->Setattr(cred_, f->inode->ino(), sa, [&](Result<AttrOut> r) { tr.set_value(std::move(r)); });
  // The SETATTR should wait for the resend it would otherwise race; if it
  // was sent at once, the server runs it first.
  if (nfs_.WaitPending(2, 300ms)) {
    ASSERT_TRUE(nfs_.StepOne(IndexOf(nfs_, Proc::kSetattr)));
  }
  nfs_.Resume();
  ASSERT_TRUE(tr.get_future().get().ok());
  ASSERT_TRUE(nfs_.Quiesce());
  EXPECT_EQ(ContentsOf("tb").size(), 0u) << "truncate undone by a resend";
  Close(f);
}

// A small new file written once and closed: one FILE_SYNC WRITE, no COMMIT,
// and the data durable when close returns.
TEST_F(FilesystemTest, SmallNewFileIsOneFileSyncWriteAndNoCommit) {
  const std::string data = Pattern(1024, 7);
  auto c = Create(kRoot, "small");
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(Write(c->second.file, data, 0).ok());
  Close(c->second.file);
  EXPECT_EQ(StableOf("small"), data) << "close returned before the data was durable";
  const auto st = nfs_.stats();
  EXPECT_EQ(st.writes_file_sync, 1u);
  EXPECT_EQ(st.writes_unstable, 0u);
  EXPECT_EQ(st.commits, 0u);
}

// Only the first write of the open that created the file, at offset 0 and
// small, goes FILE_SYNC: the next ones, a large first one and writes through
// another open stay UNSTABLE and are committed at close.
TEST_F(FilesystemTest, OnlyASmallNewFilesFirstWriteIsFileSync) {
  auto c = Create(kRoot, "two");
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(Write(c->second.file, Pattern(1024, 1), 0).ok());
  ASSERT_TRUE(Write(c->second.file, Pattern(1024, 2), 1024).ok());
  Close(c->second.file);
  auto st = nfs_.stats();
  EXPECT_EQ(st.writes_file_sync, 1u);
  EXPECT_EQ(st.writes_unstable, 1u);
  EXPECT_EQ(st.commits, 1u);

  auto big = Create(kRoot, "big");
  ASSERT_TRUE(big.ok());
  ASSERT_TRUE(Write(big->second.file, Pattern(Filesystem::kSmallFileSync + 1, 3), 0).ok());
  Close(big->second.file);
  st = nfs_.stats();
  EXPECT_EQ(st.writes_file_sync, 1u) << "a large first write went FILE_SYNC";
  EXPECT_EQ(st.commits, 2u);

  auto o = Open(c->first.ino, O_WRONLY);
  ASSERT_TRUE(o.ok());
  ASSERT_TRUE(Write(o->file, Pattern(100, 4), 0).ok());
  Close(o->file);
  st = nfs_.stats();
  EXPECT_EQ(st.writes_file_sync, 1u) << "a write through a later open went FILE_SYNC";
  EXPECT_EQ(st.commits, 3u);
}

size_t CountOf(FakeNfs& nfs, Proc p) {
  size_t n = 0;
  for (const auto& rec : nfs.History()) n += rec.proc == p;
  return n;
}

// The kernel's GETATTR of a directory right after a change made in it is
// answered from the attributes the change's reply carried.
TEST_F(FilesystemTest, DirectoryGetattrAfterAChangeUsesItsPostOpAttributes) {
  auto d = Mkdir(kRoot, "pd");
  ASSERT_TRUE(d.ok());
  auto c = Create(d->ino, "x");
  ASSERT_TRUE(c.ok());
  Close(c->second.file);
  const size_t before = CountOf(nfs_, Proc::kGetattr);
  auto a = Wait<AttrOut>([&](auto cb) { fs_->Getattr(cred_, d->ino, cb); });
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(CountOf(nfs_, Proc::kGetattr), before) << "a GETATTR went to the server";
  auto fh = nfs_.FhOf("pd");
  ASSERT_TRUE(fh);
  auto server = nfs_.Attributes(*fh);
  ASSERT_TRUE(server);
  EXPECT_EQ(a->st.st_mtim.tv_sec, server->mtime.sec);
  EXPECT_EQ(a->st.st_mtim.tv_nsec, server->mtime.nsec) << "not the attributes after the create";
  EXPECT_LE(a->timeout, fs_->options().acdirmin);

  ASSERT_TRUE(Unlink(d->ino, "x").ok());
  const size_t before2 = CountOf(nfs_, Proc::kGetattr);
  auto a2 = Wait<AttrOut>([&](auto cb) { fs_->Getattr(cred_, d->ino, cb); });
  ASSERT_TRUE(a2.ok());
  EXPECT_EQ(CountOf(nfs_, Proc::kGetattr), before2) << "a GETATTR went to the server";
  // A chmod of the directory: the next GETATTR shows it.
  nfs::SetAttr sa;
  sa.mode = 0700;
  ASSERT_TRUE(Wait<AttrOut>([&](auto cb) { fs_->Setattr(cred_, d->ino, sa, cb); }).ok());
  auto a3 = Wait<AttrOut>([&](auto cb) { fs_->Getattr(cred_, d->ino, cb); });
  ASSERT_TRUE(a3.ok());
  EXPECT_EQ(a3->st.st_mode & 07777, 0700u);
}

// A directory removed right after a change in it is not answered from the
// change's attributes: the server says it is gone.
TEST_F(FilesystemTest, ARemovedDirectoryIsNotAnsweredFromCachedAttributes) {
  auto d = Mkdir(kRoot, "gone");
  ASSERT_TRUE(d.ok());
  auto c = Create(d->ino, "x");
  ASSERT_TRUE(c.ok());
  Close(c->second.file);
  ASSERT_TRUE(Unlink(d->ino, "x").ok());
  ASSERT_TRUE(Rmdir(kRoot, "gone").ok());
  auto a = Wait<AttrOut>([&](auto cb) { fs_->Getattr(cred_, d->ino, cb); });
  EXPECT_FALSE(a.ok()) << "attributes of a removed directory, nlink " << (a ? a->st.st_nlink : 0);
}

// Attributes served from a change's reply do not make the attribute cache
// keep them longer (it grows only when the server finds them unchanged).
TEST_F(FilesystemTest, CachedDirectoryAttributesDoNotLengthenTheTimeout) {
  auto d = Mkdir(kRoot, "dd");
  ASSERT_TRUE(d.ok());
  auto c = Create(d->ino, "x");
  ASSERT_TRUE(c.ok());
  Close(c->second.file);
  const size_t before = CountOf(nfs_, Proc::kGetattr);
  auto a1 = Wait<AttrOut>([&](auto cb) { fs_->Getattr(cred_, d->ino, cb); });
  auto a2 = Wait<AttrOut>([&](auto cb) { fs_->Getattr(cred_, d->ino, cb); });
  ASSERT_TRUE(a1.ok() && a2.ok());
  EXPECT_EQ(CountOf(nfs_, Proc::kGetattr), before) << "not answered from the change";
  EXPECT_LE(a1->timeout, fs_->options().acdirmin);
  EXPECT_LE(a2->timeout, fs_->options().acdirmin);
}

// A directory renamed right after a change in it: its next GETATTR shows the
// rename's ctime, not the attributes the earlier change brought.
TEST_F(FilesystemTest, RenamedDirectoryIsNotAnsweredFromOlderPostOpAttributes) {
  auto a = Mkdir(kRoot, "ra");
  ASSERT_TRUE(a.ok());
  auto c = Create(a->ino, "x");
  ASSERT_TRUE(c.ok());
  Close(c->second.file);
  ASSERT_TRUE(Mkdir(kRoot, "rb").ok());
  ASSERT_TRUE(Rename(kRoot, "ra", kRoot, "rb2").ok());
  auto b = Lookup(kRoot, "rb2");
  ASSERT_TRUE(b.ok());
  ASSERT_EQ(b->ino, a->ino);
  const size_t before = CountOf(nfs_, Proc::kGetattr);
  auto g = Wait<AttrOut>([&](auto cb) { fs_->Getattr(cred_, a->ino, cb); });
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(CountOf(nfs_, Proc::kGetattr), before + 1) << "answered from attributes older than the rename";
}

// With acdirmin=0 (no attribute caching) every GETATTR goes to the server.
TEST_F(FilesystemTest, DirectoryPostOpAttributesAreNotUsedWithoutAttributeCaching) {
  FsOptions o;
  o.acdirmin = 0;
  Mount(o);
  auto d = Mkdir(kRoot, "pz");
  ASSERT_TRUE(d.ok());
  auto c = Create(d->ino, "x");
  ASSERT_TRUE(c.ok());
  Close(c->second.file);
  const size_t before = CountOf(nfs_, Proc::kGetattr);
  ASSERT_TRUE(Wait<AttrOut>([&](auto cb) { fs_->Getattr(cred_, d->ino, cb); }).ok());
  EXPECT_EQ(CountOf(nfs_, Proc::kGetattr), before + 1);
}

// The last RELEASE of a file removed while open can come with writes still
// on their way (a shared mapping's pages written back after the last
// close's FLUSH): the hidden name goes once they are answered and
// committed. The handle dies with the last name; removed at once, they
// would be answered ESTALE.
TEST_F(FilesystemTest, TheHiddenNameGoesAfterTheWritesStillOnTheirWay) {
  auto c = Create(kRoot, "m", O_CREAT | O_RDWR);
  ASSERT_TRUE(c.ok());
  OpenFile* f = c->second.file;
  ASSERT_TRUE(Write(f, "x", 0).ok());  // (the small first write goes FILE_SYNC)
  ASSERT_TRUE(Unlink(kRoot, "m").ok());  // open: hidden
  ASSERT_TRUE(nfs_.Quiesce());
  nfs_.Pause();
  ASSERT_TRUE(Write(f, Pattern(8192, 4), 4096).ok());  // written behind: held
  ASSERT_TRUE(nfs_.WaitPending(1));
  fs_->Release(f);  // no FLUSH in between
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(IndexOf(nfs_, Proc::kRemove), nfs_.Queued().size()) << "removed with a write on its way";
  nfs_.Resume();
  ASSERT_TRUE(nfs_.Quiesce());
  uint64_t write_at = 0, commit_at = 0, remove_at = 0;
  for (const auto& h : nfs_.History()) {
    if (h.proc == Proc::kWrite && h.off == 4096) write_at = h.seq;
    if (h.proc == Proc::kCommit) commit_at = h.seq;
    if (h.proc == Proc::kRemove && h.name.rfind(".mpnfs", 0) == 0) remove_at = h.seq;
  }
  ASSERT_NE(remove_at, 0u) << "the hidden name was not removed";
  EXPECT_GT(commit_at, write_at);
  EXPECT_GT(remove_at, commit_at) << "the hidden name went before the COMMIT";
  auto l = List(kRoot, false);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->size(), 2u) << "hidden name left behind: " << l->back();
}

// The kernel may forget a file (its last close and its dentry gone) while
// its writes are still on their way. Looked up again, it is the same file
// with the same write order: a new write over the same bytes waits for
// them.
TEST_F(FilesystemTest, AFileForgottenWithWritesOnTheirWayKeepsTheirOrderWhenLookedUpAgain) {
  auto c = Create(kRoot, "f", O_CREAT | O_RDWR);
  ASSERT_TRUE(c.ok());
  const uint64_t ino = c->first.ino;
  ASSERT_TRUE(Write(c->second.file, "x", 0).ok());  // (the small first write goes FILE_SYNC)
  ASSERT_TRUE(nfs_.Quiesce());
  nfs_.Pause();
  ASSERT_TRUE(Write(c->second.file, Pattern(8192, 5), 0).ok());  // written behind: held
  ASSERT_TRUE(nfs_.WaitPending(1));
  fs_->Release(c->second.file);  // (no FLUSH)
  fs_->Forget(ino, 1);
  // Runs `fn` while the server answers everything but WRITEs.
  auto answering = [&](auto fn) {
    auto f = std::async(std::launch::async, fn);
    while (f.wait_for(5ms) != std::future_status::ready) {
      const auto q = nfs_.Queued();
      for (size_t i = 0; i < q.size(); ++i) {
        if (q[i].proc != Proc::kWrite) {
          nfs_.StepOne(i);
          break;
        }
      }
    }
    return f.get();
  };
  auto again = answering([&] { return Lookup(kRoot, "f"); });
  ASSERT_TRUE(again.ok()) << again.error().what;
  EXPECT_EQ(again->ino, ino) << "a second inode for a file whose writes are on their way";
  auto o = answering([&] { return Open(again->ino, O_RDWR); });
  ASSERT_TRUE(o.ok()) << o.error().what;
  auto w = std::async(std::launch::async, [&] { return Write(o->file, Pattern(8192, 6), 0, O_DSYNC); });
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(nfs_.overlap_violations(), 0u) << "the new write went out over the old one on its way";
  nfs_.Resume();
  ASSERT_EQ(w.wait_for(30s), std::future_status::ready);
  ASSERT_TRUE(w.get().ok());
  ASSERT_TRUE(nfs_.Quiesce());
  EXPECT_EQ(nfs_.overlap_violations(), 0u);
  EXPECT_TRUE(ContentsOf("f") == Pattern(8192, 6)) << "the older write landed last";
  Close(o->file);
}

// A rename over a file open here hides that file first. When its last
// close comes before the rename is answered (or even before the hiding
// is), the rename's end decides: failed, the file gets its name back (the
// hidden name was its way back, and the close must not remove it);
// succeeded, the hidden name goes.
TEST_F(FilesystemTest, ALastCloseDuringARenameOverTheFileLeavesItToTheRename) {
  for (const bool close_before_hidden : {false, true}) {
    for (const bool fails : {true, false}) {
      SCOPED_TRACE(std::string(close_before_hidden ? "closed before the hiding is answered" : "closed after") +
                   (fails ? ", the rename fails" : ", the rename succeeds"));
      const std::string tag = std::to_string(close_before_hidden) + std::to_string(fails);
      OpenFile* src = CreateWith("src" + tag, "new");
      ASSERT_NE(src, nullptr);
      Close(src);
      OpenFile* dst = CreateWith("dst" + tag, "old");
      ASSERT_NE(dst, nullptr);
      ASSERT_TRUE(Flush(dst).ok());
      ASSERT_TRUE(nfs_.Quiesce());
      nfs_.Pause();
      auto renamed = std::make_shared<std::promise<Result<Ok>>>();
      fs_->Rename(cred_, kRoot, "src" + tag, kRoot, "dst" + tag, 0,
                  [renamed](Result<Ok> r) { renamed->set_value(std::move(r)); });
      // Up to the RENAME that hides "dst", or the one over it.
      const int stop_at = close_before_hidden ? 1 : 2;
      int renames = 0;
      while (nfs_.WaitPending(1)) {
        if (nfs_.Queued().front().proc == Proc::kRename && ++renames == stop_at) break;
        ASSERT_TRUE(nfs_.StepOne(0));
      }
      ASSERT_EQ(renames, stop_at) << "the rename never came";
      fs_->Release(dst);  // its last close
      std::this_thread::sleep_for(50ms);
      if (close_before_hidden) {
        ASSERT_TRUE(nfs_.StepOne(0));  // the hiding
        ASSERT_TRUE(nfs_.WaitPending(1));
      }
      if (fails) nfs_.FailNext(Proc::kRename, EIO, 1);
      ASSERT_TRUE(nfs_.StepOne(IndexOf(nfs_, Proc::kRename)));  // the rename over it
      nfs_.Resume();
      auto fr = renamed->get_future();
      ASSERT_EQ(fr.wait_for(30s), std::future_status::ready);
      EXPECT_EQ(fr.get().ok(), !fails);
      ASSERT_TRUE(nfs_.Quiesce());
      auto got = Lookup(kRoot, "dst" + tag);
      ASSERT_TRUE(got.ok());
      EXPECT_NE(got->ino, 0u) << "\"dst\" lost its file";
      EXPECT_EQ(ContentsOf("dst" + tag), fails ? "old" : "new");
      // (A removal marked and never ended would hold this listing for 10 s.)
      const auto t0 = std::chrono::steady_clock::now();
      auto l = List(kRoot, false);
      EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s) << "a hidden name's removal was left open";
      ASSERT_TRUE(l.ok());
      for (const auto& n : *l) EXPECT_NE(n.rfind(".mpnfs", 0), 0u) << "hidden name left behind: " << n;
    }
  }
}

// The hidden name of a file removed while another user has it open.
TEST_F(FilesystemTest, HiddenNameIsRemovedAsTheUserWhoRemovedTheFile) {
  auto d = Mkdir(kRoot, "d", 0755);
  ASSERT_TRUE(d.ok());
  auto c = Create(d->ino, "x", O_CREAT | O_WRONLY, 0644);
  ASSERT_TRUE(c.ok());
  Close(c->second.file);
  const Cred reader{2000, 2000, {}};
  auto ro = Wait<OpenOut>([&](auto cb) { fs_->Open(reader, c->first.ino, O_RDONLY, cb); });
  ASSERT_TRUE(ro.ok());
  ASSERT_TRUE(Unlink(d->ino, "x").ok());
  fs_->Release(ro->file);
  ASSERT_TRUE(nfs_.Quiesce());
  auto l = List(d->ino, false);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->size(), 2u) << "hidden name left behind: " << l->back();
}

// Unlink racing with the last close.
TEST_F(FilesystemTest, UnlinkRacingTheLastCloseLeavesNoHiddenName) {
  OpenFile* f = CreateWith("u", "data");
  ASSERT_NE(f, nullptr);
  ASSERT_TRUE(Flush(f).ok());
  ASSERT_TRUE(nfs_.Quiesce());
  nfs_.Pause();
  std::promise<Result<Ok>> un;
  fs_->Unlink(cred_, kRoot, "u", [&](Result<Ok> r) { un.set_value(std::move(r)); });
  ASSERT_TRUE(nfs_.WaitPending(1));
  ASSERT_TRUE(nfs_.StepOne());  // LOOKUP: open here -> RENAME queued
  ASSERT_TRUE(nfs_.WaitPending(1));
  fs_->Release(f);              // last close before the RENAME's reply
  nfs_.Resume();
  ASSERT_TRUE(un.get_future().get().ok());
  ASSERT_TRUE(nfs_.Quiesce());
  auto l = List(kRoot, false);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->size(), 2u) << "hidden name left behind: " << l->back();
}


// close(2) waits for FLUSH only; RELEASE, where the hidden name goes, comes
// after it on another thread. A listing (or rmdir) right after the close
// must not find the name.
TEST_F(FilesystemTest, AListingAfterTheLastCloseWaitsForTheHiddenNameToGo) {
  for (bool rmdir : {false, true}) {
    SCOPED_TRACE(rmdir ? "rmdir" : "listing");
    const std::string dname = rmdir ? "dr" : "dl";
    auto d = Mkdir(kRoot, dname, 0755);
    ASSERT_TRUE(d.ok());
    auto c = Create(d->ino, "x", O_CREAT | O_RDWR, 0644);
    ASSERT_TRUE(c.ok());
    OpenFile* f = c->second.file;
    ASSERT_TRUE(Write(f, "data", 0).ok());
    ASSERT_TRUE(Unlink(d->ino, "x").ok());
    auto l = List(d->ino, false);
    ASSERT_TRUE(l.ok());
    ASSERT_EQ(l->size(), 3u) << "no hidden name while open";
    ASSERT_TRUE(Flush(f).ok());  // close(2) returns here
    std::thread release([&] {
      std::this_thread::sleep_for(50ms);  // RELEASE served late, on another thread
      fs_->Release(f);
    });
    if (rmdir) {
      auto r = Rmdir(kRoot, dname);
      EXPECT_TRUE(r.ok()) << r.error().what;
    } else {
      l = List(d->ino, false);
      ASSERT_TRUE(l.ok());
      EXPECT_EQ(l->size(), 2u) << "hidden name listed after the last close: " << l->back();
    }
    release.join();
  }
}

// Two descriptors closed one after the other, the first RELEASE not yet
// come when the second close's FLUSH arrives: the listing still waits.
TEST_F(FilesystemTest, TheLastOfTwoClosesAlsoWaitsForTheHiddenNameToGo) {
  auto c = Create(kRoot, "two", O_CREAT | O_RDWR, 0644);
  ASSERT_TRUE(c.ok());
  OpenFile* f1 = c->second.file;
  auto o = Open(c->first.ino, O_RDWR);
  ASSERT_TRUE(o.ok());
  OpenFile* f2 = o->file;
  ASSERT_TRUE(Unlink(kRoot, "two").ok());
  ASSERT_TRUE(Flush(f1).ok());
  ASSERT_TRUE(Flush(f2).ok());  // close(2) of the last descriptor returns here
  std::thread release([&] {
    std::this_thread::sleep_for(50ms);
    fs_->Release(f1);
    fs_->Release(f2);
  });
  auto l = List(kRoot, false);
  release.join();
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->size(), 2u) << "hidden name listed after the last close: " << l->back();
}

// A reissued GUARDED CREATE answered EEXIST gives what the name holds, which
// may have been there before: open(O_CREAT|O_TRUNC) truncates it all the same.
TEST_F(FilesystemTest, CreateWithOTruncTruncatesAfterAReissuedCreate) {
  OpenFile* f = CreateWith("old", "old contents");
  ASSERT_NE(f, nullptr);
  Close(f);
  ASSERT_TRUE(nfs_.Quiesce());
  nfs_.set_drop_prob(1.0);  // every call runs twice, the second as a resend
  auto t = Create(kRoot, "old", O_CREAT | O_WRONLY | O_TRUNC);
  ASSERT_TRUE(nfs_.Quiesce());
  nfs_.set_drop_prob(0);
  ASSERT_TRUE(t.ok()) << t.error().what;
  Close(t->second.file);
  EXPECT_EQ(ContentsOf("old"), "");
}

// A close that is not the last (a duplicated descriptor) holds a listing up
// for the grace period at most, and the name stays while the file is open.
TEST_F(FilesystemTest, ACloseThatIsNotTheLastDoesNotHoldListingsUp) {
  auto c = Create(kRoot, "y", O_CREAT | O_RDWR, 0644);
  ASSERT_TRUE(c.ok());
  OpenFile* f = c->second.file;
  ASSERT_TRUE(Unlink(kRoot, "y").ok());
  ASSERT_TRUE(Flush(f).ok());  // one of two descriptors closed
  const auto t0 = std::chrono::steady_clock::now();
  auto l = List(kRoot, false);
  ASSERT_TRUE(l.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  EXPECT_EQ(l->size(), 3u) << "the open file's hidden name must stay";
  fs_->Release(f);
  ASSERT_TRUE(nfs_.Quiesce());
  l = List(kRoot, false);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->size(), 2u);
}

// Times set right after writes (tar x: futimens on the open descriptor) are
// the ones the server keeps: the write-behind WRITEs land first, and the
// data is committed, so that no resend after a server restart stamps the
// server's time over them.
TEST_F(FilesystemTest, TimesSetRightAfterWritesAreNotUndoneByThemOrTheirResend) {
  auto c = Create(kRoot, "t", O_CREAT | O_RDWR, 0644);
  ASSERT_TRUE(c.ok());
  Close(c->second.file);
  auto o = Open(c->first.ino, O_RDWR);
  ASSERT_TRUE(o.ok());
  const nfs::Fh fh = o->file->inode->fh();
  nfs_.Pause();  // the write stays on its way (acknowledged: write-behind)
  ASSERT_TRUE(Write(o->file, Pattern(256 << 10, 3), 0).ok());
  ASSERT_TRUE(nfs_.WaitPending(1));
  nfs::SetAttr sa;
  sa.mtime_how = sa.atime_how = nfs::SetAttr::TimeHow::kClient;
  sa.mtime = sa.atime = nfs::Time{1000000000, 5};
  std::promise<Result<AttrOut>> set;
  fs_->Setattr(cred_, c->first.ino, sa, [&](Result<AttrOut> r) { set.set_value(std::move(r)); });
  for (const auto& q : nfs_.Queued()) EXPECT_NE(q.proc, Proc::kSetattr) << "the SETATTR did not wait for the WRITE";
  nfs_.Resume();
  auto a = set.get_future().get();
  ASSERT_TRUE(a.ok()) << a.error().what;
  EXPECT_EQ(a->st.st_mtim.tv_sec, 1000000000);
  ASSERT_TRUE(nfs_.Quiesce());
  EXPECT_TRUE(nfs_.Attributes(fh)->mtime == (nfs::Time{1000000000, 5})) << "a WRITE landed after the SETATTR";
  nfs_.Restart();  // loses what was not committed before the SETATTR
  ASSERT_TRUE(Fsync(o->file).ok());
  Close(o->file);
  EXPECT_EQ(ContentsOf("t"), Pattern(256 << 10, 3));
  EXPECT_TRUE(nfs_.Attributes(fh)->mtime == (nfs::Time{1000000000, 5})) << "a resend landed after the SETATTR";
}

// open(O_CREAT|O_TRUNC) of a file that exists truncates it as open(O_TRUNC)
// does, mtime and ctime updated even if it was empty; of a new file it
// sends nothing more than the CREATE.
TEST_F(FilesystemTest, CreateWithOTruncTruncatesAnExistingFileAsOpenDoes) {
  auto c = Create(kRoot, "e", O_CREAT | O_WRONLY);
  ASSERT_TRUE(c.ok());
  Close(c->second.file);
  const nfs::Fh fh = *nfs_.FhOf("e");
  const nfs::Time empty_mtime = nfs_.Attributes(fh)->mtime;
  const size_t setattrs = nfs_.stats().Calls(Proc::kSetattr);
  auto again = Create(kRoot, "e", O_CREAT | O_WRONLY | O_TRUNC);
  ASSERT_TRUE(again.ok()) << again.error().what;
  Close(again->second.file);
  EXPECT_EQ(nfs_.stats().Calls(Proc::kSetattr), setattrs + 1);
  EXPECT_TRUE(empty_mtime < nfs_.Attributes(fh)->mtime) << "an empty file's mtime kept";
  OpenFile* f = CreateWith("full", "some data");
  ASSERT_NE(f, nullptr);
  Close(f);
  auto t = Create(kRoot, "full", O_CREAT | O_WRONLY | O_TRUNC);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->first.st.st_size, 0);
  Close(t->second.file);
  EXPECT_EQ(ContentsOf("full"), "");
  const size_t before = nfs_.stats().Calls(Proc::kSetattr);
  auto fresh = Create(kRoot, "new", O_CREAT | O_WRONLY | O_TRUNC);
  ASSERT_TRUE(fresh.ok());
  Close(fresh->second.file);
  EXPECT_EQ(nfs_.stats().Calls(Proc::kSetattr), before) << "a new file was truncated";
}

// A write that makes the server clear setuid/setgid is not written behind:
// its reply tells the kernel the new mode before the write returns (stat(1)
// asks the kernel for the mode alone, which it answers from its cache).
TEST_F(FilesystemTest, AWriteThatClearsSetuidTellsTheKernelBeforeItReturns) {
  std::mutex mu;
  std::vector<std::string> events;
  auto note = [&](std::string e) {
    std::lock_guard lock(mu);
    events.push_back(std::move(e));
  };
  const Cred root{0, 0, {}};
  auto c = Wait<std::pair<EntryOut, OpenOut>>(
      [&](auto cb) { fs_->Create(root, kRoot, "suid", 0644, O_CREAT | O_WRONLY, cb); });
  ASSERT_TRUE(c.ok());
  fs_->Release(c->second.file);
  nfs::SetAttr sa;
  sa.mode = 06777;
  ASSERT_TRUE(Wait<AttrOut>([&](auto cb) { fs_->Setattr(root, c->first.ino, sa, cb); }).ok());
  const uint64_t ino = c->first.ino;
  fs_->SetAttrInvalidator([&](uint64_t i) { note("invalidate " + std::to_string(i)); });
  auto o = Open(ino, O_WRONLY);  // cred_: uid 1000
  ASSERT_TRUE(o.ok());
  auto w = Wait<size_t>([&](auto cb) {
    fs_->Write(cred_, o->file, Buf("user data"), 0, 0, [&, cb](Result<size_t> r) {
      note("written");
      cb(std::move(r));
    });
  });
  ASSERT_TRUE(w.ok());
  {
    std::lock_guard lock(mu);
    EXPECT_EQ(events, (std::vector<std::string>{"invalidate " + std::to_string(ino), "written"}));
  }
  auto a = Wait<AttrOut>([&](auto cb) { fs_->Getattr(cred_, ino, cb); });
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->st.st_mode & 07777, 0777u);
  // An ordinary write afterwards tells the kernel nothing.
  ASSERT_TRUE(Write(o->file, "more", 9).ok());
  ASSERT_TRUE(Fsync(o->file).ok());
  {
    std::lock_guard lock(mu);
    EXPECT_EQ(events.size(), 2u);
  }
  Close(o->file);
}

TEST_F(FilesystemTest, SizeDoesNotShrinkWhileLostDataAwaitsResend) {
  OpenFile* f = CreateWith("sz", Pattern(8192, 7));
  ASSERT_EQ(StableOf("sz"), "") << "written stable: a restart would lose nothing";
  ASSERT_NE(f, nullptr);
  ASSERT_TRUE(nfs_.Quiesce());
  nfs_.Restart();
  auto a = Wait<AttrOut>([&](auto cb) { fs_->Getattr(cred_, f->inode->ino(), cb); });
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->st.st_size, 8192) << "size shrank while our unstable data awaits resend";
  ASSERT_TRUE(Fsync(f).ok());
  Close(f);
}

// The logs a resend reads are emptied once no resend is possible: a file
// written only FILE_SYNC (or only truncated) does not grow them forever.
TEST_F(FilesystemTest, ResendLogsDoNotGrowWithoutKeptData) {
  FsOptions o;
  o.sync = true;
  Mount(o);
  OpenFile* f = CreateWith("g", "x");
  ASSERT_NE(f, nullptr);
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(Write(f, Pattern(512, static_cast<uint32_t>(i)), static_cast<uint64_t>(i) * 100).ok());
    nfs::SetAttr sa;
    sa.size = 4000;
    ASSERT_TRUE(Wait<AttrOut>([&](auto cb) { fs_->Setattr(cred_, f->inode->ino(), sa, cb); }).ok());
  }
  ASSERT_TRUE(nfs_.Quiesce());
  {
    MutexLock lock(f->inode->writes.mu);
    EXPECT_TRUE(f->inode->writes.ResendLogsEmpty());
  }
  Close(f);
}

// ------------------------------------------------------------ the fake itself

const Cred kUser{1000, 1000, {}};
const Cred kRootCred{0, 0, {}};

template <class T>
struct Got {
  std::mutex mu;
  std::vector<Result<T>> replies;
  std::vector<std::thread::id> threads;
  nfs::Cb<T> Cb() {
    return [this](Result<T> r) {
      std::lock_guard lock(mu);
      replies.push_back(std::move(r));
      threads.push_back(std::this_thread::get_id());
    };
  }
  size_t size() {
    std::lock_guard lock(mu);
    return replies.size();
  }
};

// Synchronous call on the fake.
template <class T, class Start>
Result<T> Do(Start start) {
  return Wait<T>(start);
}

nfs::Fh MakeFile(FakeNfs& nfs, const std::string& name, const Cred& c = kUser,
                 uint32_t mode = 0644) {
  nfs::SetAttr sa;
  sa.mode = mode;
  auto r = Do<nfs::NewObject>([&](auto cb) {
    nfs.Create(nfs.root(), name, nfs::CreateMode::kGuarded, sa, 0, c, cb);
  });
  EXPECT_TRUE(r.ok());
  return r && r->fh ? *r->fh : nfs::Fh();
}

Result<nfs::WriteReply> WriteTo(FakeNfs& nfs, const nfs::Fh& fh, uint64_t off,
                                const std::string& s, bool stable) {
  return Do<nfs::WriteReply>(
      [&](auto cb) { nfs.Write(fh, off, Buf(s), 0, s.size(), stable, kUser, cb); });
}

TEST(FakeNfsTest, CallbacksRunOnTheDispatcherThread) {
  FakeNfs nfs;
  Got<nfs::Attr> got;
  nfs.Getattr(nfs.root(), kUser, got.Cb());
  ASSERT_TRUE(nfs.Quiesce());
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(got.replies[0].ok());
  EXPECT_NE(got.threads[0], std::this_thread::get_id());
  auto stale = Do<nfs::Attr>([&](auto cb) { nfs.Getattr("no-such-handle", kUser, cb); });
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.error().err, ESTALE);
}

TEST(FakeNfsTest, PauseHoldsCallsAndStepOneRunsTheChosenOne) {
  FakeNfs nfs;
  nfs.Pause();
  Got<nfs::Attr> got;
  const nfs::Fh f = "fh:x";  // unknown: answered ESTALE, which tells the calls apart
  nfs.Getattr(nfs.root(), kUser, got.Cb());
  nfs.Getattr(f, kUser, got.Cb());
  ASSERT_TRUE(nfs.WaitPending(2));
  std::this_thread::sleep_for(5ms);
  EXPECT_EQ(got.size(), 0u) << "paused calls must not execute";
  ASSERT_EQ(nfs.Queued().size(), 2u);
  EXPECT_EQ(nfs.Queued()[1].fh, f);
  ASSERT_TRUE(nfs.StepOne(1));  // the second call first
  ASSERT_EQ(got.size(), 1u);
  EXPECT_FALSE(got.replies[0].ok());
  EXPECT_EQ(nfs.Pending(), 1u);
  ASSERT_TRUE(nfs.StepOne());
  EXPECT_FALSE(nfs.StepOne()) << "nothing left to step";
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(got.replies[1].ok());
  nfs.Resume();
}

TEST(FakeNfsTest, OverlappingWriteArrivingWhileAnotherIsUnansweredIsCounted) {
  FakeNfs nfs;
  const nfs::Fh fh = MakeFile(nfs, "f");
  const nfs::Fh other = MakeFile(nfs, "g");
  nfs.Pause();
  Got<nfs::WriteReply> got;
  auto send = [&](const nfs::Fh& h, uint64_t off, size_t len) {
    nfs.Write(h, off, Buf(std::string(len, 'x')), 0, len, false, kUser, got.Cb());
  };
  send(fh, 0, 10);
  send(fh, 10, 10);     // adjacent: fine
  send(other, 0, 10);   // another file: fine
  EXPECT_EQ(nfs.overlap_violations(), 0u);
  send(fh, 5, 10);      // overlaps both pending writes: one violation
  EXPECT_EQ(nfs.overlap_violations(), 1u);
  nfs.Resume();
  ASSERT_TRUE(nfs.Quiesce());
  send(fh, 0, 20);  // everything answered: fine
  ASSERT_TRUE(nfs.Quiesce());
  EXPECT_EQ(nfs.overlap_violations(), 1u);
  EXPECT_EQ(got.size(), 5u);
}

TEST(FakeNfsTest, DroppedReplyExecutesTheCallAgainAndAnswersOnce) {
  FakeNfs nfs;
  const nfs::Fh fh = MakeFile(nfs, "f");
  nfs.Pause();
  nfs.set_drop_prob(1);
  Got<nfs::WriteReply> got;
  nfs.Write(fh, 0, Buf("aaaa"), 0, 4, false, kUser, got.Cb());
  ASSERT_TRUE(nfs.StepOne());
  EXPECT_EQ(got.size(), 0u) << "the reply was lost";
  EXPECT_EQ(nfs.Contents(fh), "aaaa") << "but the server executed the call";
  EXPECT_EQ(nfs.Pending(), 1u) << "the retransmission waits";
  // Still in flight: an overlapping WRITE now breaks the ordering rule.
  nfs.Write(fh, 2, Buf("bb"), 0, 2, false, kUser, got.Cb());
  EXPECT_EQ(nfs.overlap_violations(), 1u);
  ASSERT_TRUE(nfs.StepOne(1));  // the later WRITE executes (dropped once too)...
  ASSERT_TRUE(nfs.StepOne(0));  // ...then the retransmission of the first:
  EXPECT_EQ(nfs.Contents(fh), "aaaa") << "the older data lands last";
  nfs.Resume();
  ASSERT_TRUE(nfs.Quiesce());
  EXPECT_EQ(got.size(), 2u);
  const auto st = nfs.stats();
  EXPECT_EQ(st.Calls(Proc::kWrite), 2u);
  EXPECT_EQ(st.dropped_replies, 2u);
}

TEST(FakeNfsTest, ResentRemoveAndMkdirFollowNfs3ReissueRules) {
  FakeNfs nfs;
  MakeFile(nfs, "f");
  nfs.set_drop_prob(1);
  auto rm = Do<nfs::Wcc>([&](auto cb) { nfs.Remove(nfs.root(), "f", kUser, cb); });
  EXPECT_TRUE(rm.ok()) << "a resent REMOVE that finds nothing succeeded the first time";
  auto md = Do<nfs::NewObject>([&](auto cb) { nfs.Mkdir(nfs.root(), "d", {}, kUser, cb); });
  ASSERT_TRUE(md.ok());
  EXPECT_EQ(md->fh, nfs.FhOf("d"));
}

TEST(FakeNfsTest, FailNextFailsThatManyExecutionsAndChangesNothing) {
  FakeNfs nfs;
  const nfs::Fh fh = MakeFile(nfs, "f");
  nfs.FailNext(Proc::kWrite, ENOSPC, 2);
  for (int i = 0; i < 2; ++i) {
    auto w = WriteTo(nfs, fh, 0, "data", false);
    ASSERT_FALSE(w.ok());
    EXPECT_EQ(w.error().err, ENOSPC);
  }
  EXPECT_EQ(nfs.Contents(fh), "");
  EXPECT_TRUE(WriteTo(nfs, fh, 0, "data", false).ok());
  EXPECT_EQ(nfs.Contents(fh), "data");
}

TEST(FakeNfsTest, StabilityCommitAndRestart) {
  FakeNfs nfs;
  const nfs::Fh fh = MakeFile(nfs, "f");
  auto s = WriteTo(nfs, fh, 0, "stable", true);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->stable);
  auto u = WriteTo(nfs, fh, 6, "+unstable", false);
  ASSERT_TRUE(u.ok());
  EXPECT_FALSE(u->stable);
  EXPECT_EQ(u->verf, nfs.write_verifier());
  ASSERT_TRUE(u->wcc.before && u->wcc.after);
  EXPECT_EQ(u->wcc.before->size, 6u);
  EXPECT_EQ(u->wcc.after->size, 15u);
  EXPECT_LT(u->wcc.before->mtime, u->wcc.after->mtime);
  EXPECT_EQ(nfs.Contents(fh), "stable+unstable");
  EXPECT_EQ(nfs.StableContents(fh), "stable");

  nfs.Restart();
  EXPECT_EQ(nfs.Contents(fh), "stable");
  EXPECT_EQ(nfs.Attributes(fh)->size, 6u);
  EXPECT_NE(nfs.write_verifier(), u->verf);

  ASSERT_TRUE(WriteTo(nfs, fh, 6, "!", false).ok());
  auto c = Do<nfs::CommitReply>([&](auto cb) { nfs.Commit(fh, kUser, cb); });
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->verf, nfs.write_verifier());
  nfs.Restart();
  EXPECT_EQ(nfs.Contents(fh), "stable!");

  nfs.set_wcc_before(false);
  auto g = WriteTo(nfs, fh, 0, "S", false);
  ASSERT_TRUE(g.ok());
  EXPECT_FALSE(g->wcc.before) << "Ganesha-like: no pre-operation attributes";
  EXPECT_TRUE(g->wcc.after);
}

TEST(FakeNfsTest, CreateModes) {
  FakeNfs nfs;
  const nfs::Fh root = nfs.root();
  auto create = [&](nfs::CreateMode m, uint64_t verf, nfs::SetAttr sa = {}) {
    return Do<nfs::NewObject>([&](auto cb) { nfs.Create(root, "f", m, sa, verf, kUser, cb); });
  };
  auto e1 = create(nfs::CreateMode::kExclusive, 7);
  ASSERT_TRUE(e1.ok());
  auto e2 = create(nfs::CreateMode::kExclusive, 7);
  ASSERT_TRUE(e2.ok()) << "the same verifier: our own create, resent";
  EXPECT_EQ(e1->fh, e2->fh);
  auto e3 = create(nfs::CreateMode::kExclusive, 8);
  ASSERT_FALSE(e3.ok());
  EXPECT_EQ(e3.error().err, EEXIST);
  auto g = create(nfs::CreateMode::kGuarded, 0);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.error().err, EEXIST);

  ASSERT_TRUE(WriteTo(nfs, *e1->fh, 0, "abc", true).ok());
  nfs::SetAttr trunc;
  trunc.size = 0;
  auto u = create(nfs::CreateMode::kUnchecked, 0, trunc);
  ASSERT_TRUE(u.ok()) << "UNCHECKED opens the existing file";
  EXPECT_EQ(u->fh, e1->fh);
  EXPECT_EQ(nfs.Contents(*e1->fh), "");
  EXPECT_EQ(nfs.StableContents(*e1->fh), "");
}

TEST(FakeNfsTest, DirectoryRules) {
  FakeNfs nfs;
  const nfs::Fh root = nfs.root();
  auto mkdir = [&](const nfs::Fh& dir, const std::string& name) {
    auto r = Do<nfs::NewObject>([&](auto cb) { nfs.Mkdir(dir, name, {}, kUser, cb); });
    EXPECT_TRUE(r.ok());
    return *r->fh;
  };
  const nfs::Fh a = mkdir(root, "a");
  const nfs::Fh b = mkdir(a, "b");
  EXPECT_EQ(nfs.Attributes(a)->nlink, 3u);
  EXPECT_EQ(nfs.FhOf("a/b"), b);
  auto rmdir = Do<nfs::Wcc>([&](auto cb) { nfs.Rmdir(root, "a", kUser, cb); });
  ASSERT_FALSE(rmdir.ok());
  EXPECT_EQ(rmdir.error().err, ENOTEMPTY);
  auto into_self = Do<nfs::RenameReply>([&](auto cb) { nfs.Rename(root, "a", b, "x", kUser, cb); });
  ASSERT_FALSE(into_self.ok());
  EXPECT_EQ(into_self.error().err, EINVAL);

  // RENAME over an existing file; LINK counts links; the last name's removal
  // makes the handle stale.
  const nfs::Fh f = MakeFile(nfs, "f");
  const nfs::Fh g = MakeFile(nfs, "g");
  auto ln = Do<nfs::LinkReply>([&](auto cb) { nfs.Link(f, a, "f2", kUser, cb); });
  ASSERT_TRUE(ln.ok());
  EXPECT_EQ(ln->attr->nlink, 2u);
  auto mv = Do<nfs::RenameReply>([&](auto cb) { nfs.Rename(root, "f", root, "g", kUser, cb); });
  ASSERT_TRUE(mv.ok());
  EXPECT_EQ(nfs.FhOf("g"), f);
  EXPECT_FALSE(nfs.Attributes(g)) << "the replaced file had no other name";
  EXPECT_EQ(nfs.Attributes(f)->nlink, 2u);
  ASSERT_TRUE(Do<nfs::Wcc>([&](auto cb) { nfs.Remove(root, "g", kUser, cb); }).ok());
  ASSERT_TRUE(Do<nfs::Wcc>([&](auto cb) { nfs.Remove(a, "f2", kUser, cb); }).ok());
  auto stale = Do<nfs::Attr>([&](auto cb) { nfs.Getattr(f, kUser, cb); });
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.error().err, ESTALE);
}

TEST(FakeNfsTest, AccessChecksModeBitsAgainstTheCred) {
  FakeNfs nfs;
  const nfs::Fh fh = MakeFile(nfs, "f", kUser, 0640);
  auto access = [&](const Cred& c) {
    auto r = Do<nfs::AccessReply>([&](auto cb) { nfs.Access(fh, 0x3f, c, cb); });
    EXPECT_TRUE(r.ok());
    return r->access;
  };
  using namespace nfs;
  EXPECT_EQ(access(kUser), kAccessRead | kAccessModify | kAccessExtend);
  EXPECT_EQ(access(Cred{2000, 2000, {1000}}), kAccessRead) << "group member";
  EXPECT_EQ(access(Cred{2000, 2000, {}}), 0u);
  EXPECT_EQ(access(kRootCred), kAccessRead | kAccessModify | kAccessExtend)
      << "root may not execute a file with no x bit";
  nfs::SetAttr sa;
  sa.mode = 0100;
  ASSERT_TRUE(Do<nfs::Wcc>([&](auto cb) { nfs.Setattr(fh, sa, kUser, cb); }).ok());
  EXPECT_EQ(access(kRootCred),
            kAccessRead | kAccessModify | kAccessExtend | kAccessExecute);
  auto chown = Do<nfs::Wcc>([&](auto cb) {
    nfs::SetAttr s;
    s.uid = 3000;
    nfs.Setattr(fh, s, kUser, cb);
  });
  ASSERT_FALSE(chown.ok());
  EXPECT_EQ(chown.error().err, EPERM);
  const auto hist = nfs.History();
  ASSERT_FALSE(hist.empty());
  EXPECT_EQ(hist.back().proc, Proc::kSetattr);
  EXPECT_EQ(hist.back().cred.uid, 1000u);
}

TEST(FakeNfsTest, DestructorFailsQueuedCallsWithEio) {
  Got<nfs::Attr> got;
  {
    FakeNfs nfs;
    nfs.Pause();
    nfs.Getattr(nfs.root(), kUser, got.Cb());
    nfs.Getattr(nfs.root(), kUser, got.Cb());
    ASSERT_TRUE(nfs.WaitPending(2));
  }
  ASSERT_EQ(got.size(), 2u);
  for (auto& r : got.replies) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().err, EIO);
  }
}

// ------------------------------------------------------------ write-back

// FORGET of every lookup the kernel holds.
constexpr uint64_t kAllLookups = uint64_t{1} << 40;

// A mount with an SSD cache in write-back mode (in a fresh directory).
class WriteBackTest : public FilesystemTest {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/mpnfs-fs-wb-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
    cache::CacheOptions o;
    o.dir = dir_;
    o.size = 1 << 20;
    o.block = 64 << 10;
    o.mode = cache::CacheMode::kWriteBack;
    o.dirty_age_s = 3600;
    Tune(o);
    auto c = cache::BlockCache::Open(o);
    ASSERT_TRUE(c.ok()) << c.error().what;
    cache_ = std::move(c.value());
    fs_ = std::make_unique<Filesystem>(nfs_, nfs_.root(), FsOptions{}, cache_);
  }
  void TearDown() override {
    FilesystemTest::TearDown();
    cache_.reset();
    std::filesystem::remove_all(dir_);
  }
  virtual void Tune(cache::CacheOptions&) {}
  uint64_t Dirty() const { return cache_->Stats().dirty_bytes; }
  // The kernel forgets `ino` (file `name`, `data` in the cache only) while
  // `stale(true)` makes the server answer ESTALE although the file is there
  // (memory pressure, not a removal): the writes stay, and reach the server
  // after `stale(false)`.
  void ForgetWhileStaleKeepsTheWrites(uint64_t ino, const std::string& name, const std::string& data,
                                      const std::function<void(bool)>& stale) {
    const uint64_t dirty = Dirty();
    stale(true);
    const uint64_t asked = nfs_.stats().Calls(Proc::kGetattr);
    fs_->Forget(ino, kAllLookups);
    ASSERT_TRUE(nfs_.Quiesce());
    EXPECT_GT(nfs_.stats().Calls(Proc::kGetattr), asked) << "the server was not asked: the test shows nothing";
    EXPECT_EQ(Dirty(), dirty) << "a file the server still has lost its writes";
    stale(false);
    ASSERT_TRUE(fs_->FlushCache().ok());
    EXPECT_EQ(ContentsOf(name), data);
  }
  // A closed file `name` whose `data` is in the cache only; its inode number.
  uint64_t ClosedDirtyFile(const std::string& name, const std::string& data) {
    const uint64_t before = Dirty();
    OpenFile* f = CreateWith(name, data);
    EXPECT_NE(f, nullptr);
    if (!f) return 0;
    const uint64_t ino = f->inode->ino();
    Close(f);
    EXPECT_GT(Dirty(), before) << "the write should be in the cache only";
    return ino;
  }

  std::string dir_;
  std::shared_ptr<cache::BlockCache> cache_;
};

TEST_F(WriteBackTest, InterruptEndsAFlushTheServerNeverAnswers) {
  OpenFile* f = CreateWith("f", Pattern(8192, 3));
  ASSERT_NE(f, nullptr);
  const uint64_t dirty = Dirty();
  ASSERT_GT(dirty, 0u) << "the write should be in the cache only";
  nfs_.Pause();  // the server answers nothing from now on
  auto flush = std::async(std::launch::async, [this] { return fs_->FlushCache(); });
  ASSERT_TRUE(nfs_.WaitPending(1));  // the flush's WRITE waits for the server
  fs_->InterruptFlush();
  auto r = flush.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().err, EINTR);
  EXPECT_EQ(Dirty(), dirty) << "unflushed data stays in the cache for the next mount";
  // Nothing more is sent, and the abandoned round's late answer changes nothing.
  nfs_.Resume();
  ASSERT_TRUE(nfs_.Quiesce());
  EXPECT_EQ(nfs_.stats().Calls(Proc::kCommit), 0u);
  auto again = fs_->FlushCache();
  EXPECT_FALSE(again.ok());
  EXPECT_EQ(Dirty(), dirty);
  fs_->Release(f);
}

// Until the cache holds `bytes` dirty bytes (the drop after a remove runs
// in the background); false after 10 s.
bool DirtyBecomes(const cache::BlockCache& cache, uint64_t bytes) {
  for (int i = 0; i < 1000; ++i) {
    if (cache.Stats().dirty_bytes == bytes) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// A file's unflushed cached writes die with it: once the kernel forgets a
// file whose last name went, they are not sent (before, the flusher sent
// them, got ESTALE and warned). A file that keeps another name, or that the
// kernel forgot only to save memory, keeps them.
TEST_F(WriteBackTest, AFileForgottenAfterItsLastNameWentLosesItsUnflushedWritesUnsent) {
  const uint64_t ino = ClosedDirtyFile("f", Pattern(8192, 3));
  ASSERT_NE(ino, 0u);
  const uint64_t dirty = Dirty();
  const uint64_t writes = nfs_.stats().Calls(Proc::kWrite);
  ASSERT_TRUE(Unlink(kRoot, "f").ok());
  EXPECT_EQ(Dirty(), dirty) << "nothing goes before the kernel lets go of the file";
  fs_->Forget(ino, kAllLookups);
  EXPECT_TRUE(DirtyBecomes(*cache_, 0)) << Dirty() << " dirty bytes of a removed file are kept";
  ASSERT_TRUE(fs_->FlushCache().ok());
  EXPECT_EQ(nfs_.stats().Calls(Proc::kWrite), writes) << "a removed file's writes were sent";
}

TEST_F(WriteBackTest, AFileForgottenWithANameLeftKeepsItsUnflushedWrites) {
  const uint64_t ino = ClosedDirtyFile("f", Pattern(8192, 4));
  ASSERT_NE(ino, 0u);
  auto l = Wait<EntryOut>([&](auto cb) { fs_->Link(cred_, ino, kRoot, "g", cb); });
  ASSERT_TRUE(l.ok()) << l.error().what;
  const uint64_t dirty = Dirty();
  ASSERT_GT(dirty, 0u);
  ASSERT_TRUE(Unlink(kRoot, "f").ok());
  fs_->Forget(ino, kAllLookups);
  ASSERT_TRUE(nfs_.Quiesce());  // (the GETATTR that finds the file there)
  EXPECT_EQ(Dirty(), dirty);
  ASSERT_TRUE(fs_->FlushCache().ok());
  EXPECT_EQ(ContentsOf("g"), Pattern(8192, 4));
}

// Asked as root, a server that squashes root and checks the path (knfsd's
// subtree_check) answers ESTALE for a live file: the question goes as the
// user who wrote the writes, which are kept.
TEST_F(WriteBackTest, AForgottenFileIsAskedAboutAsTheUserWhoWroteIt) {
  const uint64_t ino = ClosedDirtyFile("f", Pattern(8192, 8));
  ASSERT_NE(ino, 0u);
  ForgetWhileStaleKeepsTheWrites(ino, "f", Pattern(8192, 8), [&](bool on) {
    nfs_.set_stale_to_others(on ? std::optional<uint32_t>(cred_.uid) : std::nullopt);
  });
}

// A server that answers ESTALE for every handle for a
// while (exports not loaded yet, a failover) has not lost the file: the
// export's root is asked too.
TEST_F(WriteBackTest, AServerStaleForEveryHandleDoesNotMakeAForgottenFileLoseItsWrites) {
  const uint64_t ino = ClosedDirtyFile("f", Pattern(8192, 9));
  ASSERT_NE(ino, 0u);
  ForgetWhileStaleKeepsTheWrites(ino, "f", Pattern(8192, 9), [&](bool on) { nfs_.set_all_stale(on); });
}

// Writes applied to a forgotten file while the server is asked about it
// (another user's, through a cached handle) were not asked about: kept,
// while those asked about go.
TEST_F(WriteBackTest, WritesMadeWhileAForgottenFileIsAskedAboutAreKept) {
  const uint64_t ino = ClosedDirtyFile("f", Pattern(8192, 11));
  ASSERT_NE(ino, 0u);
  const nfs::Fh fh = *nfs_.FhOf("f");
  ASSERT_TRUE(Unlink(kRoot, "f").ok());
  nfs_.Pause();
  fs_->Forget(ino, kAllLookups);
  // The root, then the file (stale); before the root is asked again, a
  // write lands in the cache.
  int roots = 0;
  while (nfs_.WaitPending(1)) {
    const auto q = nfs_.Queued().front();
    if (q.proc == Proc::kGetattr && q.fh == nfs_.root() && ++roots == 2) break;
    ASSERT_TRUE(nfs_.StepOne(0));
  }
  ASSERT_EQ(roots, 2) << "the server was not asked: the test shows nothing";
  const std::string more = Pattern(4096, 12);
  cache::WbWrite w;
  w.fh = fh;
  w.off = 65536;
  w.data = more.data();
  w.len = more.size();
  w.uid = 2000;
  w.gid = 2000;
  std::promise<cache::WbOutcome> stored;
  cache_->WriteBack(std::move(w), [&stored](cache::WbOutcome o) { stored.set_value(std::move(o)); });
  ASSERT_EQ(stored.get_future().get().kind, cache::WbOutcome::kStored);
  ASSERT_GT(Dirty(), more.size());
  nfs_.Resume();
  ASSERT_TRUE(nfs_.Quiesce());
  EXPECT_EQ(Dirty(), more.size()) << "the writes asked about go, those nobody asked about stay";
}

// A file the server answers stale for, but that this mount looked up again
// while the server was being asked (a new inode for its handle), is in use:
// its writes are kept.
TEST_F(WriteBackTest, AFileLookedUpAgainWhileTheServerIsAskedKeepsItsWrites) {
  const uint64_t ino = ClosedDirtyFile("f", Pattern(8192, 10));
  ASSERT_NE(ino, 0u);
  const uint64_t dirty = Dirty();
  nfs_.Pause();
  fs_->Forget(ino, kAllLookups);
  ASSERT_TRUE(nfs_.WaitPending(1));  // the export's root, asked first
  auto again = std::async(std::launch::async, [this] { return Lookup(kRoot, "f"); });
  ASSERT_TRUE(nfs_.WaitPending(2));
  ASSERT_EQ(nfs_.Queued()[1].proc, Proc::kLookup);
  ASSERT_TRUE(nfs_.StepOne(1));
  ASSERT_TRUE(again.get().ok());
  // Gone from the server now (another client removed it).
  std::promise<Result<nfs::Wcc>> rm;
  nfs_.Remove(nfs_.root(), "f", cred_, [&rm](Result<nfs::Wcc> r) { rm.set_value(std::move(r)); });
  ASSERT_TRUE(nfs_.WaitPending(2));
  ASSERT_TRUE(nfs_.StepOne(1));
  ASSERT_TRUE(rm.get_future().get().ok());
  const uint64_t asked = nfs_.stats().Calls(Proc::kGetattr);
  nfs_.Resume();
  ASSERT_TRUE(nfs_.Quiesce());
  EXPECT_EQ(nfs_.stats().Calls(Proc::kGetattr), asked + 2) << "the file and the root asked again: the test shows nothing";
  EXPECT_EQ(Dirty(), dirty) << "the writes of a file looked up again were dropped";
}

TEST_F(WriteBackTest, ARenameOverAFileDropsTheReplacedFilesUnflushedWrites) {
  const uint64_t a_ino = ClosedDirtyFile("a", Pattern(8192, 5));
  ASSERT_NE(a_ino, 0u);
  const uint64_t one = Dirty();
  OpenFile* b = CreateWith("b", Pattern(4096, 6));
  ASSERT_NE(b, nullptr);
  Close(b);
  ASSERT_GT(Dirty(), one);
  const uint64_t b_dirty = Dirty() - one;
  ASSERT_TRUE(Rename(kRoot, "b", kRoot, "a").ok());
  fs_->Forget(a_ino, kAllLookups);
  EXPECT_TRUE(DirtyBecomes(*cache_, b_dirty)) << Dirty() << " dirty bytes; the renamed file has " << b_dirty;
  ASSERT_TRUE(fs_->FlushCache().ok());
  EXPECT_EQ(ContentsOf("a"), Pattern(4096, 6));
}

TEST_F(WriteBackTest, AFileRemovedWhileOpenKeepsItsWritesUntilItsLastClose) {
  OpenFile* f = CreateWith("f", Pattern(8192, 7));
  ASSERT_NE(f, nullptr);
  const uint64_t dirty = Dirty();
  ASSERT_GT(dirty, 0u);
  const uint64_t writes = nfs_.stats().Calls(Proc::kWrite);
  ASSERT_TRUE(Unlink(kRoot, "f").ok());
  ASSERT_TRUE(nfs_.Quiesce());
  EXPECT_EQ(Dirty(), dirty) << "an open file's writes must stay readable";
  auto r = Read(f, 8192, 0);
  ASSERT_TRUE(r.ok()) << r.error().what;
  EXPECT_EQ(*r, Pattern(8192, 7));
  // The kernel lets go of the inode after the last close, before or after
  // the hidden name's removal answers: the drop follows whichever is last.
  const uint64_t ino = f->inode->ino();
  Close(f);
  fs_->Forget(ino, kAllLookups);
  EXPECT_TRUE(DirtyBecomes(*cache_, 0)) << Dirty() << " dirty bytes kept after the last close";
  ASSERT_TRUE(fs_->FlushCache().ok());
  EXPECT_EQ(nfs_.stats().Calls(Proc::kWrite), writes);
}

// A root-owned file with `mode`, in the root; its inode number.
uint64_t SetuidFile(Filesystem& fs, const std::string& name, uint32_t mode) {
  const Cred root{0, 0, {}};
  auto c = Wait<std::pair<EntryOut, OpenOut>>(
      [&](auto cb) { fs.Create(root, kRoot, name, 0644, O_CREAT | O_WRONLY, cb); });
  EXPECT_TRUE(c.ok()) << c.error().what;
  if (!c) return 0;
  fs.Release(c->second.file);
  nfs::SetAttr sa;
  sa.mode = mode;
  auto a = Wait<AttrOut>([&](auto cb) { fs.Setattr(root, c->first.ino, sa, cb); });
  EXPECT_TRUE(a.ok() && (a->st.st_mode & 07777) == mode);
  return c->first.ino;
}

TEST_F(WriteBackTest, ANonRootWriteClearsSetuidAndSetgidWhenItIsTaken) {
  for (uint32_t mode : {04777u, 02777u, 06777u}) {
    const std::string name = "suid-" + std::to_string(mode);
    const uint64_t ino = SetuidFile(*fs_, name, mode);
    auto o = Open(ino, O_WRONLY);
    ASSERT_TRUE(o.ok()) << o.error().what;
    ASSERT_TRUE(Write(o->file, "user data", 4096).ok());  // cred_: uid 1000
    auto a = Wait<AttrOut>([&](auto cb) { fs_->Getattr(cred_, ino, cb); });
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(a->st.st_mode & 07777, 0777u) << std::oct << mode;
    EXPECT_EQ(ContentsOf(name).substr(4096), "user data");
    Close(o->file);
  }
  EXPECT_EQ(Dirty(), 0u);
}

TEST_F(WriteBackTest, AChmodAfterCachedWritesIsNotUndoneByTheirFlush) {
  // `cc -o prog; chmod u+s prog` by a user: the chmod must not be undone
  // when the cached writes reach the server later (it clears setuid then).
  OpenFile* f = CreateWith("prog", Pattern(8192, 5));  // cred_: uid 1000
  ASSERT_NE(f, nullptr);
  ASSERT_GT(Dirty(), 0u);
  const uint64_t ino = f->inode->ino();
  Close(f);
  nfs::SetAttr sa;
  sa.mode = 04755;
  auto a = Wait<AttrOut>([&](auto cb) { fs_->Setattr(cred_, ino, sa, cb); });
  ASSERT_TRUE(a.ok()) << a.error().what;
  ASSERT_TRUE(fs_->FlushCache().ok());
  EXPECT_EQ(Dirty(), 0u);
  EXPECT_EQ(ContentsOf("prog"), Pattern(8192, 5));
  auto fh = nfs_.FhOf("prog");
  ASSERT_TRUE(fh);
  auto back = Wait<nfs::Attr>([&](auto cb) { nfs_.Getattr(*fh, cred_, cb); });
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->mode & 07777, 04755u) << std::oct << back->mode;
}

// cp -p: the data is in the cache at close, the times are set by path
// after it. The cached writes reach the server first.
TEST_F(WriteBackTest, TimesSetAfterCachedWritesAreNotUndoneByTheirFlush) {
  OpenFile* f = CreateWith("cp", Pattern(8192, 6));
  ASSERT_NE(f, nullptr);
  ASSERT_GT(Dirty(), 0u);
  const uint64_t ino = f->inode->ino();
  Close(f);
  nfs::SetAttr sa;
  sa.mtime_how = sa.atime_how = nfs::SetAttr::TimeHow::kClient;
  sa.mtime = sa.atime = nfs::Time{1000000000, 7};
  auto a = Wait<AttrOut>([&](auto cb) { fs_->Setattr(cred_, ino, sa, cb); });
  ASSERT_TRUE(a.ok()) << a.error().what;
  ASSERT_TRUE(fs_->FlushCache().ok());
  EXPECT_EQ(ContentsOf("cp"), Pattern(8192, 6));
  EXPECT_TRUE(nfs_.Attributes(*nfs_.FhOf("cp"))->mtime == (nfs::Time{1000000000, 7}));
}

TEST_F(WriteBackTest, RootsWriteToASetuidFileStaysInTheCache) {
  const uint64_t ino = SetuidFile(*fs_, "suid", 04755);
  const Cred root{0, 0, {}};
  auto o = Wait<OpenOut>([&](auto cb) { fs_->Open(root, ino, O_WRONLY, cb); });
  ASSERT_TRUE(o.ok());
  auto w = Wait<size_t>([&](auto cb) { fs_->Write(root, o->file, Buf("root data"), 4096, 0, cb); });
  ASSERT_TRUE(w.ok());
  EXPECT_GT(Dirty(), 0u);
  auto a = Wait<AttrOut>([&](auto cb) { fs_->Getattr(root, ino, cb); });
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->st.st_mode & 07777, 04755u);
  fs_->Release(o->file);
}

// wb_fsync=server: a write with its own O_DSYNC (pwritev2 RWF_DSYNC) is on
// the server when it returns; the open's plain writes stay in the cache.
// Parameters: the open's flags (a direct one gets no FSYNC from the kernel
// after the write), and the synced write's offset (not page-aligned: the
// cache first fetches the server's copy of the partial pages).
class WriteBackFsyncServerTest : public WriteBackTest,
                                 public ::testing::WithParamInterface<std::tuple<int, uint64_t>> {
 protected:
  void Tune(cache::CacheOptions& o) override { o.fsync_server = true; }
};

TEST_P(WriteBackFsyncServerTest, AWritesOwnDsyncFlagPutsItOnTheServerWhenItReturns) {
  const auto [open_flags, off] = GetParam();
  auto c = Create(kRoot, "wbrwf", O_CREAT | O_WRONLY);
  ASSERT_TRUE(c.ok());
  fs_->Release(c->second.file);
  auto o = Open(c->first.ino, open_flags);
  ASSERT_TRUE(o.ok());
  const std::string plain = Pattern(4096, 1), synced = Pattern(4096, 2);
  ASSERT_TRUE(Write(o->file, plain, 0, open_flags).ok());
  ASSERT_GT(Dirty(), 0u) << "the plain write did not stay in the cache: the test shows nothing";
  EXPECT_EQ(StableOf("wbrwf"), "");
  ASSERT_TRUE(Write(o->file, synced, off, open_flags | O_DSYNC).ok());
  const std::string stable = StableOf("wbrwf");
  ASSERT_EQ(stable.size(), off + 4096u);
  EXPECT_EQ(stable.substr(off), synced);
  EXPECT_EQ(stable.substr(0, 4096), plain);
  fs_->Release(o->file);
}

INSTANTIATE_TEST_SUITE_P(OpensAndOffsets, WriteBackFsyncServerTest,
                         ::testing::Combine(::testing::Values(O_WRONLY, O_WRONLY | O_DIRECT),
                                            ::testing::Values(uint64_t{65536}, uint64_t{65536 + 100})));

// A write refused before anything is sent (the server's copy of a partial
// page could not be read) also makes the next open drop the kernel's pages.
TEST_F(WriteBackTest, AWriteRefusedBeforeItIsSentDropsTheKernelsPagesAtTheNextOpen) {
  auto c = Create(kRoot, "refused-early", O_CREAT | O_WRONLY);
  ASSERT_TRUE(c.ok());
  fs_->Release(c->second.file);
  const uint64_t ino = c->first.ino;
  auto keeps = [&] {
    auto r = Open(ino, O_RDONLY);
    EXPECT_TRUE(r.ok());
    if (!r.ok()) return false;
    fs_->Release(r->file);
    return r->keep_cache;
  };
  auto o = Open(ino, O_WRONLY);
  ASSERT_TRUE(o.ok());
  ASSERT_TRUE(Write(o->file, Pattern(4096, 1), 0, O_WRONLY).ok());
  keeps();
  ASSERT_TRUE(keeps()) << "nothing changed since the last open: the test shows nothing";
  nfs_.FailNext(Proc::kRead, EIO, 1);
  ASSERT_FALSE(Write(o->file, "partial", 65536 + 100, O_WRONLY).ok())
      << "the partial page was not fetched: the test shows nothing";
  EXPECT_FALSE(keeps()) << "pages kept across a refused write";
  fs_->Release(o->file);
}

// The flusher's WRITE of newer cached data never goes while a resend of
// older data over the same bytes is on its way: the two could land in
// either order, and the resend last. The older data here is a write around
// the cache (another user's, to a setuid file), lost by a server restart
// and resent at fsync; the newer is a cached write over it, flushed while
// the resend is held.
TEST_F(WriteBackTest, AFlushWaitsForAResendOfOlderDataOverTheSameBytes) {
  const std::string older = Pattern(8192, 21), newer = Pattern(8192, 22);
  const uint64_t ino = SetuidFile(*fs_, "over", 04777);
  auto o = Open(ino, O_RDWR);
  ASSERT_TRUE(o.ok()) << o.error().what;
  ASSERT_TRUE(Write(o->file, older, 0).ok());  // around the cache (setuid): UNSTABLE, kept
  ASSERT_EQ(Dirty(), 0u);
  ASSERT_TRUE(nfs_.Quiesce());
  nfs_.Restart();  // lost
  ASSERT_TRUE(Write(o->file, newer, 0).ok());  // setuid is gone: to the cache
  ASSERT_GT(Dirty(), 0u);
  nfs_.Pause();
  auto synced = std::make_shared<std::promise<Result<Ok>>>();
  fs_->Fsync(cred_, o->file, [synced](Result<Ok> r) { synced->set_value(std::move(r)); });
  ASSERT_TRUE(nfs_.WaitPending(1));
  ASSERT_TRUE(nfs_.StepOne(IndexOf(nfs_, Proc::kCommit)));  // a new verifier: the resend
  ASSERT_TRUE(nfs_.WaitPending(1));
  ASSERT_EQ(nfs_.Queued()[0].proc, Proc::kWrite);
  ASSERT_TRUE(nfs_.Queued()[0].stable) << "not the resend";
  auto flushed = std::async(std::launch::async, [&] { return fs_->FlushCache(); });
  std::this_thread::sleep_for(200ms);
  // Whatever the flusher sent meanwhile goes first, then the resend.
  for (size_t i = 0; i < nfs_.Queued().size(); ++i) {
    if (!nfs_.Queued()[i].stable && nfs_.Queued()[i].proc == Proc::kWrite) {
      ASSERT_TRUE(nfs_.StepOne(i));
      break;
    }
  }
  nfs_.Resume();
  ASSERT_EQ(flushed.wait_for(30s), std::future_status::ready);
  EXPECT_TRUE(flushed.get().ok());
  auto fs = synced->get_future();
  ASSERT_EQ(fs.wait_for(30s), std::future_status::ready);
  EXPECT_TRUE(fs.get().ok());
  ASSERT_TRUE(nfs_.Quiesce());
  EXPECT_TRUE(ContentsOf("over") == newer) << "the resend of the older data landed over the newer";
  Close(o->file);
}

// A truncate that finds writes in the cache made after its flush flushes
// again. It gives up its place in the write order first: a resend admitted
// after it (over the same bytes) waits for that place, and the flusher's
// WRITE of those bytes waits for the resend (FileWrites::Foreign), so a
// truncate that kept its place while waiting for the flush would wait for
// ever.
TEST_F(WriteBackTest, ATruncateThatMustFlushAgainDoesNotWaitForAResendBehindIt) {
  ASSERT_TRUE(nfs_.Quiesce());
  fs_.reset();
  FsOptions o;
  o.write_behind = 0;  // (every write holds its place until answered)
  fs_ = std::make_unique<Filesystem>(nfs_, nfs_.root(), o, cache_);
  const Cred root{0, 0, {}};
  const std::string older = Pattern(8192, 31), newer = Pattern(8192, 32);
  const uint64_t ino = SetuidFile(*fs_, "over", 04777);
  ClosedDirtyFile("c", Pattern(8192, 30));
  auto f = Open(ino, O_RDWR);
  ASSERT_TRUE(f.ok()) << f.error().what;
  const nfs::Fh over = *nfs_.FhOf("over");
  auto write_of = [&](const nfs::Fh& fh) {
    const auto q = nfs_.Queued();
    for (size_t i = 0; i < q.size(); ++i) {
      if (q[i].proc == Proc::kWrite && q[i].fh == fh) return i;
    }
    return q.size();
  };
  nfs_.Pause();
  // The flusher is busy with another file's round.
  auto flushed = std::async(std::launch::async, [&] { return fs_->FlushCache(); });
  ASSERT_TRUE(nfs_.WaitPending(1));
  // A non-root write to the setuid file goes around the cache, UNSTABLE.
  auto k = std::async(std::launch::async, [&] { return Write(f->file, older, 0); });
  ASSERT_TRUE(nfs_.WaitPending(2));
  // The truncate takes its place after it, and waits.
  nfs::SetAttr sa;
  sa.size = 4096;
  auto truncated = std::make_shared<std::promise<Result<AttrOut>>>();
  fs_->Setattr(cred_, ino, sa, [truncated](Result<AttrOut> r) { truncated->set_value(std::move(r)); });
  std::this_thread::sleep_for(50ms);
  // Root's write of the same bytes stays in the cache (after the
  // truncate's flush: it must flush again).
  auto b = Wait<size_t>([&](auto cb) { fs_->Write(root, f->file, Buf(newer), 0, 0, cb); });
  ASSERT_TRUE(b.ok()) << b.error().what;
  ASSERT_GT(Dirty(), 0u);
  // The write around the cache is answered (kept); the truncate goes on,
  // finds the cache's pages and asks the busy flusher for them.
  ASSERT_TRUE(nfs_.StepOne(write_of(over)));
  ASSERT_EQ(k.wait_for(10s), std::future_status::ready);
  ASSERT_TRUE(k.get().ok());
  std::this_thread::sleep_for(50ms);
  // The server restarts; a COMMIT finds the kept write lost: its resend.
  nfs_.Restart();
  auto synced = std::make_shared<std::promise<Result<Ok>>>();
  fs_->Fsync(cred_, f->file, [synced](Result<Ok> r) { synced->set_value(std::move(r)); });
  ASSERT_TRUE(nfs_.WaitPending(2));
  ASSERT_TRUE(nfs_.StepOne(IndexOf(nfs_, Proc::kCommit)));
  nfs_.Resume();
  auto t = truncated->get_future();
  ASSERT_EQ(t.wait_for(20s), std::future_status::ready) << "the truncate waits for ever";
  auto tr = t.get();
  EXPECT_TRUE(tr.ok()) << tr.error().what;
  auto s = synced->get_future();
  ASSERT_EQ(s.wait_for(20s), std::future_status::ready);
  EXPECT_TRUE(s.get().ok());
  ASSERT_EQ(flushed.wait_for(20s), std::future_status::ready);
  EXPECT_TRUE(flushed.get().ok());
  ASSERT_TRUE(fs_->FlushCache().ok());
  ASSERT_TRUE(nfs_.Quiesce());
  EXPECT_TRUE(ContentsOf("over") == newer.substr(0, 4096)) << "the truncate or the newer data was undone";
  Close(f->file);
}

// A write that goes around the cache (a non-root write to a setuid file)
// keeps its own O_DSYNC: FILE_SYNC.
TEST_F(WriteBackTest, AWriteAroundTheCacheKeepsItsOwnDsyncFlag) {
  const uint64_t ino = SetuidFile(*fs_, "suid-dsync", 04777);
  auto o = Open(ino, O_WRONLY | O_DIRECT);
  ASSERT_TRUE(o.ok()) << o.error().what;
  const auto before = nfs_.stats();
  ASSERT_TRUE(Write(o->file, "user data", 4096, O_WRONLY | O_DIRECT | O_DSYNC).ok());
  EXPECT_EQ(StableOf("suid-dsync").substr(4096), "user data");
  const auto after = nfs_.stats();
  EXPECT_EQ(after.writes_unstable, before.writes_unstable);
  EXPECT_GT(after.writes_file_sync, before.writes_file_sync);
  fs_->Release(o->file);
}

// ------------------------------------------------------------ detach

// The real disk, noting the thread that closes the cache's files (its
// destructor's).
class ClosingThreadDisk : public cache::Disk {
 public:
  std::atomic<bool> closed{false};
  std::atomic<std::thread::id> closed_on{};
  Result<std::unique_ptr<cache::File>> Open(const std::string& path, int flags) override {
    auto f = cache::RealDisk().Open(path, flags);
    if (!f) return f.error();
    return std::unique_ptr<cache::File>(std::make_unique<Noted>(std::move(*f), this));
  }
  bool Exists(const std::string& p) override { return cache::RealDisk().Exists(p); }
  bool Rename(const std::string& a, const std::string& b) override { return cache::RealDisk().Rename(a, b); }
  bool Remove(const std::string& p) override { return cache::RealDisk().Remove(p); }
  bool SyncDir(const std::string& d) override { return cache::RealDisk().SyncDir(d); }
  uint64_t Allocated(const std::string& p) override { return cache::RealDisk().Allocated(p); }

 private:
  class Noted : public cache::File {
   public:
    Noted(std::unique_ptr<cache::File> f, ClosingThreadDisk* d) : f_(std::move(f)), d_(d) {}
    ~Noted() override {
      d_->closed_on = std::this_thread::get_id();
      d_->closed = true;
    }
    bool ReadAt(char* p, size_t n, uint64_t off) override { return f_->ReadAt(p, n, off); }
    bool WriteAt(const char* p, size_t n, uint64_t off) override { return f_->WriteAt(p, n, off); }
    bool Sync() override { return f_->Sync(); }
    bool Truncate(uint64_t size) override { return f_->Truncate(size); }
    bool Allocate(uint64_t size) override { return f_->Allocate(size); }
    uint64_t Size() override { return f_->Size(); }

   private:
    std::unique_ptr<cache::File> f_;
    ClosingThreadDisk* d_;
  };
};

// A detach whose wait for the operations still holding the cache gives up
// (5 s: a server that does not answer them) does not leave the cache to be
// closed by the last of them, which is an engine event loop (closing syncs
// the cache's files): a thread of the filesystem's own closes it.
TEST_F(FilesystemTest, ADetachThatGivesUpWaitingDoesNotLeaveTheCacheToAnEventLoop) {
  char tmpl[] = "/tmp/mpnfs-fs-detach-test-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  ClosingThreadDisk disk;
  {
    cache::CacheOptions o;
    o.disk = &disk;
    o.dir = dir;
    o.size = 1 << 20;
    o.block = 64 << 10;
    o.mode = cache::CacheMode::kReadOnly;
    auto c = cache::BlockCache::Open(o);
    ASSERT_TRUE(c.ok()) << c.error().what;
    ASSERT_TRUE(nfs_.Quiesce());
    fs_ = std::make_unique<Filesystem>(nfs_, nfs_.root(), FsOptions{}, std::move(c.value()));
  }
  // An operation that holds the cache for 6 s, on a thread of its own (as
  // a call's completion holds it on an event loop).
  std::promise<void> holding;
  std::thread::id holder_id;
  std::thread holder([&, held = fs_->cache()]() mutable {
    holder_id = std::this_thread::get_id();
    holding.set_value();
    std::this_thread::sleep_for(6s);
    held.reset();
  });
  holding.get_future().wait();
  EXPECT_TRUE(fs_->DetachCache().ok());
  holder.join();
  for (int i = 0; i < 500 && !disk.closed; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(disk.closed) << "the cache was never closed";
  EXPECT_NE(disk.closed_on.load(), holder_id) << "closed by the operation that held it last";
  fs_.reset();  // (before the disk it used)
  Mount(FsOptions{});
  std::filesystem::remove_all(dir);
}

// ------------------------------------------------------------ fill=block

// A mount with a read-only SSD cache of 64 KiB blocks, fill=page or block.
class FillTest : public FilesystemTest, public ::testing::WithParamInterface<bool> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/mpnfs-fs-fill-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
    cache::CacheOptions o;
    o.dir = dir_;
    o.size = 1 << 20;
    o.block = 64 << 10;
    o.mode = cache::CacheMode::kReadOnly;
    o.fill_block = GetParam();
    auto c = cache::BlockCache::Open(o);
    ASSERT_TRUE(c.ok()) << c.error().what;
    cache_ = std::move(c.value());
    fs_ = std::make_unique<Filesystem>(nfs_, nfs_.root(), FsOptions{}, cache_);
  }
  void TearDown() override {
    FilesystemTest::TearDown();
    cache_.reset();
    std::filesystem::remove_all(dir_);
  }
  // Until the cache's writer has stored `pages` pages (or 30 s passed).
  uint64_t WaitFilled(uint64_t pages) {
    for (int i = 0; i < 3000 && cache_->Stats().pages_filled < pages; ++i) {
      std::this_thread::sleep_for(10ms);
    }
    return cache_->Stats().pages_filled;
  }

  std::string dir_;
  std::shared_ptr<cache::BlockCache> cache_;
};

// An 8 KiB miss in the middle of block 1 (64..128 KiB) of a 160 KiB file:
// with fill=block every page of that block is filled from one READ of the
// whole block, so another page of it is then a hit; with fill=page only the
// two pages asked for are, and the other page is a miss (the control).
TEST_P(FillTest, AMissFillsTheWholeBlockWithFillBlock) {
  const bool whole = GetParam();
  const std::string data = Pattern(160 << 10, 11);
  OpenFile* w = CreateWith("f", data);
  ASSERT_NE(w, nullptr);
  Close(w);
  auto e = Lookup(kRoot, "f");
  ASSERT_TRUE(e.ok());
  auto o = Open(e->ino, O_RDONLY);
  ASSERT_TRUE(o.ok()) << o.error().what;
  const uint64_t reads0 = nfs_.stats().Calls(Proc::kRead);
  auto r = Read(o->file, 8192, 72 << 10);
  ASSERT_TRUE(r.ok()) << r.error().what;
  EXPECT_EQ(*r, data.substr(72 << 10, 8192)) << "the caller gets its own range";
  EXPECT_EQ(nfs_.stats().Calls(Proc::kRead) - reads0, 1u);
  const uint64_t pages = whole ? 16 : 2;
  EXPECT_EQ(WaitFilled(pages), pages);
  const auto st0 = cache_->Stats();
  // Another page of the block, and the block's last page.
  for (uint64_t off : {64u << 10, (128u << 10) - 4096}) {
    auto again = Read(o->file, 4096, off);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*again, data.substr(off, 4096));
  }
  const auto st1 = cache_->Stats();
  EXPECT_EQ(st1.read_hits - st0.read_hits, whole ? 2u : 0u);
  EXPECT_EQ(nfs_.stats().Calls(Proc::kRead) - reads0, whole ? 1u : 3u);
  // Near EOF the block is short: the caller still gets exactly its bytes.
  auto tail = Read(o->file, 8192, (160 << 10) - 8192);
  ASSERT_TRUE(tail.ok());
  EXPECT_EQ(*tail, data.substr((160 << 10) - 8192));
  Close(o->file);
}

INSTANTIATE_TEST_SUITE_P(Fill, FillTest, ::testing::Values(false, true),
                         [](const auto& i) { return i.param ? "block" : "page"; });

}  // namespace
}  // namespace mpnfs::fs

