#include "cli/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <regex>
#include <set>
#include <sstream>

namespace mpnfs::cli {
namespace {

using engine::Proc;

engine::ConnectionStats Conn(const std::string& ep, const std::string& state, uint64_t reads) {
  engine::ConnectionStats c;
  c.endpoint = ep;
  c.state = state;
  c.calls = reads + 2;
  c.replies = reads + 2;
  auto& r = c.ops[static_cast<int>(Proc::kRead)];
  r.ops = r.transmissions = reads;
  r.bytes_in = reads * 65536;
  r.exe_us = reads * 1500;
  for (uint64_t i = 0; i < reads; ++i) {
    const int b = i % 2 == 0 ? 10 : 12;  // 512-1023 us and 2048-4095 us
    r.rtt.buckets[b]++;
    r.rtt.count++;
    r.rtt.sum_us += b == 10 ? 1000 : 3000;
  }
  auto& w = c.ops[static_cast<int>(Proc::kWrite)];
  w.ops = w.transmissions = 2;
  w.retransmits = 1;
  w.bytes_out = 8192;
  c.write_stability[0] = {1, 4096};
  c.write_stability[2] = {1, 4096};
  c.history.push_back(
      engine::StateChange{std::chrono::system_clock::time_point(std::chrono::seconds(1700000000)),
                          std::chrono::system_clock::time_point(std::chrono::seconds(1700000005)),
                          "probing", state, "NFS NULL call answered", 1});
  c.transitions = 3;
  c.sojourn_us = reads * 1000;
  c.weight = static_cast<int>(reads) + 1;
  return c;
}

MountSnapshot Sample() {
  MountSnapshot s;
  s.source = "srv:/export";
  s.mountpoint = "/mnt/a \"b\"\\c";
  s.uptime_s = 12.5;
  s.conns = {Conn("10.0.0.1:2049#0", "up", 6), Conn("10.0.1.1:2049#1", "down", 0)};
  cache::CacheStats k;
  k.mode = "writeback";
  k.state = "healthy";
  k.dirty_bytes = 8192;
  k.dirty_age_s = 2.5;
  k.flush_rate_bps = 1000;
  k.flushed_bytes = 10000;
  s.cache = k;
  nfs::ServiceStats mnt;
  mnt.service = "MOUNT";
  mnt.calls.ops = 2;
  mnt.calls.errors = 1;
  mnt.calls.nfs_errors = 1;
  mnt.calls.transmissions = 3;
  nfs::ServiceStats nlm;
  nlm.service = "NLM";
  nlm.state = "up";
  nlm.calls.ops = 5;
  nlm.calls.rtt.buckets[10] = 5;
  nlm.calls.rtt.count = 5;
  nlm.calls.rtt.sum_us = 5000;
  nlm.reconnects = 1;
  nlm.lost_locks = 3;
  s.services = {mnt, nlm};
  return s;
}

struct Sample_ {
  std::string name;
  std::map<std::string, std::string> labels;
  double value;
};

// Parses the text format strictly enough to catch malformed output: every
// line is a comment (# HELP / # TYPE) or `name{labels} value`.
std::vector<Sample_> Parse(const std::string& text, std::map<std::string, std::string>* types) {
  static const std::regex kSample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$)");
  static const std::regex kLabel(R"re(([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?)re");
  std::vector<Sample_> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# HELP ", 0) == 0) continue;
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream t(line.substr(7));
      std::string name, type;
      t >> name >> type;
      EXPECT_EQ(types->count(name), 0u) << "family twice: " << name;
      (*types)[name] = type;
      continue;
    }
    std::smatch m;
    if (!std::regex_match(line, m, kSample)) {
      ADD_FAILURE() << "not a sample line: " << line;
      continue;
    }
    Sample_ s{m[1], {}, std::stod(m[4])};
    std::string labels = m[3];
    size_t consumed = 0;
    for (std::sregex_iterator it(labels.begin(), labels.end(), kLabel), end; it != end; ++it) {
      EXPECT_EQ(static_cast<size_t>(it->position()), consumed) << line;
      consumed += it->length();
      s.labels[(*it)[1]] = (*it)[2];
    }
    EXPECT_EQ(consumed, labels.size()) << "bad labels: " << line;
    out.push_back(std::move(s));
  }
  return out;
}

double Find(const std::vector<Sample_>& v, const std::string& name,
            const std::map<std::string, std::string>& want) {
  for (const auto& s : v) {
    if (s.name != name) continue;
    bool ok = true;
    for (const auto& [k, val] : want) ok = ok && s.labels.count(k) && s.labels.at(k) == val;
    if (ok) return s.value;
  }
  ADD_FAILURE() << "no sample " << name;
  return -1;
}

