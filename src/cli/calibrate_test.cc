#include "cli/calibrate.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <map>

#include "nfs/wait.h"
#include "test/fakes/fake_nfs.h"

namespace mpnfs::cli {
namespace {

using testing::FakeNfs;

std::optional<std::vector<DepthPoint>> SweepOver(const std::map<int, double>& iops, int max_depth,
                                                 std::vector<int>* asked = nullptr) {
  return SweepDepths(
      [&](int depth) -> std::optional<DepthPoint> {
        if (asked) asked->push_back(depth);
        DepthPoint p;
        p.iops = iops.at(depth);
        return p;
      },
      max_depth, 0.05);
}

TEST(CalibrateTest, SweepStopsOnceIopsStopRising) {
  std::vector<int> asked;
  auto s = SweepOver({{1, 100}, {2, 190}, {4, 360}, {8, 370}, {16, 1000}}, 128, &asked);
  ASSERT_TRUE(s);
  EXPECT_EQ(asked, (std::vector<int>{1, 2, 4, 8}));  // 370 < 360 * 1.05: no deeper
  ASSERT_EQ(s->size(), 4u);
  EXPECT_EQ(BestPoint(*s)->depth, 8);
  EXPECT_EQ(s->back().depth, 8);
}

TEST(CalibrateTest, SweepStopsOnADropAndKeepsTheBest) {
  auto s = SweepOver({{1, 100}, {2, 300}, {4, 200}}, 128);
  ASSERT_TRUE(s);
  ASSERT_EQ(s->size(), 3u);
  EXPECT_EQ(BestPoint(*s)->depth, 2);
}

TEST(CalibrateTest, SweepEndsAtTheMaximumDepth) {
  std::map<int, double> linear;
  for (int d = 1; d <= 256; d *= 2) linear[d] = 100.0 * d;
  auto s = SweepOver(linear, 128);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->size(), 8u);
  EXPECT_EQ(s->back().depth, 128);
}

TEST(CalibrateTest, AStoppedSweepHasNoResult) {
  int n = 0;
  auto s = SweepDepths([&](int) -> std::optional<DepthPoint> {
    if (++n == 3) return std::nullopt;
    DepthPoint p;
    p.iops = 100.0 * n;
    return p;
  }, 128, 0.05);
  EXPECT_FALSE(s);
}

TEST(CalibrateTest, ParsesArguments) {
  auto o = ParseCalibrateArgs(" --size 256M --time 0.5 --json --path 10.0.0.2");
  ASSERT_TRUE(o.ok()) << o.error().what;
  EXPECT_EQ(o->size, 256ull << 20);
  EXPECT_DOUBLE_EQ(o->step_s, 0.5);
  EXPECT_TRUE(o->json);
  EXPECT_EQ(o->path, "10.0.0.2");
  EXPECT_EQ(ParseCalibrateArgs("")->size, 1ull << 30);
  EXPECT_FALSE(ParseCalibrateArgs("--size lots").ok());
  EXPECT_FALSE(ParseCalibrateArgs("--time").ok());
  EXPECT_FALSE(ParseCalibrateArgs("--frobnicate").ok());
  EXPECT_TRUE(ParseCalibrateArgs("--apply")->apply);
  EXPECT_FALSE(ParseCalibrateArgs("")->apply);
  const auto both = ParseCalibrateArgs("--apply --path 10.0.0.2");
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.error().what.find("not with --path"), std::string::npos) << both.error().what;
  // Steps are capped (each keeps every call's latency).
  EXPECT_TRUE(ParseCalibrateArgs("--time 60").ok());
  auto over = ParseCalibrateArgs("--time 61");
  ASSERT_FALSE(over.ok());
  EXPECT_NE(over.error().what.find("0.1 to 60"), std::string::npos) << over.error().what;
  EXPECT_FALSE(ParseCalibrateArgs("--time 3600").ok());
}

TEST(CalibrateTest, PathTakesHostOrHostAndPort) {
  auto a = SplitHostPort("10.0.0.2");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->host, "10.0.0.2");
  EXPECT_EQ(a->port, 0);  // any port
  auto b = SplitHostPort("10.0.0.2:2050");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->host, "10.0.0.2");
  EXPECT_EQ(b->port, 2050);
  EXPECT_FALSE(SplitHostPort("10.0.0.2:x"));
  EXPECT_FALSE(SplitHostPort("10.0.0.2:70000"));
}

