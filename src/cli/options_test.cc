#include "cli/options.h"

#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>

#include "cli/help.h"

namespace mpnfs::cli {
namespace {

using namespace std::chrono_literals;

Result<MountOptions> Parse(std::vector<std::string> a) { return ParseMountArgs(a); }

TEST(OptionsTest, DefaultsMatchTheManPage) {
  auto m = Parse({"srv:/exp", "/mnt"});
  ASSERT_TRUE(m.ok()) << m.error().what;
  EXPECT_EQ(m->server, "srv");
  EXPECT_EQ(m->export_path, "/exp");
  EXPECT_EQ(m->mountpoint, "/mnt");
  EXPECT_FALSE(m->foreground);
  EXPECT_EQ(m->port, 2049);
  EXPECT_EQ(m->mount_port, 0);
  EXPECT_FALSE(m->engine.soft);
  EXPECT_EQ(m->engine.timeo, 60000ms);
  EXPECT_EQ(m->engine.retrans, 2);
  EXPECT_EQ(m->engine.max_inflight, 128);
  EXPECT_EQ(m->engine.conns_per_path, 1);
  EXPECT_EQ(m->engine.path_timeout, 400ms);
  EXPECT_EQ(m->engine.resend_fence, 2000ms);
  EXPECT_EQ(m->fs.acregmin, 3);
  EXPECT_EQ(m->fs.acregmax, 60);
  EXPECT_EQ(m->fs.acdirmin, 30);
  EXPECT_EQ(m->fs.acdirmax, 60);
  EXPECT_TRUE(m->fs.cto);
  EXPECT_EQ(m->fs.lookupcache, fs::FsOptions::LookupCache::kAll);
  EXPECT_FALSE(m->fs.kernel_cache);
  EXPECT_FALSE(m->fs.direct_io);
  EXPECT_EQ(m->fs.write_behind, 64u << 20);
  EXPECT_EQ(m->mount_timeout_s, 30);
  EXPECT_EQ(m->log_level, "info");
  EXPECT_EQ(m->read_ahead_kb, -1);  // DefaultReadAheadKb() of the paths, at mount
  EXPECT_EQ(m->max_background, 512);
  EXPECT_EQ(m->metrics, "");  // no HTTP endpoint unless asked
}

// mount(8) calls its helper as: mount.mpnfs SPEC DIR [-sfnv] [-o OPTIONS].
// mpnfs's own -f (foreground) and -s (FUSE single thread) mean other things:
// the helper's flags must not reach ParseMountArgs as they are.
// One 1 MiB READ in flight per path for a sequential reader: 4 MiB up to
// four paths, then 1 MiB more per path.
TEST(OptionsTest, DefaultReadaheadGrowsWithThePathsBeyondFour) {
  EXPECT_EQ(DefaultReadAheadKb(1), 4096);
  EXPECT_EQ(DefaultReadAheadKb(4), 4096);
  EXPECT_EQ(DefaultReadAheadKb(5), 5120);
  EXPECT_EQ(DefaultReadAheadKb(8), 8192);
}

TEST(OptionsTest, MountHelperFlagsFollowMount8) {
  auto h = TranslateHelperArgs({"srv:/exp", "/mnt", "-sfnv", "-o", "rw,soft", "-t", "mpnfs"});
  ASSERT_TRUE(h.ok()) << h.error().what;
  EXPECT_TRUE(h->fake);
  EXPECT_TRUE(h->verbose);
  EXPECT_EQ(h->args, (std::vector<std::string>{"srv:/exp", "/mnt", "--sloppy", "-o", "rw,soft"}));
  auto m = Parse(h->args);
  ASSERT_TRUE(m.ok()) << m.error().what;
  EXPECT_FALSE(m->foreground) << "mount -f is a fake mount, not a foreground one";
  EXPECT_TRUE(m->engine.soft);

  h = TranslateHelperArgs({"srv:/exp", "/mnt", "-n", "-o", "hard"});
  ASSERT_TRUE(h.ok()) << h.error().what;
  EXPECT_FALSE(h->fake);
  EXPECT_FALSE(h->verbose);
  EXPECT_EQ(h->args, (std::vector<std::string>{"srv:/exp", "/mnt", "-o", "hard"}));

  h = TranslateHelperArgs({"srv:/exp", "/mnt", "-ohard", "-tmpnfs"});
  ASSERT_TRUE(h.ok()) << h.error().what;
  EXPECT_EQ(h->args, (std::vector<std::string>{"srv:/exp", "/mnt", "-ohard"}));

  for (const auto& bad : std::vector<std::vector<std::string>>{
           {"srv:/exp", "/mnt", "-tnfs"},
           {"srv:/exp", "/mnt", "-N", "/proc/1/ns/net"},
           {"srv:/exp", "/mnt", "-t", "nfs"},
           {"srv:/exp", "/mnt", "-x"},
           {"srv:/exp", "/mnt", "-o"}}) {
    auto r = TranslateHelperArgs(bad);
    EXPECT_FALSE(r.ok()) << bad.back();
  }
}

// mount -o remount reaches mpnfs through mount.mpnfs or mount.fuse3: refused
// either way, saying what to do instead.
TEST(OptionsTest, RemountIsRefusedWithWhatToDoInstead) {
  for (const char* o : {"remount", "rw,remount", "remount,hard"}) {
    for (bool sloppy : {false, true}) {
      std::vector<std::string> a{"srv:/exp", "/mnt", "-o", o};
      if (sloppy) a.push_back("--sloppy");
      auto r = Parse(a);
      ASSERT_FALSE(r.ok()) << o;
      EXPECT_NE(r.error().what.find("unmount and mount"), std::string::npos) << r.error().what;
    }
  }
}

TEST(OptionsTest, SloppyListsUnknownOptionsInsteadOfFailing) {
  EXPECT_FALSE(Parse({"srv:/exp", "/mnt", "-o", "soft,vers=3,frobnicate"}).ok());
  auto m = Parse({"srv:/exp", "/mnt", "--sloppy", "-o", "soft,vers=3,frobnicate"});
  ASSERT_TRUE(m.ok()) << m.error().what;
  EXPECT_TRUE(m->engine.soft);
  EXPECT_EQ(m->ignored, (std::vector<std::string>{"vers=3", "frobnicate"}));
  // A known option with a bad value is still an error.
  EXPECT_FALSE(Parse({"srv:/exp", "/mnt", "--sloppy", "-o", "timeo=abc"}).ok());
}

TEST(OptionsTest, MetricsListensOnLoopbackUnlessTheAddressSaysOtherwise) {
  auto m = Parse({"s:/e", "/m", "-o", "metrics=9100"});
  ASSERT_TRUE(m.ok()) << m.error().what;
  EXPECT_EQ(m->metrics, "127.0.0.1:9100");
  m = Parse({"s:/e", "/m", "-o", "metrics=0.0.0.0:9100"});
  ASSERT_TRUE(m.ok()) << m.error().what;
  EXPECT_EQ(m->metrics, "0.0.0.0:9100");
  m = Parse({"s:/e", "/m", "-o", "metrics=[::1]:9101"});
  ASSERT_TRUE(m.ok()) << m.error().what;
  EXPECT_EQ(m->metrics, "[::1]:9101");
  for (const char* bad : {"metrics=", "metrics=0", "metrics=65536", "metrics=http", "metrics=localhost:9100",
                          "metrics=10.0.0.300:9100", "metrics=:9100", "metrics=[::1]", "metrics=::1:9100",
                          "metrics=1.2.3.4:"}) {
    m = Parse({"s:/e", "/m", "-o", bad});
    ASSERT_FALSE(m.ok()) << bad;
    EXPECT_NE(m.error().what.find("metrics= needs PORT, ADDR:PORT or [IPv6]:PORT"), std::string::npos)
        << m.error().what;
  }
}

TEST(OptionsTest, ParsesNfsOptions) {
  auto m = Parse({"-o", "soft,timeo=20,retrans=5,rsize=65536,wsize=131072,port=2050",
                  "-omountport=20048,direct_io,nocto,resend_fence=0,kernel_cache", "10.0.0.1:/a/b", "/m", "-f"});
  ASSERT_TRUE(m.ok()) << m.error().what;
  EXPECT_EQ(m->engine.resend_fence, 0ms);
  EXPECT_TRUE(m->engine.soft);
  EXPECT_EQ(m->engine.timeo, 2000ms);
  EXPECT_EQ(m->engine.retrans, 5);
  EXPECT_EQ(m->fs.rsize, 65536u);
  EXPECT_EQ(m->fs.wsize, 131072u);
  EXPECT_EQ(m->port, 2050);
  EXPECT_EQ(m->mount_port, 20048);
  EXPECT_TRUE(m->fs.direct_io);
  EXPECT_FALSE(m->fs.cto);
  EXPECT_TRUE(m->fs.kernel_cache);
  EXPECT_TRUE(m->foreground);
}

TEST(OptionsTest, ActimeoAndNoacSetAllFour) {
  auto m = Parse({"s:/e", "/m", "-o", "actimeo=7"});
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->fs.acregmin, 7);
  EXPECT_EQ(m->fs.acdirmax, 7);
  m = Parse({"s:/e", "/m", "-o", "noac"});
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->fs.acregmax, 0);
  EXPECT_EQ(m->fs.acdirmin, 0);
}

