#include "cli/mpnfstab.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

namespace mpnfs::cli {
namespace {

const char* kGood = R"(
# two servers
server: filer1
path: 10.0.1.2
path: 10.0.2.2      # second path
export: /vol/data  mount: /mnt/data
export: /vol/logs mount: /mnt/logs/
options: conns_per_path=2,timeo=100

server: filer2
export: /x mount: /mnt/x
)";

TEST(MpnfstabTest, ParsesBlocks) {
  auto t = ParseTab(kGood, "tab");
  ASSERT_TRUE(t.ok()) << t.error().what;
  ASSERT_EQ(t->size(), 2u);
  const auto& a = (*t)[0];
  EXPECT_EQ(a.server, "filer1");
  EXPECT_EQ(a.paths, (std::vector<std::string>{"10.0.1.2", "10.0.2.2"}));
  ASSERT_EQ(a.exports.size(), 2u);
  EXPECT_EQ(a.exports[1].mount, "/mnt/logs");
  EXPECT_EQ(a.options, "conns_per_path=2,timeo=100");
  EXPECT_EQ(a.where, "tab:3");
  EXPECT_TRUE((*t)[1].paths.empty());
}

TEST(MpnfstabTest, EveryKindOfBadLineNamesFileAndLine) {
  struct Case {
    const char* text;
    const char* expect;
  };
  const Case cases[] = {
      {"path: 1.2.3.4\n", "tab:1: 'path:' before any 'server:' line"},
      {"server: a\nbogus: 1\n", "tab:2: unknown keyword 'bogus:'"},
      {"server: a\npath:\n", "tab:2: 'path:' needs a value"},
      {"server: a\npath 1.2.3.4\n", "tab:2: expected 'keyword:'"},
      {"server: a b\n", "tab:1: expected 'keyword:'"},
      {"server: a path: b\n", "tab:1: 'server:' must stand alone"},
      {"server: a\nexport: /x\n", "tab:2: expected 'export: /EXPORT mount: /MOUNTPOINT'"},
      {"server: a\nexport: x mount: /m\n", "tab:2: export and mount must be absolute"},
      {"server: a\nlocal: 1.1.1.1\n", "tab:2: 'local:' must be followed by 'path:'"},
      {"server: a\nmount: /m\n", "tab:2: 'mount:' cannot start a line"},
      {"server: a\noptions: a=1 b=2\n", "tab:2: expected 'keyword:'"},
      {"server: a\npath: 1 path: 2\n", "tab:2: expected 'path: ADDR'"},
  };
  for (const auto& c : cases) {
    auto t = ParseTab(c.text, "tab");
    ASSERT_FALSE(t.ok()) << c.text;
    EXPECT_NE(t.error().what.find(c.expect), std::string::npos)
        << "got: " << t.error().what << "\nwanted: " << c.expect;
  }
}

TEST(MpnfstabTest, MatchesByMountpointOrByServerAndExport) {
  auto t = ParseTab(kGood, "tab");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(FindTabEntry(*t, "whatever", "/other", "/mnt/data/"), &(*t)[0]);
  EXPECT_EQ(FindTabEntry(*t, "filer1", "/vol/logs", "/elsewhere"), &(*t)[0]);
  EXPECT_EQ(FindTabEntry(*t, "filer2", "/vol/logs", "/elsewhere"), nullptr);
  EXPECT_EQ(FindTabEntry(*t, "filer2", "/x", "/y"), &(*t)[1]);
}

class LoadTest : public ::testing::Test {
 protected:
  FileReader Reader() {
    return [this](const std::string& p) -> Result<std::optional<std::string>> {
      auto it = files_.find(p);
      if (it == files_.end()) return std::optional<std::string>();
      return std::optional<std::string>(it->second);
    };
  }
  std::map<std::string, std::string> files_;
};

TEST_F(LoadTest, TakesPathsAndOptionsFromTheMatchingEntry) {
  files_["/etc/mpnfstab"] = kGood;
  auto m = LoadMountOptions({"filer1:/vol/data", "/mnt/data"}, "", "/etc/mpnfstab", Reader());
  ASSERT_TRUE(m.ok()) << m.error().what;
  EXPECT_EQ(m->paths, (std::vector<std::string>{"10.0.1.2", "10.0.2.2"}));
  EXPECT_EQ(m->engine.conns_per_path, 2);
  EXPECT_EQ(m->engine.timeo.count(), 10000);
  EXPECT_EQ(m->tab_entry, "/etc/mpnfstab:3");
}

TEST_F(LoadTest, CommandLineOverridesTheEntry) {
  files_["/etc/mpnfstab"] = kGood;
  auto m = LoadMountOptions({"filer1:/vol/data", "/mnt/data", "-o", "timeo=5,path=9.9.9.9"}, "",
                            "/etc/mpnfstab", Reader());
  ASSERT_TRUE(m.ok()) << m.error().what;
  EXPECT_EQ(m->engine.timeo.count(), 500);
  EXPECT_EQ(m->paths, (std::vector<std::string>{"9.9.9.9"}));
  EXPECT_EQ(m->engine.conns_per_path, 2);
}

TEST_F(LoadTest, LookupOrderTabOptionThenEnvThenEtc) {
  files_["/a"] = "server: s\npath: 1.1.1.1\nexport: /e mount: /m\n";
  files_["/b"] = "server: s\npath: 2.2.2.2\nexport: /e mount: /m\n";
  files_["/etc/mpnfstab"] = "server: s\npath: 3.3.3.3\nexport: /e mount: /m\n";
  auto m = LoadMountOptions({"s:/e", "/m", "-o", "tab=/a"}, "/b", "/etc/mpnfstab", Reader());
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->paths[0], "1.1.1.1");
  m = LoadMountOptions({"s:/e", "/m"}, "/b", "/etc/mpnfstab", Reader());
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->paths[0], "2.2.2.2");
  m = LoadMountOptions({"s:/e", "/m"}, "", "/etc/mpnfstab", Reader());
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->paths[0], "3.3.3.3");
  // First file without a match: the next one is searched.
  files_["/a"] = "server: other\nexport: /z mount: /z\n";
  m = LoadMountOptions({"s:/e", "/m", "-o", "tab=/a"}, "", "/etc/mpnfstab", Reader());
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->paths[0], "3.3.3.3");
  // No file matches: mount options alone.
  m = LoadMountOptions({"s:/q", "/q"}, "", "/etc/mpnfstab", Reader());
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(m->paths.empty());
  EXPECT_TRUE(m->tab_entry.empty());
}

