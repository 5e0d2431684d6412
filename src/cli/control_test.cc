#include "cli/control.h"

#include <fmt/format.h>

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <thread>
#include <vector>

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
  a.sojourn_us = 2500;
  a.weight = 4;
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
  k.checksum_reads = 5;
  k.checksum_ram_bytes = 4096;
  const auto doc = nlohmann::json::parse(StatsJson("s:/e", "/m", {a, b}, &k, 42.5));
  EXPECT_DOUBLE_EQ(doc["uptime_s"].get<double>(), 42.5);
  const auto& c0 = doc["connections"][0];
  EXPECT_EQ(c0["ops"]["READ"]["ops"], 3);
  EXPECT_EQ(c0["sojourn_us"], 2500);
  EXPECT_EQ(doc["connections"][1]["sojourn_us"], 0);
  EXPECT_EQ(c0["weight"], 4);
  EXPECT_EQ(doc["connections"][1]["weight"], 1);
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
  EXPECT_EQ(doc["cache"]["checksum_reads"], 5);
  EXPECT_EQ(doc["cache"]["checksum_writes"], 0);
  EXPECT_EQ(doc["cache"]["checksum_ram_bytes"], 4096);
}

TEST(ControlTest, StatsJsonHasTheServicesCalls) {
  nfs::ServiceStats mnt;
  mnt.service = "MOUNT";
  mnt.endpoint = "10.0.0.2:20048";
  mnt.calls.ops = 2;
  mnt.calls.transmissions = 3;
  mnt.calls.retransmits = 1;
  mnt.calls.errors = 1;
  mnt.calls.nfs_errors = 1;
  mnt.calls.exe_us = 5000;
  mnt.last_error = "cannot reach the \"MOUNT service\"";
  mnt.last_call = std::chrono::system_clock::time_point(std::chrono::milliseconds(1700000000123));
  nfs::ServiceStats nlm;
  nlm.service = "NLM";
  nlm.endpoint = "10.0.0.2:32803";
  nlm.state = "up";
  nlm.calls.ops = 9;
  nlm.calls.rtt.buckets[10] = 9;
  nlm.calls.rtt.count = 9;
  nlm.calls.rtt.sum_us = 9000;
  nlm.reconnects = 1;
  nlm.lost_locks = 2;
  EXPECT_EQ(nlohmann::json::parse(StatsJson("s:/e", "/m", {}))["services"].size(), 0u);
  const auto doc = nlohmann::json::parse(StatsJson("s:/e", "/m", {}, nullptr, 1, {mnt, nlm}));
  const auto& s = doc["services"];
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0]["service"], "MOUNT");
  EXPECT_EQ(s[0]["endpoint"], "10.0.0.2:20048");
  EXPECT_EQ(s[0]["state"], "none");
  EXPECT_EQ(s[0]["ops"], 2);
  EXPECT_EQ(s[0]["transmissions"], 3);
  EXPECT_EQ(s[0]["retransmits"], 1);
  EXPECT_EQ(s[0]["errors"], 1);
  EXPECT_EQ(s[0]["refusals"], 1);
  EXPECT_EQ(s[0]["exe_mean_us"], 2500);
  EXPECT_EQ(s[0]["last_error"], "cannot reach the \"MOUNT service\"");
  EXPECT_EQ(s[0]["last_call"], "2023-11-14T22:13:20.123Z");
  EXPECT_EQ(s[1]["state"], "up");
  EXPECT_EQ(s[1]["rtt_mean_us"], 1000);
  EXPECT_EQ(s[1]["rtt_p99_us"], 1023);
  EXPECT_EQ(s[1]["reconnects"], 1);
  EXPECT_EQ(s[1]["lost_locks"], 2);
  EXPECT_TRUE(s[1]["last_call"].is_null());
}