TEST(OptionsTest, LookupcacheTakesTheValuesOfNfs5) {
  using LC = fs::FsOptions::LookupCache;
  for (const auto& [val, want] : {std::pair{"all", LC::kAll}, std::pair{"positive", LC::kPositive},
                                  std::pair{"pos", LC::kPositive}, std::pair{"none", LC::kNone}}) {
    auto m = Parse({"s:/e", "/m", "-o", std::string("lookupcache=") + val});
    ASSERT_TRUE(m.ok()) << val;
    EXPECT_EQ(m->fs.lookupcache, want) << val;
  }
  auto bad = Parse({"s:/e", "/m", "-o", "lookupcache=negative"});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().what, "lookupcache= must be all, positive (pos) or none");
}

TEST(OptionsTest, LocalLockSaysWhichLocksStayOnThisHost) {
  auto d = Parse({"s:/e", "/m"});
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->local_posix_locks);
  EXPECT_FALSE(d->local_flocks);
  for (const auto& [val, posix, flock] : {std::tuple{"none", false, false}, std::tuple{"flock", false, true},
                                          std::tuple{"posix", true, false}, std::tuple{"all", true, true}}) {
    auto m = Parse({"s:/e", "/m", "-o", std::string("local_lock=") + val});
    ASSERT_TRUE(m.ok()) << val;
    EXPECT_EQ(m->local_posix_locks, posix) << val;
    EXPECT_EQ(m->local_flocks, flock) << val;
  }
  auto bad = Parse({"s:/e", "/m", "-o", "local_lock=some"});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().what, "local_lock= must be none, flock, posix or all");
}