TEST_F(LoadTest, NamedFilesMustExistAndBeWellFormed) {
  auto m = LoadMountOptions({"s:/e", "/m", "-o", "tab=/missing"}, "", "/etc/mpnfstab", Reader());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().what.find("/missing"), std::string::npos);
  m = LoadMountOptions({"s:/e", "/m"}, "/missing-env", "/etc/mpnfstab", Reader());
  EXPECT_FALSE(m.ok());
  files_["/etc/mpnfstab"] = "server: s\nwat: 1\n";
  m = LoadMountOptions({"s:/e", "/m"}, "", "/etc/mpnfstab", Reader());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().what.find("/etc/mpnfstab:2"), std::string::npos);
  files_["/etc/mpnfstab"] = "server: s\nexport: /e mount: /m\noptions: frob=1\n";
  m = LoadMountOptions({"s:/e", "/m"}, "", "/etc/mpnfstab", Reader());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().what.find("/etc/mpnfstab:1"), std::string::npos);
  EXPECT_NE(m.error().what.find("frob"), std::string::npos);
  files_["/etc/mpnfstab"] = "server: s\nexport: /e mount: /m\noptions: path=1.2.3.4\n";
  EXPECT_FALSE(LoadMountOptions({"s:/e", "/m"}, "", "/etc/mpnfstab", Reader()).ok());
  files_["/etc/mpnfstab"] = "server: s\nexport: /e mount: /m\noptions: local=eth0\n";
  EXPECT_FALSE(LoadMountOptions({"s:/e", "/m"}, "", "/etc/mpnfstab", Reader()).ok());
  // remount is about one mount, not a server's: refused in the file's words,
  // also where --sloppy would have ignored an unknown option.
  files_["/etc/mpnfstab"] = "server: s\nexport: /e mount: /m\noptions: hard,remount\n";
  m = LoadMountOptions({"s:/e", "/m", "--sloppy"}, "", "/etc/mpnfstab", Reader());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().what.find("/etc/mpnfstab:1: 'remount' is not an option of a server's mounts"),
            std::string::npos) << m.error().what;
}