TEST(CalibrateTest, AScratchFileFoundByNameMustBeOurs) {
  nfs::Attr a;
  a.type = nfs::Ftype::kReg;
  a.uid = 0;
  a.nlink = 1;
  a.size = 0;
  EXPECT_TRUE(ScratchFileIsOurs(a));
  auto b = a;
  b.uid = 1000;
  EXPECT_FALSE(ScratchFileIsOurs(b));
  b = a;
  b.nlink = 2;  // a hard link to someone's file
  EXPECT_FALSE(ScratchFileIsOurs(b));
  b = a;
  b.size = 4096;
  EXPECT_FALSE(ScratchFileIsOurs(b));
  b = a;
  b.type = nfs::Ftype::kLnk;
  EXPECT_FALSE(ScratchFileIsOurs(b));
}

CalibrateResult Sample() {
  CalibrateResult r;
  r.file_bytes = 64 << 20;
  r.small_io = 8192;
  r.large_io = 1 << 20;
  r.step_s = 2;
  TargetResult a;
  a.name = "10.0.0.2";
  a.seq_read_mbs = 110.5;
  a.seq_write_mbs = 95.25;
  a.rand_read = {{1, 1000, 950, 2000}, {2, 1900, 1000, 2100}, {4, 1950, 2000, 4000}};
  a.rand_write = {{1, 500, 1900, 3000}, {2, 510, 3900, 6000}};
  TargetResult all = a;
  all.name = "all";
  r.targets = {a, all};
  r.skipped = {"10.0.0.3"};
  return r;
}

TEST(CalibrateTest, TableHasARowPerTarget) {
  const std::string t = RenderTable(Sample());
  EXPECT_NE(t.find("PATH"), std::string::npos) << t;
  EXPECT_NE(t.find("10.0.0.2"), std::string::npos) << t;
  EXPECT_NE(t.find("\nall "), std::string::npos) << t;
  // Best read: 1950 IOPS at depth 4, QD1 latency 950/2000, best 2000/4000.
  EXPECT_NE(t.find("1950    4        950/2000       2000/4000"), std::string::npos) << t;
  EXPECT_NE(t.find("110.5"), std::string::npos) << t;
  EXPECT_NE(t.find("95.2"), std::string::npos) << t;
  EXPECT_NE(t.find("not measured (down or disabled at the start): 10.0.0.3"), std::string::npos) << t;
}

TEST(CalibrateTest, JsonHasTheSweepsAndTheBest) {
  const std::string j = RenderJson(Sample());
  EXPECT_NE(j.find(R"("path": "10.0.0.2")"), std::string::npos) << j;
  EXPECT_NE(j.find(R"("rand_read": {"best_iops": 1950, "best_depth": 4)"), std::string::npos) << j;
  EXPECT_NE(j.find(R"({"depth": 2, "iops": 510, "latency_mean_us": 3900, "latency_p99_us": 6000})"),
            std::string::npos) << j;
  EXPECT_NE(j.find(R"("seq_read_mbs": 110.5)"), std::string::npos) << j;
  EXPECT_NE(j.find(R"("random_writes": "unstable+commit")"), std::string::npos) << j;
  EXPECT_NE(j.find(R"("skipped": ["10.0.0.3"], "applied": []})"), std::string::npos) << j;
}

// A path's (or "all"'s) sequential MB/s, as a run measured them.
void AddTarget(CalibrateResult& r, const std::string& name, double rd, double wr) {
  TargetResult t;
  t.name = name;
  t.seq_read_mbs = rd;
  t.seq_write_mbs = wr;
  r.targets.push_back(t);
}

