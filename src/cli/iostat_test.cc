#include "cli/iostat.h"

#include <gtest/gtest.h>

#include <sstream>
#include <vector>

#include "cli/control.h"

namespace mpnfs::cli {
namespace {

using engine::Proc;

// A path that has done `writes` 64 KiB WRITEs (2 ms RTT, 3 ms execution each)
// and `lookups` LOOKUPs, one of which found nothing.
engine::ConnectionStats Conn(const std::string& ep, uint64_t writes, uint64_t lookups) {
  engine::ConnectionStats c;
  c.endpoint = ep;
  c.state = "up";
  auto& w = c.ops[static_cast<int>(Proc::kWrite)];
  w.ops = w.transmissions = writes;
  w.bytes_out = writes * 65536;
  w.rtt.count = writes;
  w.rtt.sum_us = writes * 2000;
  w.exe_us = writes * 3000;
  auto& l = c.ops[static_cast<int>(Proc::kLookup)];
  l.ops = l.transmissions = lookups;
  l.nfs_errors = lookups > 0 ? 1 : 0;
  return c;
}

std::string Doc(double uptime, uint64_t writes0, uint64_t writes1, uint64_t lookups) {
  return StatsJson("srv:/e", "/mnt",
                   {Conn("10.0.0.1:2049#0", writes0, lookups), Conn("10.0.1.1:2049#1", writes1, 0)},
                   nullptr, uptime);
}

// The report's line for `path` and `op`, split in words.
std::vector<std::string> Line(const std::string& report, const std::string& path,
                              const std::string& op) {
  std::istringstream in(report);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream w(line);
    std::vector<std::string> words;
    for (std::string x; w >> x;) words.push_back(x);
    if (words.size() >= 2 && words[0] == path) {
      // "10.0.0.1:2049#0 (up) WRITE ...": the state follows the endpoint.
      size_t at = words[1].front() == '(' ? 2 : 1;
      if (words.size() > at && words[at] == op)
        return {words.begin() + static_cast<long>(at), words.end()};
    }
  }
  ADD_FAILURE() << "no line for " << path << " " << op << " in\n" << report;
  return {};
}

TEST(IostatTest, ParsesTheStatisticsDocument) {
  auto s = ParseIostatSample(Doc(10, 100, 50, 4));
  ASSERT_TRUE(s.ok()) << s.error().what;
  EXPECT_EQ(s->source, "srv:/e");
  EXPECT_DOUBLE_EQ(s->uptime_s, 10);
  EXPECT_EQ(s->paths.at("all").at("WRITE").ops, 150u);
  EXPECT_EQ(s->paths.at("all").at("WRITE").bytes, 150u * 65536);
  EXPECT_EQ(s->paths.at("10.0.0.1:2049#0").at("WRITE").rtt_total_us, 200000u);
  EXPECT_EQ(s->paths.at("10.0.0.1:2049#0").at("LOOKUP").nfs_errors, 1u);
  EXPECT_EQ(s->states.at("10.0.1.1:2049#1"), "up");
  EXPECT_FALSE(ParseIostatSample("not json").ok());
  EXPECT_FALSE(ParseIostatSample(R"({"connections": []})").ok());  // no per-procedure counters
}

TEST(IostatTest, RatesAreOverTheIntervalBetweenTwoSamples) {
  auto a = ParseIostatSample(Doc(10, 100, 50, 4));
  auto b = ParseIostatSample(Doc(12, 300, 50, 4));
  ASSERT_TRUE(a.ok() && b.ok());
  const std::string r = IostatReport(&*a, *b);
  EXPECT_NE(r.find("srv:/e mounted on /mnt (over 2.00 s)"), std::string::npos) << r;
  // op ops/s kB/s kB/op retrans errors nfs_err rtt exe
  EXPECT_EQ(Line(r, "all", "WRITE"),
            (std::vector<std::string>{"WRITE", "100.00", "6400.00", "64.00", "0", "0", "0", "2.000",
                                      "3.000"}));
  EXPECT_EQ(Line(r, "10.0.0.1:2049#0", "WRITE")[1], "100.00");
  EXPECT_EQ(Line(r, "10.0.1.1:2049#1", "WRITE")[1], "0.00");  // idle meanwhile
  EXPECT_EQ(Line(r, "all", "READ")[1], "0.00");               // always shown
  EXPECT_EQ(r.find("LOOKUP"), std::string::npos) << r;        // not called meanwhile
}

TEST(IostatTest, TheFirstReportCoversTheTimeSinceTheMount) {
  auto a = ParseIostatSample(Doc(4, 100, 100, 8));
  ASSERT_TRUE(a.ok());
  const std::string r = IostatReport(nullptr, *a);
  EXPECT_NE(r.find("since the mount, 4.00 s"), std::string::npos) << r;
  EXPECT_EQ(Line(r, "all", "WRITE")[1], "50.00");
  EXPECT_EQ(Line(r, "all", "LOOKUP"), (std::vector<std::string>{"LOOKUP", "2.00", "0.00", "0.00",
                                                                "0", "0", "1", "0.000", "0.000"}));
}

TEST(IostatTest, ARemovedPathDoesNotMakeTheTotalsJump) {
  // A (600 WRITEs) and B (400); 1 s later B is removed and A has done 10 more.
  auto a = ParseIostatSample(Doc(10, 600, 400, 0));
  auto b = ParseIostatSample(StatsJson("srv:/e", "/mnt", {Conn("10.0.0.1:2049#0", 610, 0)}, nullptr, 11));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(b->paths.at("all").at("WRITE").ops, 610u);  // the document's total went back
  const std::string r = IostatReport(&*a, *b);
  EXPECT_EQ(Line(r, "all", "WRITE")[1], "10.00") << r;
  // A path added meanwhile counts from 0; a counter that went back gives 0.
  auto c = ParseIostatSample(StatsJson(
      "srv:/e", "/mnt", {Conn("10.0.0.1:2049#0", 5, 0), Conn("10.0.2.1:2049#2", 20, 0)}, nullptr, 12));
  ASSERT_TRUE(c.ok());
  const std::string r2 = IostatReport(&*b, *c);
  EXPECT_EQ(Line(r2, "all", "WRITE")[1], "20.00") << r2;
  EXPECT_EQ(Line(r2, "10.0.0.1:2049#0", "WRITE")[1], "0.00") << r2;
}

}  // namespace
}  // namespace mpnfs::cli
