#include "cli/control.h"

#include <gtest/gtest.h>

namespace mpnfs::cli {
namespace {

TEST(ControlTest, StatsJsonEscapesStringsAndListsConnections) {
  engine::ConnectionStats c;
  c.endpoint = "10.0.0.2:2049#0";
  c.state = "up";
  c.calls = 7;
  c.latency_p99_us = 127;
  const std::string doc = StatsJson("srv:/e", "/mnt/a\"b\\c", {c, c});
  EXPECT_NE(doc.find(R"("mountpoint": "/mnt/a\"b\\c")"), std::string::npos) << doc;
  EXPECT_NE(doc.find(R"("calls": 7)"), std::string::npos);
  EXPECT_NE(doc.find(R"("latency_p99_us": 127})"), std::string::npos);
  EXPECT_EQ(doc.find("},\n  {"), doc.rfind("},\n  {"));  // exactly two objects
}

TEST(ControlTest, StatsJsonHasTheCacheWhenThereIsOne) {
  EXPECT_EQ(StatsJson("s:/e", "/m", {}).find("\"cache\""), std::string::npos);
  cache::CacheStats k;
  k.mode = "readonly";
  k.state = "healthy";
  k.read_hits = 3;
  k.read_misses = 1;
  const std::string doc = StatsJson("s:/e", "/m", {}, &k);
  EXPECT_NE(doc.find(R"("read_hit_ratio": 0.7500)"), std::string::npos) << doc;
  EXPECT_NE(doc.find(R"("mode": "readonly")"), std::string::npos) << doc;
}

TEST(ControlTest, PathEncodesTheMountpoint) {
  auto p = ControlPathFor("/");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p, "/run/mpnfs/%2F.sock");
  EXPECT_FALSE(ControlPathFor("/no/such/dir/here").ok());
}

}  // namespace
}  // namespace mpnfs::cli
