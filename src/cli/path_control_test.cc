#include "cli/path_control.h"

#include <gtest/gtest.h>

#include <thread>

#include "test/fakes/fake_transport.h"

namespace mpnfs::cli {
namespace {

using namespace std::chrono_literals;

class PathControlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    engine::EngineOptions o;
    o.paths = {engine::Endpoint{"10.0.0.1", 2049, {}}, engine::Endpoint{"10.0.1.1", 2049, {}}};
    o.backoff_initial = 20ms;
    o.backoff_max = 100ms;
    eng_ = std::make_unique<engine::Engine>(o, [this](engine::TransportSink* sink) {
      return std::make_unique<testing::FakeTransport>(&net_, sink);
    });
    eng_->Start();
    // Disable and remove refuse to take out the last path that is up: the
    // tests start with both up.
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    auto all_up = [&] {
      for (const auto& p : eng_->Paths()) {
        if (p.state != "up") return false;
      }
      return true;
    };
    while (!all_up() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
    ASSERT_TRUE(all_up());
  }
  std::string Run(const std::string& cmd, bool privileged = true) {
    return PathCommand(cmd, privileged, *eng_);
  }
  testing::FakeNet net_;
  std::unique_ptr<engine::Engine> eng_;
};

TEST_F(PathControlTest, AnyoneListsOnlyRootChanges) {
  const std::string list = Run("path list", false);
  EXPECT_EQ(list.rfind("PATH ", 0), 0u) << list;
  EXPECT_NE(list.find("\n10.0.0.1:2049 "), std::string::npos) << list;
  EXPECT_NE(list.find("\n10.0.1.1:2049 "), std::string::npos) << list;
  for (const char* cmd : {"path disable 10.0.1.1", "path enable 10.0.1.1", "path remove 10.0.1.1",
                          "path add 10.0.2.1", "path weight 10.0.1.1 3"}) {
    EXPECT_EQ(Run(cmd, false), "error: only root may change the paths of a mount\n") << cmd;
  }
  EXPECT_EQ(eng_->Paths().size(), 2u);
  EXPECT_EQ(eng_->Paths()[1].admin, "enabled");
  EXPECT_EQ(eng_->Paths()[1].endpoint.weight, 1);
}

TEST_F(PathControlTest, AnAddedPathTakesItsWeightAndTheListShowsIt) {
  EXPECT_EQ(Run("path add 10.0.2.1 weight=4 local=lo").rfind("path 10.0.2.1:2049 added (weight 4)", 0), 0u);
  const auto paths = eng_->Paths();
  ASSERT_EQ(paths.size(), 3u);
  EXPECT_EQ(paths[0].endpoint.weight, 1);
  EXPECT_EQ(paths[2].endpoint.weight, 4);
  EXPECT_EQ(paths[2].endpoint.local, "lo");
  const std::string list = Run("path list", false);
  EXPECT_NE(list.find(" WEIGHT LOCAL\n"), std::string::npos) << list;
  EXPECT_NE(list.find("      4 lo\n"), std::string::npos) << list;
}

TEST_F(PathControlTest, AWeightIsSetOnlineAndTheListShowsIt) {
  EXPECT_EQ(Run("path weight 10.0.1.1 3"), "path 10.0.1.1:2049 weight 3 (was 1): new calls are balanced by it\n");
  EXPECT_EQ(Run("path weight 10.0.1.1:2049 7"), "path 10.0.1.1:2049 weight 7 (was 3): new calls are balanced by it\n");
  const auto paths = eng_->Paths();
  ASSERT_EQ(paths.size(), 2u);
  EXPECT_EQ(paths[0].endpoint.weight, 1);
  EXPECT_EQ(paths[1].endpoint.weight, 7);
  const std::string list = Run("path list", false);
  EXPECT_NE(list.find("      7 -\n"), std::string::npos) << list;
  for (const auto& c : eng_->Stats()) EXPECT_EQ(c.weight, c.endpoint.rfind("10.0.1.1:", 0) == 0 ? 7 : 1);
  EXPECT_EQ(Run("path weight 10.0.1.1 0"), "error: path weight: bad weight '0' (1 to 1000)\n");
  EXPECT_EQ(Run("path weight 10.0.1.1 1001"), "error: path weight: bad weight '1001' (1 to 1000)\n");
  EXPECT_EQ(Run("path weight 10.0.1.1 2x"), "error: path weight: bad weight '2x' (1 to 1000)\n");
  EXPECT_EQ(Run("path weight 10.0.1.1").rfind("error: usage:", 0), 0u);
  EXPECT_EQ(Run("path weight 10.0.1.1 2 3").rfind("error: usage:", 0), 0u);
  EXPECT_EQ(Run("path weight 10.9.9.9 2"),
            "error: no path 10.9.9.9 on this mount; paths are: 10.0.0.1:2049, 10.0.1.1:2049\n");
  EXPECT_EQ(eng_->Paths()[1].endpoint.weight, 7);
}

// calibrate --apply's engine call: every path at once, or none if the
// mount's paths are not exactly the ones named.
TEST_F(PathControlTest, WeightsAreSetAllAtOnceOrNotAtAll) {
  auto r = eng_->SetWeights({{"10.0.0.1:2049", 10}, {"10.0.1.1:2049", 40}});
  ASSERT_TRUE(r) << r.error().what;
  EXPECT_EQ(*r,
            "path 10.0.0.1:2049 weight 10 (was 1): new calls are balanced by it\n"
            "path 10.0.1.1:2049 weight 40 (was 1): new calls are balanced by it\n");
  ASSERT_EQ(Run("path add 10.0.2.1").rfind("path 10.0.2.1:2049 added", 0), 0u);
  r = eng_->SetWeights({{"10.0.0.1:2049", 20}, {"10.0.1.1:2049", 20}});  // a path added since
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().what, "the paths changed (measured 10.0.0.1:2049, 10.0.1.1:2049; now "
                            "10.0.0.1:2049, 10.0.1.1:2049, 10.0.2.1:2049)");
  const auto paths = eng_->Paths();
  EXPECT_EQ(paths[0].endpoint.weight, 10);
  EXPECT_EQ(paths[1].endpoint.weight, 40);
  EXPECT_EQ(paths[2].endpoint.weight, 1);
}