TEST(ControlTest, StatsJsonSaysHowFuseRequestsCome) {
  EXPECT_FALSE(nlohmann::json::parse(StatsJson("s:/e", "/m", {})).contains("fuse"));
  const fuse::TransportStats t{"device", "the kernel did not offer \"io_uring\" at INIT", 2, 32, 0, 17};
  const auto doc = nlohmann::json::parse(StatsJson("s:/e", "/m", {}, nullptr, 1, {}, &t));
  const auto& f = doc["fuse"];
  EXPECT_EQ(f["transport"], "device");
  EXPECT_EQ(f["why"], "the kernel did not offer \"io_uring\" at INIT");
  EXPECT_EQ(f["queues"], 2);
  EXPECT_EQ(f["depth"], 32);
  EXPECT_EQ(f["ring_requests"], 0);
  EXPECT_EQ(f["device_requests"], 17);
}

TEST(ControlTest, PathEncodesTheMountpoint) {
  auto p = ControlPathFor("/");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p, "/run/mpnfs/%2F.sock");
  EXPECT_FALSE(ControlPathFor("/no/such/dir/here").ok());
}

// Connects to `path`, sends `cmd`, and returns the socket (-1 on failure).
int Connect(const std::string& path, const std::string& cmd) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return -1;
  const std::string line = cmd + "\n";
  EXPECT_EQ(send(fd, line.data(), line.size(), MSG_NOSIGNAL), static_cast<ssize_t>(line.size()));
  shutdown(fd, SHUT_WR);  // as mpnfsctl does: the client is still there
  timeval tv{10, 0};       // a test that would wait for ever fails instead
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