TEST(OptionsTest, FuseUringSaysWhetherRequestsComeThroughIoUring) {
  using U = MountOptions::FuseUring;
  auto d = Parse({"s:/e", "/m"});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->fuse_uring, U::kOff);
  EXPECT_EQ(d->fuse_uring_depth, 32);
  for (const auto& [val, mode] : {std::pair{"auto", U::kAuto}, std::pair{"on", U::kOn}, std::pair{"off", U::kOff}}) {
    auto m = Parse({"s:/e", "/m", "-o", std::string("fuse_uring=") + val + ",fuse_uring_depth=4"});
    ASSERT_TRUE(m.ok()) << val;
    EXPECT_EQ(m->fuse_uring, mode) << val;
    EXPECT_EQ(m->fuse_uring_depth, 4);
  }
  auto bad = Parse({"s:/e", "/m", "-o", "fuse_uring=yes"});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().what, "fuse_uring= must be auto, on or off");
  EXPECT_FALSE(Parse({"s:/e", "/m", "-o", "fuse_uring_depth=0"}).ok());
  EXPECT_FALSE(Parse({"s:/e", "/m", "-o", "fuse_uring_depth=1025"}).ok());
}

TEST(OptionsTest, BusyPollIsOffUnlessGivenInMicroseconds) {
  auto d = Parse({"s:/e", "/m"});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->engine.busy_poll, std::chrono::microseconds(0));
  auto m = Parse({"s:/e", "/m", "-o", "busy_poll=150"});
  ASSERT_TRUE(m.ok()) << m.error().what;
  EXPECT_EQ(m->engine.busy_poll, std::chrono::microseconds(150));
  for (const char* bad : {"busy_poll=-1", "busy_poll=100001", "busy_poll=1ms"}) {
    auto b = Parse({"s:/e", "/m", "-o", bad});
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_NE(b.error().what.find("busy_poll"), std::string::npos) << b.error().what;
  }
}