TEST(MetricsTest, TextFormatIsWellFormedAndNamedByTheRules) {
  std::map<std::string, std::string> types;
  const auto samples = Parse(PrometheusText(Sample()), &types);
  ASSERT_FALSE(samples.empty());
  for (const auto& [name, type] : types) {
    EXPECT_EQ(name.rfind("mpnfs_", 0), 0u) << name;
    const bool total = name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0;
    EXPECT_EQ(total, type == "counter") << name << " is a " << type;
  }
  for (const auto& s : samples) {
    EXPECT_EQ(s.labels.count("mount"), 1u) << s.name;
    // Every sample belongs to a declared family (histograms: _bucket/_sum/_count).
    std::string fam = s.name;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string sx = suffix;
      if (!types.count(fam) && fam.size() > sx.size() &&
          fam.compare(fam.size() - sx.size(), sx.size(), sx) == 0) {
        fam = fam.substr(0, fam.size() - sx.size());
      }
    }
    EXPECT_EQ(types.count(fam), 1u) << s.name;
  }
  EXPECT_EQ(types["mpnfs_rpc_rtt_seconds"], "histogram");
  EXPECT_EQ(types["mpnfs_path_up"], "gauge");
}

TEST(MetricsTest, ReportsPerPathPerProcedureWithEscapedLabels) {
  std::map<std::string, std::string> types;
  const auto v = Parse(PrometheusText(Sample()), &types);
  const std::string mount = R"(/mnt/a \"b\"\\c)";  // as escaped in the text
  const std::string p0 = "10.0.0.1:2049#0";
  EXPECT_EQ(Find(v, "mpnfs_rpc_ops_total", {{"mount", mount}, {"path", p0}, {"op", "READ"}}), 6);
  EXPECT_EQ(Find(v, "mpnfs_rpc_received_bytes_total", {{"path", p0}, {"op", "READ"}}), 6 * 65536);
  EXPECT_DOUBLE_EQ(Find(v, "mpnfs_rpc_execute_seconds_total", {{"path", p0}, {"op", "READ"}}),
                   0.009);
  EXPECT_EQ(Find(v, "mpnfs_rpc_retransmits_total", {{"path", p0}, {"op", "WRITE"}}), 1);
  EXPECT_EQ(Find(v, "mpnfs_rpc_write_bytes_total", {{"path", p0}, {"stable", "file_sync"}}), 4096);
  EXPECT_EQ(Find(v, "mpnfs_rpc_write_ops_total", {{"path", p0}, {"stable", "data_sync"}}), 0);
  EXPECT_EQ(Find(v, "mpnfs_path_up", {{"path", p0}}), 1);
  EXPECT_DOUBLE_EQ(Find(v, "mpnfs_path_sojourn_seconds", {{"path", p0}}), 0.006);
  EXPECT_EQ(Find(v, "mpnfs_path_weight", {{"path", p0}}), 7);
  EXPECT_EQ(Find(v, "mpnfs_path_up", {{"path", "10.0.1.1:2049#1"}}), 0);
  EXPECT_EQ(Find(v, "mpnfs_path_state", {{"path", "10.0.1.1:2049#1"}, {"state", "down"}}), 1);
  EXPECT_EQ(Find(v, "mpnfs_path_state", {{"path", "10.0.1.1:2049#1"}, {"state", "up"}}), 0);
  EXPECT_EQ(Find(v, "mpnfs_path_last_transition_timestamp_seconds", {{"path", p0}}), 1700000005);
  EXPECT_EQ(Find(v, "mpnfs_uptime_seconds", {}), 12.5);
  EXPECT_EQ(Find(v, "mpnfs_mount_info", {{"source", "srv:/export"}}), 1);
  EXPECT_EQ(Find(v, "mpnfs_cache_dirty_age_seconds", {}), 2.5);
  EXPECT_EQ(Find(v, "mpnfs_cache_flush_rate_bytes_per_second", {}), 1000);
  EXPECT_EQ(Find(v, "mpnfs_cache_flushed_bytes_total", {}), 10000);
  EXPECT_EQ(Find(v, "mpnfs_cache_state", {{"state", "healthy"}}), 1);
  // A procedure never called on a path is left out (the second path read nothing).
  for (const auto& s : v) {
    if (s.name == "mpnfs_rpc_ops_total") {
      EXPECT_TRUE(s.labels.at("op") == "READ" || s.labels.at("op") == "WRITE") << s.labels.at("op");
      EXPECT_FALSE(s.labels.at("path") == "10.0.1.1:2049#1" && s.labels.at("op") == "READ");
    }
  }
}