std::string ReadAll(int fd) {
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

std::string TempSocketPath() {
  return "/tmp/mpnfs-control-test-" + std::to_string(getpid()) + ".sock";
}

TEST(ControlSocketTest, ALongCommandDoesNotHoldUpStats) {
  std::promise<void> release;
  auto released = release.get_future().share();
  ControlSocket sock(TempSocketPath(), [released](const std::string& cmd, bool, Reply& r) {
    if (cmd == "slow") {
      r.Line("progress step=one");
      released.wait();
      r.Line("slow done");
      return;
    }
    r.Text("stats doc\n");
  });
  ASSERT_TRUE(sock.Start().ok());
  int slow = Connect(TempSocketPath(), "slow");
  ASSERT_GE(slow, 0);
  char buf[64];
  ASSERT_GT(read(slow, buf, sizeof(buf)), 0);  // the slow command is running
  int stats = Connect(TempSocketPath(), "stats");
  ASSERT_GE(stats, 0);
  EXPECT_EQ(ReadAll(stats), "stats doc\n");  // answered while "slow" still runs
  release.set_value();
  EXPECT_EQ(ReadAll(slow), "slow done\n");
}

TEST(ControlSocketTest, AHandlerSeesItsClientGoAway) {
  std::promise<int> lines_written;
  ControlSocket sock(TempSocketPath(), [&](const std::string&, bool, Reply& r) {
    int n = 0;
    while (r.Alive() && r.Line("progress n=" + std::to_string(n))) {
      ++n;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    lines_written.set_value(n);
  });
  ASSERT_TRUE(sock.Start().ok());
  int fd = Connect(TempSocketPath(), "forever");
  ASSERT_GE(fd, 0);
  char buf[16];
  ASSERT_GT(read(fd, buf, sizeof(buf)), 0);
  close(fd);
  auto f = lines_written.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready)
      << "the handler kept writing to a closed client";
  EXPECT_GT(f.get(), 0);
}

TEST(ControlSocketTest, ShutdownEndsARunningCommand) {
  std::atomic<bool> returned{false};
  std::promise<void> started;
  auto started_f = started.get_future();
  int fd = -1;
  {
    ControlSocket sock(TempSocketPath(), [&](const std::string&, bool, Reply& r) {
      started.set_value();
      while (r.Alive()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      returned = true;
    });
    ASSERT_TRUE(sock.Start().ok());
    fd = Connect(TempSocketPath(), "forever");
    ASSERT_GE(fd, 0);
    ASSERT_EQ(started_f.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  }  // the destructor joins the handler's thread
  EXPECT_TRUE(returned.load());
  close(fd);
}

// Connects to `path` and sends one byte of a command line every 100 ms
// (never the '\n') until `stop` or the socket fails; returns the socket.
int Dribble(const std::string& path, std::atomic<bool>& stop, std::thread& t) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return -1;
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  t = std::thread([fd, &stop] {
    for (int i = 0; i < 100 && !stop; ++i) {
      if (send(fd, "x", 1, MSG_NOSIGNAL) != 1) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  return fd;
}

TEST(ControlSocketTest, DribblingClientsDoNotLockOutRoot) {
  std::atomic<int> accepted{0};
  std::atomic<bool> stop{false};
  ControlSocket sock(TempSocketPath(), [](const std::string& cmd, bool privileged, Reply& r) {
    r.Line(cmd + (privileged ? " privileged" : " unprivileged"));
  });
  // The first kMaxCommands connections are "non-root" users, later ones root.
  sock.privileged_peer = [&](int) { return ++accepted > ControlSocket::kMaxCommands; };
  ASSERT_TRUE(sock.Start().ok());
  std::vector<std::thread> threads(ControlSocket::kMaxCommands);
  std::vector<int> fds;
  for (auto& t : threads) fds.push_back(Dribble(TempSocketPath(), stop, t));
  for (int fd : fds) ASSERT_GE(fd, 0);
  int root = Connect(TempSocketPath(), "path disable x");
  ASSERT_GE(root, 0);
  EXPECT_EQ(ReadAll(root), "path disable x privileged\n");
  stop = true;
  for (auto& t : threads) t.join();
  for (int fd : fds) close(fd);
}

TEST(ControlSocketTest, ADribblingClientIsDroppedAtTheDeadline) {
  std::atomic<int> handled{0};
  std::atomic<bool> stop{false};
  ControlSocket sock(TempSocketPath(), [&](const std::string&, bool, Reply& r) {
    ++handled;
    r.Line("answered");
  });
  ASSERT_TRUE(sock.Start().ok());
  std::thread t;
  int fd = Dribble(TempSocketPath(), stop, t);  // 100 bytes over 10 s
  ASSERT_GE(fd, 0);
  std::string got;  // the server closes it long before the 10 s are over
  char buf[256];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) got.append(buf, static_cast<size_t>(n));
  stop = true;
  t.join();
  close(fd);
  EXPECT_EQ(got.rfind("error: no complete command line", 0), 0u) << got;
  EXPECT_EQ(handled.load(), 0);
}

TEST(ControlTest, FlushMeterGivesRateAndTimeToGo) {
  FlushMeter m(5.0);
  m.Sample(0, 100 << 20);
  EXPECT_EQ(m.rate_bps(), 0u);
  EXPECT_EQ(m.eta_s(), -1);
  m.Sample(1, 90 << 20);
  m.Sample(2, 80 << 20);
  EXPECT_EQ(m.rate_bps(), 10u << 20);
  EXPECT_EQ(m.eta_s(), 8);
  EXPECT_EQ(m.ProgressLine(), fmt::format("progress dirty_bytes={} rate_bps={} eta_s=8", 80 << 20, 10 << 20));
  m.Sample(3, 0);
  EXPECT_EQ(m.eta_s(), 0);
}

TEST(ControlTest, ProgressLinesRenderForPeople) {
  EXPECT_EQ(RenderProgress("progress dirty_bytes=12582912 rate_bps=3145728 eta_s=64"),
            "flushing: 12.0 MiB dirty, 3.0 MiB/s, 1:04 left");
  EXPECT_EQ(RenderProgress("progress dirty_bytes=12582912 rate_bps=0 eta_s=-1"),
            "flushing: 12.0 MiB dirty, rate not known yet");
  EXPECT_EQ(RenderProgress("progress step=randread path=10.0.0.2 depth=8 iops=1234"),
            "calibrate: randread path 10.0.0.2 depth 8: 1234 IOPS");
  EXPECT_EQ(ProgressField("progress a=1 b=22", "b"), "22");
  EXPECT_FALSE(ProgressField("error: a=1", "a"));
}

}  // namespace
}  // namespace mpnfs::cli