TEST(OptionsTest, AcceptsFstabOnlyOptions) {
  auto m = Parse({"s:/e", "/m", "-o",
                  "rw,_netdev,nofail,noauto,defaults,x-systemd.automount,x-systemd.mount-timeout=30,"
                  "allow_other,default_permissions,nosuid"});
  ASSERT_TRUE(m.ok()) << m.error().what;
  EXPECT_EQ(m->fuse_opts,
            (std::vector<std::string>{"rw", "allow_other", "nosuid", "default_permissions"}));
}

TEST(OptionsTest, KernelPermissionChecksAreTheDefault) {
  auto m = Parse({"s:/e", "/m"});
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->fuse_opts, std::vector<std::string>{"default_permissions"});
  m = Parse({"s:/e", "/m", "-o", "nodefault_permissions"});
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(m->fuse_opts.empty());
}

TEST(OptionsTest, RejectsBadInputWithAClearMessage) {
  auto m = Parse({"s:/e", "/m", "-o", "frobnicate"});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().what.find("frobnicate"), std::string::npos);
  m = Parse({"s:/e", "/m", "-o", "timeo=abc"});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().what.find("timeo"), std::string::npos);
  m = Parse({"s:/e", "/m", "-o", "rsize=1"});
  EXPECT_FALSE(m.ok());
  m = Parse({"s:/e", "/m", "-o", "timeo"});
  EXPECT_FALSE(m.ok());
  m = Parse({"server-without-export", "/m"});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().what.find("SERVER:/EXPORT"), std::string::npos);
  m = Parse({"s:/e"});
  EXPECT_FALSE(m.ok());
  m = Parse({"s:/e", "/m", "-o", "acregmin=10,acregmax=5"});
  EXPECT_FALSE(m.ok());
  m = Parse({"s:/e", "/m", "-o", "log_level=loud"});
  EXPECT_FALSE(m.ok());
  for (const char* bad : {"resend_fence=-1", "resend_fence=600001", "resend_fence=2s"}) {
    m = Parse({"s:/e", "/m", "-o", bad});
    ASSERT_FALSE(m.ok()) << bad;
    EXPECT_NE(m.error().what.find("resend_fence"), std::string::npos) << m.error().what;
  }
  m = Parse({"s:/e", "/m", "--bogus"});
  EXPECT_FALSE(m.ok());
}

TEST(OptionsTest, PathsAreRepeatableOrAList) {
  auto m = Parse({"s:/e", "/m", "-o", "path=10.0.1.2+10.0.2.2,path=10.0.3.2"});
  ASSERT_TRUE(m.ok()) << m.error().what;
  EXPECT_EQ(m->paths, (std::vector<std::string>{"10.0.1.2", "10.0.2.2", "10.0.3.2"}));
  EXPECT_FALSE(Parse({"s:/e", "/m", "-o", "path="}).ok());
  EXPECT_FALSE(Parse({"s:/e", "/m", "-o", "path=a++b"}).ok());
  EXPECT_FALSE(Parse({"s:/e", "/m", "-o", "path=1+2+3+4+5+6+7+8+9"}).ok());
  auto dup = Parse({"s:/e", "/m", "-o", "path=10.0.1.2+10.0.1.2"});
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.error().what.find("10.0.1.2 is given twice"), std::string::npos) << dup.error().what;
  EXPECT_FALSE(Parse({"s:/e", "/m", "-o", "path=10.0.1.2,path=10.0.1.2"}).ok());
  EXPECT_TRUE(Parse({"s:/e", "/m"})->paths.empty());
}