TEST(MetricsTest, ReportsTheServicesCallsByService) {
  std::map<std::string, std::string> types;
  const auto v = Parse(PrometheusText(Sample()), &types);
  EXPECT_EQ(Find(v, "mpnfs_service_ops_total", {{"service", "MOUNT"}}), 2);
  EXPECT_EQ(Find(v, "mpnfs_service_errors_total", {{"service", "MOUNT"}}), 1);
  EXPECT_EQ(Find(v, "mpnfs_service_transmissions_total", {{"service", "MOUNT"}}), 3);
  EXPECT_EQ(Find(v, "mpnfs_service_ops_total", {{"service", "NLM"}}), 5);
  EXPECT_EQ(Find(v, "mpnfs_service_rtt_seconds_count", {{"service", "NLM"}}), 5);
  EXPECT_EQ(Find(v, "mpnfs_service_up", {{"service", "NLM"}}), 1);
  EXPECT_EQ(Find(v, "mpnfs_service_reconnects_total", {{"service", "NLM"}}), 1);
  EXPECT_EQ(Find(v, "mpnfs_locks_lost_total", {}), 3);
  EXPECT_EQ(types["mpnfs_service_rtt_seconds"], "histogram");
  EXPECT_EQ(Find(v, "mpnfs_service_refusals_total", {{"service", "MOUNT"}}), 1);
  for (const auto& s : v) {
    // Only a connection kept open has a state.
    if (s.name == "mpnfs_service_up") {
      EXPECT_EQ(s.labels.at("service"), "NLM");
    }
    // The mount's locks, not a service's.
    if (s.name == "mpnfs_locks_lost_total") {
      EXPECT_EQ(s.labels.count("service"), 0u);
    }
  }
}

TEST(MetricsTest, RttHistogramIsCumulativeInSeconds) {
  std::map<std::string, std::string> types;
  const auto v = Parse(PrometheusText(Sample()), &types);
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<std::pair<double, double>> buckets;  // le -> count, for READ on path 0
  for (const auto& s : v) {
    if (s.name == "mpnfs_rpc_rtt_seconds_bucket" && s.labels.at("op") == "READ" &&
        s.labels.at("path") == "10.0.0.1:2049#0") {
      const std::string le = s.labels.at("le");
      buckets.emplace_back(le == "+Inf" ? kInf : std::stod(le), s.value);
    }
  }
  ASSERT_GE(buckets.size(), 3u);
  for (size_t i = 1; i < buckets.size(); ++i) {
    EXPECT_LT(buckets[i - 1].first, buckets[i].first);
    EXPECT_LE(buckets[i - 1].second, buckets[i].second);
  }
  EXPECT_EQ(buckets.back().first, kInf);
  EXPECT_EQ(buckets.back().second, 6);
  // 3 samples under 1024 us, all 6 under 4096 us.
  for (const auto& [le, n] : buckets) {
    if (std::abs(le - 1024e-6) < 1e-9) {
      EXPECT_EQ(n, 3);
    } else if (std::abs(le - 512e-6) < 1e-9) {
      EXPECT_EQ(n, 0);
    } else if (std::abs(le - 4096e-6) < 1e-9) {
      EXPECT_EQ(n, 6);
    }
  }
  EXPECT_EQ(Find(v, "mpnfs_rpc_rtt_seconds_count", {{"op", "READ"}}), 6);
  EXPECT_DOUBLE_EQ(Find(v, "mpnfs_rpc_rtt_seconds_sum", {{"op", "READ"}}), 0.012);
}

TEST(MetricsTest, ReportsTheFuseTransportAndItsRequests) {
  MountSnapshot s = Sample();
  EXPECT_EQ(PrometheusText(s).find("mpnfs_fuse_"), std::string::npos);
  s.fuse = fuse::TransportStats{"io_uring", "", 2, 32, 1234, 5};
  std::map<std::string, std::string> types;
  const auto v = Parse(PrometheusText(s), &types);
  EXPECT_EQ(Find(v, "mpnfs_fuse_transport_info", {{"transport", "io_uring"}}), 1);
  EXPECT_EQ(Find(v, "mpnfs_fuse_requests_total", {{"transport", "io_uring"}}), 1234);
  EXPECT_EQ(Find(v, "mpnfs_fuse_requests_total", {{"transport", "device"}}), 5);
  EXPECT_EQ(types["mpnfs_fuse_requests_total"], "counter");
  EXPECT_EQ(types["mpnfs_fuse_transport_info"], "gauge");
}

TEST(MetricsTest, NoCacheNoCacheMetrics) {
  MountSnapshot s = Sample();
  s.cache.reset();
  EXPECT_EQ(PrometheusText(s).find("mpnfs_cache_"), std::string::npos);
}

}  // namespace
}  // namespace mpnfs::cli
