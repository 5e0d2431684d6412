// The engine's statistics: per-procedure accounting and the state history,
// over the fake transport (test/fakes/fake_transport.h).
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "engine/engine.h"
#include "test/fakes/fake_transport.h"
#include "test/fakes/wait_up.h"

namespace mpnfs::engine {
namespace {

using testing::FakeNet;
using testing::FakeTransport;
using namespace std::chrono_literals;

// A call that says what it is, as the NFS layer's calls do.
class StatCall : public RpcCall {
 public:
  StatCall(Proc proc, size_t bytes_out = 0, size_t bytes_in = 0)
      : proc_(proc), bytes_out_(bytes_out), bytes_in_(bytes_in) {}
  const char* Name() const override { return ProcName(proc_); }
  Proc Procedure() const override { return proc_; }
  Stability WriteStability() const override { return stability; }
  size_t BytesOut() const override { return bytes_out_; }
  size_t BytesIn() const override { return bytes_in_; }
  ReplySummary Summarize(const void* result) const override {
    EXPECT_NE(result, nullptr);
    return ReplySummary{nfs_status, data_bytes};
  }
  bool EncodeArgs(proto::XdrOut&) override { return false; }
  bool DecodeResult(proto::XdrIn&, void*) override { return false; }
  void Complete(const CallOutcome& o) override { done.set_value(o.status); }

  Stability stability = Stability::kUnstable;
  int nfs_status = 0;
  int64_t data_bytes = -1;
  std::promise<CallStatus> done;