TEST(OptionsTest, LocalsBindPathsInOrder) {
  auto m = Parse({"s:/e", "/m", "-o", "path=10.0.1.2+10.0.2.2,local=eth1+10.0.2.1"});
  ASSERT_TRUE(m.ok()) << m.error().what;
  EXPECT_EQ(m->locals, (std::vector<std::string>{"eth1", "10.0.2.1"}));
  m = Parse({"s:/e", "/m", "-o", "path=10.0.1.2+10.0.2.2,local=+eth2"});
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->locals, (std::vector<std::string>{"", "eth2"}));
  EXPECT_TRUE(Parse({"s:/e", "/m", "-o", "local=eth0"}).ok());  // binds SERVER's connection
  EXPECT_FALSE(Parse({"s:/e", "/m", "-o", "local="}).ok());
  EXPECT_FALSE(Parse({"s:/e", "/m", "-o", "path=10.0.1.2,local=a+b"}).ok());
}

TEST(OptionsTest, WeightsWeighPathsInOrder) {
  auto m = Parse({"s:/e", "/m", "-o", "path=10.0.1.2+10.0.2.2+10.0.3.2,weight=1+2+4"});
  ASSERT_TRUE(m.ok()) << m.error().what;
  EXPECT_EQ(m->weights, (std::vector<int>{1, 2, 4}));
  m = Parse({"s:/e", "/m", "-o", "path=10.0.1.2+10.0.2.2,weight=+1000"});
  ASSERT_TRUE(m.ok()) << m.error().what;
  EXPECT_EQ(m->weights, (std::vector<int>{1, 1000}));  // "" keeps the default
  EXPECT_TRUE(Parse({"s:/e", "/m"})->weights.empty());
  EXPECT_EQ(Parse({"s:/e", "/m", "-o", "weight=1+4,weight=3"})->weights, (std::vector<int>{3}));
  // Counted against the paths by LoadMountOptions (mpnfstab may supply them).
  EXPECT_TRUE(Parse({"s:/e", "/m", "-o", "weight=3+1"}).ok());
  EXPECT_EQ(ParseWeight("1000"), 1000);
  EXPECT_EQ(ParseWeight("1001"), std::nullopt);
  EXPECT_EQ(ParseWeight(""), std::nullopt);
  for (const char* bad : {"weight=", "weight=0", "weight=1001", "weight=-1", "weight=2x", "weight=1.5",
                          "weight=+-3"}) {
    auto r = Parse({"s:/e", "/m", "-o", std::string("path=10.0.1.2+10.0.2.2,") + bad});
    EXPECT_FALSE(r.ok()) << bad;
  }
  auto r = Parse({"s:/e", "/m", "-o", "weight=1001"});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().what.find("bad weight '1001' (1 to 1000)"), std::string::npos) << r.error().what;
}