TEST(CalibrateTest, SuggestsWeightsOnlyForPathsOfDifferentSpeeds) {
  CalibrateResult r;
  auto add = [&r](const std::string& name, double rd, double wr) { AddTarget(r, name, rd, wr); };
  add("10.0.1.2", 11.9, 11.8);  // 100, 200 and 400 mbit (MULTIPATH.md)
  add("10.0.2.2", 23.9, 23.2);
  add("10.0.3.2", 47.7, 46.2);
  add("all", 83.0, 81.8);
  EXPECT_EQ(SuggestWeight(r).weight, "10+20+40");
  EXPECT_EQ(SuggestWeight(r).paths, "10.0.1.2+10.0.2.2+10.0.3.2");
  EXPECT_NE(RenderTable(r).find("suggested mount options path=10.0.1.2+10.0.2.2+10.0.3.2,weight=10+20+40 "),
            std::string::npos)
      << RenderTable(r);
  EXPECT_NE(RenderJson(r).find(R"("suggested_weight": "10+20+40", "suggested_paths": "10.0.1.2+10.0.2.2+10.0.3.2")"),
            std::string::npos)
      << RenderJson(r);
  r.skipped = {"10.0.4.2"};  // a path not measured: its place in the list is unknown
  EXPECT_EQ(SuggestWeight(r).weight, "");
  EXPECT_EQ(SuggestWeight(r).paths, "");
  EXPECT_EQ(RenderTable(r).find("suggested"), std::string::npos);
  r.skipped.clear();
  r.targets = {};
  add("10.0.1.2", 23.8, 23.6);  // equal paths, measured a little apart
  add("10.0.2.2", 21.0, 21.5);
  add("all", 47.0, 46.0);
  EXPECT_EQ(SuggestWeight(r).weight, "");
  EXPECT_NE(RenderJson(r).find(R"("suggested_weight": "")"), std::string::npos);
  r.targets = {};
  add("10.0.1.2", 900, 1.0);  // --path: no "all" row, not every path measured
  add("10.0.2.2", 0.1, 0.1);
  EXPECT_EQ(SuggestWeight(r).weight, "");
  add("all", 900, 1.0);
  EXPECT_EQ(SuggestWeight(r).weight, "1000+10");  // at most 1000
  EXPECT_EQ(SuggestWeight(r).paths, "10.0.1.2+10.0.2.2");
}

// --apply sets the suggestion, or 1 each for paths of one speed (a weight set
// earlier no longer fits them); nothing unless every path was measured.
// --apply sets all the weights or none, and says why none.
TEST(CalibrateTest, ApplyIsRefusedUnlessEveryPathOfTheMountWasMeasured) {
  const std::vector<std::string> two = {"10.0.1.2:2049", "10.0.2.2:2049"};
  EXPECT_EQ(ApplyRefusal(2, two, {}, {10, 20}), std::nullopt);
  EXPECT_EQ(ApplyRefusal(1, {"10.0.1.2:2049"}, {}, {}), "nothing set: the mount has one path");
  // Two paths, one down at the start: one measured, one skipped.
  EXPECT_EQ(ApplyRefusal(2, {"10.0.1.2:2049"}, {"10.0.2.2"}, {}),
            "nothing set: not every path was measured (not measured: 10.0.2.2)");
  EXPECT_EQ(ApplyRefusal(2, two, {}, {}), "nothing set: a path measured no throughput");
}

TEST(CalibrateTest, ApplySetsTheSuggestedWeightsOrOneEach) {
  CalibrateResult r;
  auto add = [&r](const std::string& name, double rd, double wr) { AddTarget(r, name, rd, wr); };
  add("10.0.1.2", 11.9, 11.8);
  add("10.0.2.2", 23.9, 23.2);
  add("10.0.3.2", 47.7, 46.2);
  add("all", 83.0, 81.8);
  EXPECT_EQ(WeightsToApply(r), (std::vector<int>{10, 20, 40}));
  r.skipped = {"10.0.4.2"};
  EXPECT_TRUE(WeightsToApply(r).empty());
  r.skipped.clear();
  r.targets = {};
  add("10.0.1.2", 23.8, 23.6);
  add("10.0.2.2", 21.0, 21.5);
  EXPECT_TRUE(WeightsToApply(r).empty());  // no "all" row
  add("all", 47.0, 46.0);
  EXPECT_EQ(WeightsToApply(r), (std::vector<int>{1, 1}));
  r.targets = {};
  add("10.0.1.2", 23.8, 23.6);  // one path
  EXPECT_TRUE(WeightsToApply(r).empty());
  r.targets = {};
  add("10.0.1.2", 0, 0);  // moved nothing: no basis for weights
  add("10.0.2.2", 21.0, 21.5);
  add("all", 21.0, 21.5);
  EXPECT_TRUE(WeightsToApply(r).empty());
  EXPECT_EQ(SuggestWeight(r).weight, "");
  r.applied = {"path 10.0.1.2:2049 weight 1 (was 4): new calls are balanced by it"};
  EXPECT_NE(RenderTable(r).find("\n--apply: path 10.0.1.2:2049 weight 1 (was 4)"), std::string::npos)
      << RenderTable(r);
  EXPECT_NE(RenderJson(r).find(R"("applied": ["path 10.0.1.2:2049 weight 1 (was 4): new calls are balanced by it"])"),
            std::string::npos)
      << RenderJson(r);
}