 private:
  Proc proc_;
  size_t bytes_out_, bytes_in_;
};

EngineOptions Opts() {
  EngineOptions o;
  o.paths = {Endpoint{"127.0.0.1", 2049, {}}};
  o.timeo = 5s;
  o.retrans = 2;
  o.backoff_initial = 20ms;
  o.backoff_max = 100ms;
  o.connect_timeout = 2s;
  return o;
}

class EngineStatsTest : public ::testing::Test {
 protected:
  std::unique_ptr<Engine> Started(EngineOptions o) {
    auto e = std::make_unique<Engine>(
        o, [this](TransportSink* sink) { return std::make_unique<FakeTransport>(&net_, sink); });
    e->Start();
    testing::WaitAllUp(*e);
    return e;
  }
  CallStatus Run(Engine& e, const std::shared_ptr<StatCall>& c) {
    auto f = c->done.get_future();
    e.Submit(c, Cred{});
    EXPECT_EQ(f.wait_for(5s), std::future_status::ready) << "call never completed";
    return f.valid() ? f.get() : CallStatus::kShutdown;
  }
  // The sum over the connections, as the mount's totals are made.
  static OpStats Total(Engine& e, Proc p) {
    OpStats t;
    for (const auto& s : e.Stats()) t.Merge(s.ops[static_cast<int>(p)]);
    return t;
  }
  FakeNet net_;
};

TEST_F(EngineStatsTest, CountsEachCallUnderItsProcedure) {
  auto o = Opts();
  o.paths = {Endpoint{"10.0.0.1", 2049, {}}, Endpoint{"10.0.1.1", 2049, {}}};
  auto e = Started(o);
  for (int i = 0; i < 6; ++i) {
    auto c = std::make_shared<StatCall>(Proc::kRead, 0, 4096);
    c->data_bytes = 1000;  // a short read: the reply carries less than asked
    EXPECT_EQ(Run(*e, c), CallStatus::kOk);
  }
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(Run(*e, std::make_shared<StatCall>(Proc::kGetattr)), CallStatus::kOk);
  }
  const OpStats read = Total(*e, Proc::kRead);
  EXPECT_EQ(read.ops, 6u);
  EXPECT_EQ(read.transmissions, 6u);
  EXPECT_EQ(read.bytes_in, 6000u);
  EXPECT_EQ(read.bytes_out, 0u);
  EXPECT_EQ(read.rtt.count, 6u);
  EXPECT_EQ(read.retransmits + read.errors + read.nfs_errors, 0u);
  EXPECT_EQ(Total(*e, Proc::kGetattr).ops, 2u);
  EXPECT_EQ(Total(*e, Proc::kWrite).ops, 0u);
  // The engine's own NULL probes are not calls.
  uint64_t probes = 0;
  for (const auto& s : e->Stats()) probes += s.probes;
  EXPECT_GE(probes, 2u);
  EXPECT_EQ(Total(*e, Proc::kNull).transmissions, 0u);
  // The connection-level byte count is the data the replies carried too.
  uint64_t in = 0;
  for (const auto& s : e->Stats()) in += s.bytes_in;
  EXPECT_EQ(in, 6000u);
}

TEST_F(EngineStatsTest, ARetransmittedCallCountsOneRetransmissionUnderItsProcedure) {
  auto o = Opts();
  o.timeo = 50ms;
  auto e = Started(o);
  net_.Set([](FakeNet& n) { n.drop_first_n = 1; });
  auto c = std::make_shared<StatCall>(Proc::kWrite, 65536);
  EXPECT_EQ(Run(*e, c), CallStatus::kOk);
  const auto s = e->Stats()[0];
  const OpStats& w = s.ops[static_cast<int>(Proc::kWrite)];
  EXPECT_EQ(w.ops, 1u);
  EXPECT_EQ(w.transmissions, 2u);
  EXPECT_EQ(w.retransmits, 1u);
  EXPECT_EQ(w.bytes_out, 2u * 65536);  // on the wire twice
  EXPECT_EQ(w.rtt.count, 1u);          // one answer
  EXPECT_EQ(w.errors, 0u);
  EXPECT_EQ(s.retransmits, 1u);
  for (int p = 0; p < kProcCount; ++p) {
    if (p != static_cast<int>(Proc::kWrite)) {
      EXPECT_EQ(s.ops[p].retransmits, 0u) << p;
    }
  }
  EXPECT_GE(w.exe_us, 50000u);  // waited out timeo before the resend
}

TEST_F(EngineStatsTest, WritesAreSplitByStability) {
  auto e = Started(Opts());
  auto write = [&](Stability st, size_t len) {
    auto c = std::make_shared<StatCall>(Proc::kWrite, len);
    c->stability = st;
    EXPECT_EQ(Run(*e, c), CallStatus::kOk);
  };
  write(Stability::kUnstable, 1000);
  write(Stability::kUnstable, 2000);
  write(Stability::kDataSync, 300);
  write(Stability::kFileSync, 40);
  const auto s = e->Stats()[0];
  EXPECT_EQ(s.write_stability[0].ops, 2u);
  EXPECT_EQ(s.write_stability[0].bytes, 3000u);
  EXPECT_EQ(s.write_stability[1].ops, 1u);
  EXPECT_EQ(s.write_stability[1].bytes, 300u);
  EXPECT_EQ(s.write_stability[2].ops, 1u);
  EXPECT_EQ(s.write_stability[2].bytes, 40u);
  EXPECT_EQ(s.ops[static_cast<int>(Proc::kWrite)].ops, 4u);
  EXPECT_EQ(s.ops[static_cast<int>(Proc::kWrite)].bytes_out, 3340u);
}

TEST_F(EngineStatsTest, NfsErrorStatusesAreCountedApartFromFailedCalls) {
  auto o = Opts();
  o.soft = true;
  o.timeo = 30ms;
  o.retrans = 1;
  auto e = Started(o);
  // The server answers: NFS3ERR_NOENT is a reply, not a transport error.
  auto lookup = std::make_shared<StatCall>(Proc::kLookup);
  lookup->nfs_status = 2;
  EXPECT_EQ(Run(*e, lookup), CallStatus::kOk);
  // The server never answers: a soft mount fails the call.
  net_.Set([](FakeNet& n) { n.auto_reply = false; });
  EXPECT_EQ(Run(*e, std::make_shared<StatCall>(Proc::kGetattr)), CallStatus::kTimedOut);
  const OpStats l = Total(*e, Proc::kLookup);
  EXPECT_EQ(l.ops, 1u);
  EXPECT_EQ(l.nfs_errors, 1u);
  EXPECT_EQ(l.errors, 0u);
  const OpStats g = Total(*e, Proc::kGetattr);
  EXPECT_EQ(g.ops, 1u);
  EXPECT_EQ(g.errors, 1u);
  EXPECT_EQ(g.nfs_errors, 0u);
  EXPECT_EQ(g.retransmits, 1u);
  EXPECT_EQ(g.rtt.count, 0u);
}

TEST_F(EngineStatsTest, HistoryRecordsStateChangesWithTheirReasons) {
  auto e = Started(Opts());
  auto h = e->Stats()[0].history;
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(h[0].from + ">" + h[0].to, "down>connecting");
  EXPECT_EQ(h[0].reason, "first connect");
  EXPECT_EQ(h[1].from + ">" + h[1].to, "connecting>probing");
  EXPECT_EQ(h[2].from + ">" + h[2].to, "probing>up");
  EXPECT_LE(h[0].time, h[2].time);
  // The connection breaks and the server refuses for a while: each failure
  // is one folded entry, not one per attempt.
  net_.Set([](FakeNet& n) { n.refuse_connect = true; });
  net_.ResetAll();
  ASSERT_TRUE(net_.WaitFor([](FakeNet& n) { return n.connect_attempts >= 5; }));
  net_.Set([](FakeNet& n) { n.refuse_connect = false; });
  std::vector<StateChange> after;
  for (int i = 0; i < 500; ++i) {
    auto s = e->Stats()[0];
    after = s.history;
    if (s.state == "up") break;
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_GE(after.size(), 7u);
  EXPECT_EQ(after[3].from + ">" + after[3].to, "up>down");
  EXPECT_EQ(after[3].reason.rfind("connection lost: ", 0), 0u) << after[3].reason;
  EXPECT_EQ(after[4].from + ">" + after[4].to, "down>connecting");
  EXPECT_EQ(after[4].reason, "reconnecting");
  EXPECT_EQ(after[5].from + ">" + after[5].to, "connecting>down");
  EXPECT_EQ(after[5].reason, "connect failed: connection refused (fake)");
  EXPECT_GE(after[5].count, 3u);
  EXPECT_GE(after[5].last, after[5].time);
  EXPECT_EQ(after.back().to, "up");
  EXPECT_NE(after.back().reason.find("failed attempts"), std::string::npos) << after.back().reason;
  // Counted: the first 3, the loss, the reconnect, each failure, each retry
  // after one (not recorded), connected, up.
  EXPECT_EQ(e->Stats()[0].transitions, 3 + 1 + 1 + 2 * after[5].count + 2);
}

TEST_F(EngineStatsTest, HistoryKeepsOnlyTheLastChanges) {
  auto e = Started(Opts());
  for (int i = 0; i < 20; ++i) {  // each reset adds up>down, down>connecting, ..., probing>up
    const uint64_t before = e->Stats()[0].transitions;
    net_.ResetAll();
    for (int k = 0; k < 500; ++k) {
      auto s = e->Stats()[0];
      if (s.transitions >= before + 4 && s.state == "up") break;
      std::this_thread::sleep_for(5ms);
    }
  }
  const auto s = e->Stats()[0];
  EXPECT_GE(s.transitions, 3u + 20 * 4);
  ASSERT_EQ(s.history.size(), 32u);
  EXPECT_EQ(s.history.back().to, "up");
}

}  // namespace
}  // namespace mpnfs::engine