TEST(OptionsTest, CacheOptions) {
  auto m = Parse({"s:/e", "/m", "-o",
                  "cache_dir=/ssd/c,cache_size=50G,cache_mode=writethrough,cache_block=128,"
                  "seq_cutoff=8,admit=second,fill=block,cache_optional,cache_direct"});
  ASSERT_TRUE(m.ok()) << m.error().what;
  EXPECT_EQ(m->cache.dir, "/ssd/c");
  EXPECT_EQ(m->cache.size, 50ull << 30);
  EXPECT_EQ(m->cache.mode, cache::CacheMode::kWriteThrough);
  EXPECT_EQ(m->cache.block, 128u << 10);
  EXPECT_EQ(m->cache.seq_cutoff, 8u << 20);
  EXPECT_TRUE(m->cache.admit_second);
  EXPECT_TRUE(m->cache.fill_block);
  EXPECT_FALSE(Parse({"s:/e", "/m", "-o", "cache_dir=/c"})->cache.fill_block);
  EXPECT_FALSE(Parse({"s:/e", "/m", "-o", "cache_dir=/c,fill=page"})->cache.fill_block);
  EXPECT_TRUE(m->cache_optional);
  EXPECT_TRUE(m->cache.direct);
  EXPECT_FALSE(Parse({"s:/e", "/m", "-o", "cache_dir=/c"})->cache.direct);
  EXPECT_EQ(Parse({"s:/e", "/m", "-o", "cache_dir=/c"})->cache.mode, cache::CacheMode::kReadOnly);
  EXPECT_EQ(Parse({"s:/e", "/m"})->cache.mode, cache::CacheMode::kOff);
  EXPECT_EQ(Parse({"s:/e", "/m", "-o", "cache_dir=/c,cache_size=512m"})->cache.size, 512ull << 20);
  EXPECT_EQ(Parse({"s:/e", "/m", "-o", "cache_dir=/c,cache_crc_ram=64M"})->cache.crc_ram, 64ull << 20);
  EXPECT_EQ(Parse({"s:/e", "/m", "-o", "cache_dir=/c"})->cache.crc_ram, 0u);  // the default
  for (const char* bad : {"cache_mode=readonly", "cache_dir=relative", "cache_dir=/c,cache_size=12X",
                          "cache_dir=/c,cache_size=0", "cache_dir=/c,cache_crc_ram=lots", "cache_dir=/c,cache_mode=fast",
                          "cache_dir=/c,cache_block=100", "cache_dir=/c,admit=third",
                          "cache_dir=/c,fill=pages"}) {
    EXPECT_FALSE(Parse({"s:/e", "/m", "-o", bad}).ok()) << bad;
  }
}

TEST(OptionsTest, WriteBackOptions) {
  auto m = Parse({"s:/e", "/m", "-o",
                  "cache_dir=/c,cache_mode=writeback,wb_fsync=server,dirty_high=70,dirty_low=10,"
                  "dirty_age=5,wb_noflush"});
  ASSERT_TRUE(m.ok()) << m.error().what;
  EXPECT_EQ(m->cache.mode, cache::CacheMode::kWriteBack);
  EXPECT_TRUE(m->cache.fsync_server);
  EXPECT_EQ(m->cache.dirty_high, 70u);
  EXPECT_EQ(m->cache.dirty_low, 10u);
  EXPECT_EQ(m->cache.dirty_age_s, 5u);
  EXPECT_FALSE(m->cache.flush_on_unmount);
  m = Parse({"s:/e", "/m", "-o", "cache_dir=/c,cache_mode=writeback"});
  ASSERT_TRUE(m.ok());
  EXPECT_FALSE(m->cache.fsync_server);
  EXPECT_TRUE(m->cache.flush_on_unmount);
  for (const char* bad : {"cache_dir=/c,wb_fsync=server", "cache_dir=/c,cache_mode=writethrough,wb_noflush",
                          "cache_dir=/c,cache_mode=writeback,wb_fsync=disk",
                          "cache_dir=/c,cache_mode=writeback,dirty_high=20,dirty_low=30",
                          "cache_dir=/c,cache_mode=writeback,dirty_age=0"}) {
    auto r = Parse({"s:/e", "/m", "-o", bad});
    EXPECT_FALSE(r.ok()) << bad;
  }
  auto r = Parse({"s:/e", "/m", "-o", "cache_dir=/c,dirty_age=3"});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().what.find("cache_mode=writeback"), std::string::npos) << r.error().what;
}

TEST(OptionsTest, SplitsSources) {
  std::string s, e;
  EXPECT_TRUE(SplitSource("host:/x", &s, &e));
  EXPECT_EQ(s, "host");
  EXPECT_EQ(e, "/x");
  EXPECT_TRUE(SplitSource("[fe80::1]:/x", &s, &e));
  EXPECT_EQ(s, "fe80::1");
  EXPECT_FALSE(SplitSource("host:x", &s, &e));
  EXPECT_FALSE(SplitSource(":/x", &s, &e));
}