TEST_F(LoadTest, LocalLinesBindTheirPaths) {
  files_["/etc/mpnfstab"] =
      "server: s\nlocal: eth1 path: 1.2.3.4\npath: 1.2.4.4\nlocal: 10.0.0.1 path: 1.2.5.4\n"
      "export: /e mount: /m\n";
  auto m = LoadMountOptions({"s:/e", "/m"}, "", "/etc/mpnfstab", Reader());
  ASSERT_TRUE(m.ok()) << m.error().what;
  EXPECT_EQ(m->paths, (std::vector<std::string>{"1.2.3.4", "1.2.4.4", "1.2.5.4"}));
  EXPECT_EQ(m->locals, (std::vector<std::string>{"eth1", "", "10.0.0.1"}));
  // path= on the command line replaces the entry's paths and their local sides.
  m = LoadMountOptions({"s:/e", "/m", "-o", "path=9.9.9.9"}, "", "/etc/mpnfstab", Reader());
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->paths, (std::vector<std::string>{"9.9.9.9"}));
  EXPECT_TRUE(m->locals.empty());
}

TEST_F(LoadTest, AWeightListWeighsTheBlocksPathsUnlessTheCommandLineGivesOthers) {
  files_["/etc/mpnfstab"] =
      "server: s\npath: 1.2.3.4\npath: 1.2.4.4\nexport: /e mount: /m\noptions: ro,weight=1+4\n";
  auto m = LoadMountOptions({"s:/e", "/m"}, "", "/etc/mpnfstab", Reader());
  ASSERT_TRUE(m.ok()) << m.error().what;
  EXPECT_EQ(m->weights, (std::vector<int>{1, 4}));
  m = LoadMountOptions({"s:/e", "/m", "-o", "weight=2"}, "", "/etc/mpnfstab", Reader());
  ASSERT_TRUE(m.ok()) << m.error().what;
  EXPECT_EQ(m->weights, (std::vector<int>{2}));
  // path= on the command line replaces the block's paths and their weights.
  m = LoadMountOptions({"s:/e", "/m", "-o", "path=9.9.9.9"}, "", "/etc/mpnfstab", Reader());
  ASSERT_TRUE(m.ok()) << m.error().what;
  EXPECT_TRUE(m->weights.empty());
  EXPECT_NE(std::find(m->fuse_opts.begin(), m->fuse_opts.end(), "ro"), m->fuse_opts.end());
  m = LoadMountOptions({"s:/e", "/m", "-o", "path=9.9.9.9+9.9.9.8,weight=5+6"}, "", "/etc/mpnfstab",
                       Reader());
  ASSERT_TRUE(m.ok()) << m.error().what;
  EXPECT_EQ(m->weights, (std::vector<int>{5, 6}));
  // More weights than paths: an error (naming the block when there is one).
  m = LoadMountOptions({"s:/e", "/m", "-o", "path=9.9.9.9,weight=1+2"}, "", "/etc/mpnfstab", Reader());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().what, "/etc/mpnfstab:1: more weight= entries (2) than paths (1)");
  files_.clear();
  m = LoadMountOptions({"s:/e", "/m", "-o", "weight=1+2"}, "", "/etc/mpnfstab", Reader());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().what, "more weight= entries (2) than paths (1)");
  m = LoadMountOptions({"s:/e", "/m", "-o", "path=9.9.9.8+9.9.9.9,weight=1+2"}, "", "/etc/mpnfstab",
                       Reader());
  EXPECT_TRUE(m.ok());
  files_["/etc/mpnfstab"] = "server: s\npath: 1.2.3.4\nexport: /e mount: /m\noptions: weight=1+4\n";
  m = LoadMountOptions({"s:/e", "/m"}, "", "/etc/mpnfstab", Reader());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().what, "/etc/mpnfstab:1: more weight= entries (2) than paths (1)");
}

TEST_F(LoadTest, BlockWithoutPathsUsesTheServerName) {
  files_["/etc/mpnfstab"] = "server: filer9\nexport: /e mount: /m\n";
  auto m = LoadMountOptions({"x:/e", "/m"}, "", "/etc/mpnfstab", Reader());
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->paths, (std::vector<std::string>{"filer9"}));
}

}  // namespace
}  // namespace mpnfs::cli
