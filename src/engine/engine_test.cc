#include "engine/engine.h"

#include <gtest/gtest.h>

#include <future>

#include "test/fakes/fake_transport.h"

namespace mpnfs::engine {
namespace {

using testing::FakeNet;
using testing::FakeTransport;
using namespace std::chrono_literals;

// A call that reports its outcome through a future.
class ProbeCall : public RpcCall {
 public:
  const char* Name() const override { return "PROBE"; }
  int Issue(struct rpc_context*, NativeCb, void*) override { return -1; }  // fake never calls
  void Complete(const CallOutcome& o) override {
    ++completions;
    done.set_value(std::make_pair(o.status, o.reissued));
  }
  std::promise<std::pair<CallStatus, bool>> done;
  std::atomic<int> completions{0};
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

class EngineTest : public ::testing::Test {
 protected:
  std::unique_ptr<Engine> Make(EngineOptions o) {
    return std::make_unique<Engine>(o, [this](TransportSink* sink) {
      return std::make_unique<FakeTransport>(&net_, sink);
    });
  }
  std::pair<CallStatus, bool> Await(const std::shared_ptr<ProbeCall>& c, std::chrono::seconds s = 5s) {
    auto f = c->done.get_future();
    EXPECT_EQ(f.wait_for(s), std::future_status::ready) << "call never completed";
    return f.valid() ? f.get() : std::make_pair(CallStatus::kShutdown, false);
  }
  // Waits (up to 5 s) until every connection reports "up".
  static void WaitAllUp(Engine& e) {
    for (int i = 0; i < 500; ++i) {
      auto st = e.Stats();
      if (std::all_of(st.begin(), st.end(), [](auto& s) { return s.state == "up"; })) return;
      std::this_thread::sleep_for(10ms);
    }
    ADD_FAILURE() << "connections did not come up";
  }
  FakeNet net_;
};

TEST_F(EngineTest, CompletesEveryCallExactlyOnce) {
  auto e = Make(Opts());
  e->Start();
  std::vector<std::shared_ptr<ProbeCall>> calls;
  for (int i = 0; i < 200; ++i) {
    calls.push_back(std::make_shared<ProbeCall>());
    e->Submit(calls.back(), Cred{});
  }
  for (auto& c : calls) EXPECT_EQ(Await(c).first, CallStatus::kOk);
  e->Stop();
  for (auto& c : calls) EXPECT_EQ(c->completions.load(), 1);
}

TEST_F(EngineTest, RetransmitsWithTheSameXidAfterTimeo) {
  auto o = Opts();
  o.timeo = 50ms;
  net_.Set([](FakeNet& n) { n.drop_first_n = 1; });
  auto e = Make(o);
  e->Start();
  auto c = std::make_shared<ProbeCall>();
  e->Submit(c, Cred{});
  auto [status, reissued] = Await(c);
  EXPECT_EQ(status, CallStatus::kOk);
  EXPECT_FALSE(reissued);
  std::lock_guard lock(net_.mu);
  ASSERT_EQ(net_.issued_xids.size(), 2u);
  EXPECT_EQ(net_.issued_xids[0], net_.issued_xids[1]);
  EXPECT_EQ(e->Stats()[0].retransmits, 1u);
}

TEST_F(EngineTest, SoftMountFailsACallTheServerNeverAnswers) {
  auto o = Opts();
  o.soft = true;
  o.timeo = 30ms;
  o.retrans = 1;
  net_.Set([](FakeNet& n) { n.auto_reply = false; });
  auto e = Make(o);
  e->Start();
  auto c = std::make_shared<ProbeCall>();
  e->Submit(c, Cred{});
  EXPECT_EQ(Await(c).first, CallStatus::kTimedOut);
  std::lock_guard lock(net_.mu);
  EXPECT_EQ(net_.issued_xids.size(), 2u);  // first transmission + 1 retransmission
}

TEST_F(EngineTest, HardMountResendsCallsOfABrokenConnection) {
  net_.Set([](FakeNet& n) { n.auto_reply = false; });
  auto e = Make(Opts());
  e->Start();
  std::vector<std::shared_ptr<ProbeCall>> calls;
  for (int i = 0; i < 10; ++i) {
    calls.push_back(std::make_shared<ProbeCall>());
    e->Submit(calls.back(), Cred{});
  }
  ASSERT_TRUE(net_.WaitFor([](FakeNet& n) { return n.issued_xids.size() == 10; }));
  net_.Set([](FakeNet& n) { n.auto_reply = true; });
  net_.ResetAll();
  for (auto& c : calls) {
    auto [status, reissued] = Await(c);
    EXPECT_EQ(status, CallStatus::kOk);
    EXPECT_TRUE(reissued);
  }
  auto s = e->Stats()[0];
  EXPECT_EQ(s.reconnects, 1u);
  EXPECT_EQ(s.reissues, 10u);
  std::lock_guard lock(net_.mu);
  EXPECT_EQ(net_.connect_attempts, 2);
  // The resent calls keep their XIDs.
  std::set<uint32_t> first(net_.issued_xids.begin(), net_.issued_xids.begin() + 10);
  std::set<uint32_t> second(net_.issued_xids.begin() + 10, net_.issued_xids.end());
  EXPECT_EQ(first, second);
}

TEST_F(EngineTest, CallsOfABrokenConnectionMoveToALiveOne) {
  auto o = Opts();
  o.conns_per_path = 2;
  net_.Set([](FakeNet& n) { n.auto_reply = false; });
  auto e = Make(o);
  e->Start();
  WaitAllUp(*e);
  std::vector<std::shared_ptr<ProbeCall>> calls;
  for (int i = 0; i < 20; ++i) {
    calls.push_back(std::make_shared<ProbeCall>());
    e->Submit(calls.back(), Cred{});
  }
  ASSERT_TRUE(net_.WaitFor([](FakeNet& n) { return n.issued_xids.size() == 20; }));
  // One connection breaks and cannot come back: its calls must go to the other.
  net_.Set([](FakeNet& n) {
    n.refuse_connect = true;
    n.auto_reply = true;
  });
  net_.ResetOne();
  ASSERT_TRUE(net_.WaitFor([](FakeNet& n) { return n.issued_xids.size() > 20; }));
  net_.ReplyAll();
  int reissued = 0;
  for (auto& c : calls) {
    auto [status, was_reissued] = Await(c);
    EXPECT_EQ(status, CallStatus::kOk);
    reissued += was_reissued;
  }
  EXPECT_GT(reissued, 0);
  EXPECT_LT(reissued, 20);
}

TEST_F(EngineTest, InflightLimitQueuesTheExcess) {
  auto o = Opts();
  o.max_inflight = 4;
  net_.Set([](FakeNet& n) { n.auto_reply = false; });
  auto e = Make(o);
  e->Start();
  std::vector<std::shared_ptr<ProbeCall>> calls;
  for (int i = 0; i < 10; ++i) {
    calls.push_back(std::make_shared<ProbeCall>());
    e->Submit(calls.back(), Cred{});
  }
  ASSERT_TRUE(net_.WaitFor([](FakeNet& n) { return n.issued_xids.size() == 4; }));
  EXPECT_EQ(e->Stats()[0].queued, 6);
  net_.Set([](FakeNet& n) { n.auto_reply = true; });
  net_.ReplyAll();
  for (auto& c : calls) EXPECT_EQ(Await(c).first, CallStatus::kOk);
  std::lock_guard lock(net_.mu);
  EXPECT_LE(net_.max_pending_seen, 4);
}

TEST_F(EngineTest, ReconnectBacksOffWhileTheServerIsDown) {
  net_.Set([](FakeNet& n) { n.refuse_connect = true; });
  auto e = Make(Opts());  // backoff 20ms doubling to 100ms
  e->Start();
  auto c = std::make_shared<ProbeCall>();
  e->Submit(c, Cred{});
  std::this_thread::sleep_for(700ms);  // observe the reconnect rate for a while
  int attempts;
  {
    std::lock_guard lock(net_.mu);
    attempts = net_.connect_attempts;
  }
  // 20+40+80+100+100+... ms: about 9 attempts in 700 ms; a spinning loop makes thousands.
  EXPECT_GE(attempts, 4);
  EXPECT_LE(attempts, 12);
  // The server comes back: the waiting call goes through.
  net_.Set([](FakeNet& n) { n.refuse_connect = false; });
  EXPECT_EQ(Await(c).first, CallStatus::kOk);
}

TEST_F(EngineTest, SubmitDeadlineFailsACallWhileUnreachable) {
  net_.Set([](FakeNet& n) { n.refuse_connect = true; });
  auto e = Make(Opts());
  e->Start();
  auto c = std::make_shared<ProbeCall>();
  e->Submit(c, Cred{}, SubmitOptions{100ms});
  EXPECT_EQ(Await(c).first, CallStatus::kTimedOut);
}

TEST_F(EngineTest, StopCompletesPendingCallsWithShutdown) {
  net_.Set([](FakeNet& n) { n.auto_reply = false; });
  auto e = Make(Opts());
  e->Start();
  auto c = std::make_shared<ProbeCall>();
  e->Submit(c, Cred{});
  ASSERT_TRUE(net_.WaitFor([](FakeNet& n) { return n.issued_xids.size() == 1; }));
  e->Stop();
  EXPECT_EQ(Await(c).first, CallStatus::kShutdown);
  auto late = std::make_shared<ProbeCall>();
  e->Submit(late, Cred{});
  EXPECT_EQ(Await(late).first, CallStatus::kShutdown);
}

TEST_F(EngineTest, SubmitAfterWaitsThenSends) {
  auto e = Make(Opts());
  e->Start();
  auto c = std::make_shared<ProbeCall>();
  const auto t0 = std::chrono::steady_clock::now();
  e->SubmitAfter(150ms, c, Cred{});
  EXPECT_EQ(Await(c).first, CallStatus::kOk);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 150ms);
  // A delayed call still pending at Stop() completes (kShutdown), not never.
  auto late = std::make_shared<ProbeCall>();
  e->SubmitAfter(60s, late, Cred{});
  e->Stop();
  EXPECT_EQ(Await(late).first, CallStatus::kShutdown);
}

TEST_F(EngineTest, SpreadsCallsOverConnections) {
  auto o = Opts();
  o.conns_per_path = 4;
  o.loops = 2;
  net_.Set([](FakeNet& n) { n.auto_reply = false; });
  auto e = Make(o);
  e->Start();
  WaitAllUp(*e);  // so that the picker sees all four
  std::vector<std::shared_ptr<ProbeCall>> calls;
  for (int i = 0; i < 40; ++i) {
    calls.push_back(std::make_shared<ProbeCall>());
    e->Submit(calls.back(), Cred{});
  }
  ASSERT_TRUE(net_.WaitFor([](FakeNet& n) { return n.issued_xids.size() == 40; }));
  for (const auto& s : e->Stats()) EXPECT_GE(s.inflight, 5) << s.endpoint;
  net_.Set([](FakeNet& n) { n.auto_reply = true; });
  net_.ReplyAll();
  for (auto& c : calls) EXPECT_EQ(Await(c).first, CallStatus::kOk);
}

}  // namespace
}  // namespace mpnfs::engine