// The scratch file's name, from the fake's CREATE record.
std::string ScratchName(const FakeNfs& f) {
  for (const auto& c : f.History()) {
    if (c.proc == FakeNfs::Proc::kCreate) return c.name;
  }
  return "";
}

CalibrateOptions Small() {
  CalibrateOptions o;
  o.size = 4 << 20;
  o.large_io = 256 << 10;
  o.step_s = 0.1;
  o.max_depth = 4;
  return o;
}

TEST(CalibrateTest, MeasuresEachTargetAndRemovesTheScratchFile) {
  FakeNfs f;
  f.set_history_limit(size_t{1} << 30);
  std::vector<std::string> lines;
  auto r = RunCalibrate(f, f.root(), {{"p0", &f}, {"all", &f}}, Small(), [&](const std::string& l) {
    lines.push_back(l);
    return true;
  });
  ASSERT_TRUE(r.ok()) << r.error().what;
  ASSERT_EQ(r->targets.size(), 2u);
  for (const auto& t : r->targets) {
    EXPECT_GT(t.seq_write_mbs, 0) << t.name;
    EXPECT_GT(t.seq_read_mbs, 0) << t.name;
    ASSERT_FALSE(t.rand_read.empty());
    ASSERT_FALSE(t.rand_write.empty());
    EXPECT_GT(BestPoint(t.rand_read)->iops, 0);
    EXPECT_GT(BestPoint(t.rand_write)->iops, 0);
    EXPECT_EQ(t.rand_read.front().depth, 1);
  }
  EXPECT_GT(r->file_bytes, 0u);
  const std::string name = ScratchName(f);
  ASSERT_EQ(name.rfind(".mpnfs-calibrate-", 0), 0u) << name;
  f.Quiesce();
  EXPECT_FALSE(f.FhOf(name)) << "scratch file left behind";
  EXPECT_GT(f.stats().commits, 0u);  // UNSTABLE random writes end with a COMMIT
  EXPECT_GT(f.stats().writes_unstable, 0u);
}

TEST(CalibrateTest, ScratchNamesSayTheirHostAndProcess) {
  auto m = ParseScratchName(".mpnfs-calibrate-db_1.example-4242-00ff00ff00ff00ff");
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->host, "db_1.example");
  EXPECT_EQ(m->pid, 4242);
  EXPECT_FALSE(ParseScratchName(".mpnfs-calibrate-00ff00ff00ff00ff").has_value());
  EXPECT_FALSE(ParseScratchName(".mpnfs-calibrate-host-x1-00ff").has_value());
  EXPECT_FALSE(ParseScratchName("data-1-2").has_value());
  EXPECT_EQ(ScratchHost().find_first_not_of(
                "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._"),
            std::string::npos);
}