TEST(OptionsTest, HelpAndVersionNeedNoSource) {
  auto m = Parse({"-h"});
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(m->help);
  m = Parse({"--version"});
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(m->version);
}


// The names of the options the man page's OPTIONS section documents (the
// bold words of each item's tag line: "timeo=", "cto", "nocto", ...).
std::set<std::string> ManPageOptions() {
  std::ifstream in(std::string(MPNFS_SOURCE_ROOT) + "/man/mpnfs.8");
  EXPECT_TRUE(in.good()) << "man/mpnfs.8 not found";
  std::set<std::string> names;
  std::string line;
  bool in_options = false, skip = false, tag_next = false;
  while (std::getline(in, line)) {
    if (line.rfind(".SH ", 0) == 0) in_options = line == ".SH OPTIONS";
    // The FUSE and fstab options passed through or ignored are listed in
    // running text there, and summarised in one line of --help.
    if (line.rfind(".SS ", 0) == 0) skip = line == ".SS Generic mount options" || line == ".SS Options for /etc/fstab";
    if (!in_options || skip) continue;
    if (line == ".TP") {
      tag_next = true;
      continue;
    }
    if (!tag_next) continue;
    tag_next = false;
    // Split the macro's arguments (quotes group), keep the bold ones.
    std::vector<std::string> args;
    std::string macro, cur;
    std::istringstream words(line);
    words >> macro;
    bool quoted = false;
    for (char ch : line.substr(macro.size())) {
      if (ch == '"') {
        quoted = !quoted;
      } else if (ch == ' ' && !quoted) {
        if (!cur.empty()) args.push_back(cur);
        cur.clear();
      } else {
        cur += ch;
      }
    }
    if (!cur.empty()) args.push_back(cur);
    for (size_t i = 0; i < args.size(); ++i) {
      if (macro != ".B" && i % 2 == 1) continue;  // .BI / .BR alternate bold and not
      const std::string bold = std::regex_replace(args[i], std::regex(R"(\\f.|\\-)"), "");
      static const std::regex word(R"([a-z_]+=?)");
      for (auto it = std::sregex_iterator(bold.begin(), bold.end(), word); it != std::sregex_iterator(); ++it) {
        names.insert(it->str());
      }
    }
  }
  return names;
}

TEST(HelpTest, EveryOptionOfTheManPageIsInTheHelp) {
  const auto names = ManPageOptions();
  ASSERT_GE(names.size(), 40u) << "the man page parser found too few options";
  const std::string help = HelpText();
  for (const auto& n : names) {
    // As a word of its own: "cto" must not be satisfied by "nocto".
    const std::regex in_help("(^|[ ,|])" + n + (n.back() == '=' ? "" : "($|[ ,|\n])"));
    EXPECT_TRUE(std::regex_search(help, in_help)) << n << " is in mpnfs(8) but not in --help";
  }
}

TEST(HelpTest, EveryOptionOfTheHelpIsInTheManPageAndParses) {
  const auto names = ManPageOptions();
  for (const auto& o : OptionHelpTable()) {
    static const std::regex word(R"([a-z_]+=?)");
    const std::string syntax = o.syntax;
    auto first = std::sregex_iterator(syntax.begin(), syntax.end(), word);
    ASSERT_NE(first, std::sregex_iterator()) << syntax;
    EXPECT_TRUE(names.count(first->str())) << o.syntax << " is in --help but not in mpnfs(8)";
    auto m = ParseMountArgs({"srv:/exp", "/mnt", "-o", o.example});
    EXPECT_TRUE(m.ok()) << o.example << ": " << (m.ok() ? "" : m.error().what);
  }
}

TEST(HelpTest, HelpFitsATerminal) {
  std::istringstream in(HelpText());
  std::string line;
  while (std::getline(in, line)) EXPECT_LE(line.size(), 100u) << line;
}

}  // namespace
}  // namespace mpnfs::cli
