#include "cli/control.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

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

TEST(ControlTest, StatsJsonHasProceduresPerPathAndInTotalAndTheHistory) {
  engine::ConnectionStats a, b;
  a.endpoint = "10.0.0.1:2049#0";
  b.endpoint = "10.0.1.1:2049#1";
  auto& ra = a.ops[static_cast<int>(engine::Proc::kRead)];
  ra.ops = 3;
  ra.bytes_in = 3000;
  ra.rtt.buckets[10] = 3;  // 512-1023 us
  ra.rtt.count = 3;
  ra.rtt.sum_us = 2400;
  auto& wb = b.ops[static_cast<int>(engine::Proc::kWrite)];
  wb.ops = 2;
  wb.retransmits = 1;
  b.write_stability[2] = {2, 8192};
  auto& rb = b.ops[static_cast<int>(engine::Proc::kRead)];
  rb.ops = 1;
  rb.bytes_in = 500;
  b.history.push_back(engine::StateChange{
      std::chrono::system_clock::time_point(std::chrono::milliseconds(1700000000123)),
      std::chrono::system_clock::time_point(std::chrono::milliseconds(1700000009000)), "connecting",
      "down", "connect failed: \"refused\"", 4});
  cache::CacheStats k;
  k.dirty_age_s = 1.5;
  k.flush_rate_bps = 77;
  const auto doc = nlohmann::json::parse(StatsJson("s:/e", "/m", {a, b}, &k, 42.5));
  EXPECT_DOUBLE_EQ(doc["uptime_s"].get<double>(), 42.5);
  const auto& c0 = doc["connections"][0];
  EXPECT_EQ(c0["ops"]["READ"]["ops"], 3);
  EXPECT_EQ(c0["ops"]["READ"]["rtt_p50_us"], 1023);
  EXPECT_EQ(c0["ops"]["READ"]["rtt_mean_us"], 800);
  EXPECT_FALSE(c0["ops"].contains("WRITE"));  // never called there
  const auto& c1 = doc["connections"][1];
  EXPECT_EQ(c1["ops"]["WRITE"]["file_sync_bytes"], 8192);
  EXPECT_EQ(c1["ops"]["WRITE"]["unstable_ops"], 0);
  EXPECT_EQ(c1["history"][0]["reason"], "connect failed: \"refused\"");
  EXPECT_EQ(c1["history"][0]["time"], "2023-11-14T22:13:20.123Z");
  EXPECT_EQ(c1["history"][0]["count"], 4);
  // Totals: the sum over the paths.
  EXPECT_EQ(doc["ops"]["READ"]["ops"], 4);
  EXPECT_EQ(doc["ops"]["READ"]["bytes_in"], 3500);
  EXPECT_EQ(doc["ops"]["WRITE"]["retransmits"], 1);
  EXPECT_EQ(doc["ops"]["WRITE"]["file_sync_ops"], 2);
  EXPECT_DOUBLE_EQ(doc["cache"]["dirty_age_s"].get<double>(), 1.5);
  EXPECT_EQ(doc["cache"]["flush_rate_bps"], 77);
}

TEST(ControlTest, PathEncodesTheMountpoint) {
  auto p = ControlPathFor("/");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p, "/run/mpnfs/%2F.sock");
  EXPECT_FALSE(ControlPathFor("/no/such/dir/here").ok());
}

}  // namespace
}  // namespace mpnfs::cli