// A scratch file a calibrate of this host left when its process died
// (killed or crashed during the run, so its removal never ran) goes at the
// next calibrate there; those of other hosts and of processes still
// running are left alone.
TEST(CalibrateTest, AScratchFileLeftByADeadProcessOfThisHostGoesAtTheNextRun) {
  FakeNfs f;
  f.set_history_limit(size_t{1} << 30);
  const pid_t dead = fork();  // a process that is gone by the run
  if (dead == 0) _exit(0);
  ASSERT_GT(dead, 0);
  ASSERT_EQ(waitpid(dead, nullptr, 0), dead);
  const std::string host = ScratchHost();
  const std::string left = ".mpnfs-calibrate-" + host + "-" + std::to_string(dead) + "-0123456789abcdef";
  const std::string live = ".mpnfs-calibrate-" + host + "-1-0123456789abcdef";  // init: running
  const std::string other = ".mpnfs-calibrate-another_host-" + std::to_string(dead) + "-0123456789abcdef";
  const std::string user = ".mpnfs-calibrate-" + host + "-" + std::to_string(dead) + "-fedcba9876543210";
  for (const auto& made : std::vector<std::pair<std::string, uint32_t>>{
           {left, 0}, {live, 0}, {other, 0}, {user, 1000}}) {
    const std::string& name = made.first;
    const uint32_t uid = made.second;
    nfs::SetAttr sa;
    sa.mode = 0600;
    auto c = nfs::Wait<nfs::NewObject>([&](nfs::Cb<nfs::NewObject> cb) {
      f.Create(f.root(), name, nfs::CreateMode::kGuarded, sa, 0, engine::Cred{uid, uid, {}}, std::move(cb));
    });
    ASSERT_TRUE(c.ok()) << name;
  }
  std::vector<std::string> lines;
  auto r = RunCalibrate(f, f.root(), {{"p0", &f}}, Small(), [&](const std::string& l) {
    lines.push_back(l);
    return true;
  });
  ASSERT_TRUE(r.ok()) << r.error().what;
  f.Quiesce();
  EXPECT_FALSE(f.FhOf(left)) << "the dead process's scratch file is still there";
  EXPECT_TRUE(f.FhOf(live)) << "a running process's scratch file was removed";
  EXPECT_TRUE(f.FhOf(other)) << "another host's scratch file was removed";
  EXPECT_TRUE(f.FhOf(user)) << "a file not made as calibrate makes it was removed";
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.front().rfind("progress step=leftover removed=" + left, 0), 0u) << lines.front();
  std::string name;  // the run's own: the last CREATE
  for (const auto& c : f.History()) {
    if (c.proc == FakeNfs::Proc::kCreate) name = c.name;
  }
  EXPECT_EQ(name.rfind(".mpnfs-calibrate-" + host + "-" + std::to_string(getpid()) + "-", 0), 0u) << name;
  EXPECT_FALSE(f.FhOf(name)) << "the run's own scratch file left behind";
}

TEST(CalibrateTest, AClientThatGoesAwayStopsTheRunAndTheFileGoes) {
  FakeNfs f;
  f.set_history_limit(size_t{1} << 30);
  int calls = 0;
  auto o = Small();
  o.step_s = 2;  // long enough for a progress report in each step
  auto r = RunCalibrate(f, f.root(), {{"p0", &f}}, o, [&](const std::string&) { return ++calls < 2; });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().err, ECANCELED);
  f.Quiesce();
  const std::string name = ScratchName(f);
  ASSERT_FALSE(name.empty());
  EXPECT_FALSE(f.FhOf(name)) << "scratch file left behind";
}

TEST(CalibrateTest, ACreateAnsweredEexistIsLookedUpNotTakenOrRemoved) {
  // As a resent CREATE would be answered; here no file was made, so the
  // lookup finds nothing: the run fails, writes nothing, removes nothing.
  FakeNfs f;
  f.FailNext(FakeNfs::Proc::kCreate, EEXIST);
  auto r = RunCalibrate(f, f.root(), {{"p0", &f}}, Small(), [](const std::string&) { return true; });
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().what.find("looking up the scratch file"), std::string::npos) << r.error().what;
  f.Quiesce();
  EXPECT_EQ(f.stats().Calls(FakeNfs::Proc::kLookup), 1u);
  EXPECT_EQ(f.stats().Calls(FakeNfs::Proc::kWrite), 0u);
  EXPECT_EQ(f.stats().Calls(FakeNfs::Proc::kRemove), 0u);
}

TEST(CalibrateTest, AFullExportIsReportedAsSuch) {
  FakeNfs f;
  f.FailNext(FakeNfs::Proc::kCreate, ENOSPC);
  auto r = RunCalibrate(f, f.root(), {{"p0", &f}}, Small(), [](const std::string&) { return true; });
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().what.find("full"), std::string::npos) << r.error().what;
}

}  // namespace
}  // namespace mpnfs::cli