TEST_F(PathControlTest, SaysWhatIsWrong) {
  EXPECT_EQ(Run("path disable 10.9.9.9"),
            "error: no path 10.9.9.9 on this mount; paths are: 10.0.0.1:2049, 10.0.1.1:2049\n");
  EXPECT_EQ(Run("path frob").rfind("error: usage: path list", 0), 0u);
  EXPECT_EQ(Run("path disable").rfind("error: usage:", 0), 0u);
  EXPECT_EQ(Run("path add 10.0.2.1:99999"), "error: path add: bad port '99999' (1 to 65535)\n");
  EXPECT_NE(Run("path add 10.0.2.1 local=nosuch0").find("no such interface"), std::string::npos);
  EXPECT_NE(Run("path add 10.0.0.1").find("already on this mount"), std::string::npos);
  EXPECT_EQ(Run("path add 10.0.2.1 weight=0"), "error: path add: bad weight '0' (1 to 1000)\n");
  EXPECT_EQ(Run("path add 10.0.2.1 weight=2x"), "error: path add: bad weight '2x' (1 to 1000)\n");
  EXPECT_EQ(Run("path add 10.0.2.1 weight=2 weight=3").rfind("error: usage:", 0), 0u);
  EXPECT_EQ(eng_->Paths().size(), 2u);
  EXPECT_EQ(Run("path disable 10.0.0.1").rfind("path 10.0.0.1:2049 disabled", 0), 0u);
  EXPECT_NE(Run("path remove 10.0.1.1").find("last enabled path"), std::string::npos);
  EXPECT_NE(Run("path list").find("10.0.0.1:2049          disabled"), std::string::npos)
      << Run("path list");
}

TEST_F(PathControlTest, AddsAPathOnAnotherPort) {
  EXPECT_EQ(Run("path add 10.0.2.1:2050").rfind("path 10.0.2.1:2050 added", 0), 0u);
  ASSERT_EQ(eng_->Paths().size(), 3u);
  EXPECT_EQ(eng_->Paths()[2].endpoint.port, 2050);
  EXPECT_NE(Run("path list").find("\n10.0.2.1:2050 "), std::string::npos);
  EXPECT_EQ(Run("path enable 10.0.2.1:2050"), "path 10.0.2.1:2050 is already enabled\n");
}

}  // namespace
}  // namespace mpnfs::cli
