// The balancer under load: closed-loop traffic over paths whose replies take
// real time, as a server and its links make them take it.
//
// TimedNet models where the time goes: each path has a fixed latency and,
// optionally, a capacity (a link that serves one call after another); the
// server may be one queue shared by every path (a server whose CPU is the
// limit, as on a machine that runs client and server on the same cores).
// A timer thread wakes each connection's loop when its next reply is due;
// the replies come from Service() on the loop thread, as from a socket.
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <semaphore>
#include <thread>

#include "engine/engine.h"
#include "engine/link_rate.h"
#include "test/fakes/wait_up.h"

namespace mpnfs::engine {
namespace {

using namespace std::chrono_literals;

struct PathModel {
  Clock::duration latency{};
  // Time per MiB on the path's link (one call after another); zero: the
  // link is never the limit.
  Clock::duration per_mib{};
  // A server that batches: a call is answered sooner the more calls of its
  // connection are waiting (latency / their number, at most 8).
  bool batching = false;
  // The link rate a large reply reports (link_rate.h) is off by up to this
  // fraction either way, at random (a client's timing of the wire is noisy).
  double rate_noise = 0;
};

// What a link with no per_mib carries: the rate its large replies report.
constexpr uint64_t kFastLink = 4ull << 30;

class TimedTransport;

class TimedNet {
 public:
  std::map<std::string, PathModel> paths;  // by host
  // Time per MiB of the one server all paths share; zero: no shared limit.
  Clock::duration server_per_mib{};

  TimedNet() : timer_([this] { Run(); }) {}
  ~TimedNet() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    timer_.join();
  }
  // Bytes of READ data asked for, per host, since the last Reset().
  std::map<std::string, int64_t> Bytes() {
    std::lock_guard lock(mu_);
    return bytes_;
  }
  void Reset() {
    std::lock_guard lock(mu_);
    bytes_.clear();
  }

 private:
  friend class TimedTransport;
  void Run();
  // When a call of `bytes` issued now on `host` is answered (under mu_).
  Clock::time_point Due(const std::string& host, int64_t bytes, Clock::time_point now, size_t waiting);
  static Clock::duration Scaled(Clock::duration per_mib, int64_t bytes) {
    return std::chrono::duration_cast<Clock::duration>(per_mib * (static_cast<double>(bytes) / (1 << 20)));
  }

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<TimedTransport*> live_;
  std::map<std::string, Clock::time_point> link_free_;
  Clock::time_point server_free_{};
  std::map<std::string, int64_t> bytes_;
  std::mt19937 rng_{7};
  std::thread timer_;  // last: started once the rest is built
};

class TimedTransport final : public Transport {
 public:
  TimedTransport(TimedNet* net, TransportSink* sink) : net_(net), sink_(sink) {
    efd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  }
  ~TimedTransport() override {
    Close();
    close(efd_);
  }
  bool StartConnect(const Endpoint& ep, std::string*) override {
    std::lock_guard lock(net_->mu_);
    host_ = ep.host;
    connecting_ = true;
    net_->live_.push_back(this);
    Signal();
    return true;
  }
  int Fd() const override { return efd_; }
  int Events() const override { return 1; /* POLLIN */ }
  bool Service(int) override {
    uint64_t v;
    ssize_t n = read(efd_, &v, sizeof(v));
    (void)n;
    if (connecting_) {
      connecting_ = false;
      sink_->OnConnected(true, {});
    }
    std::vector<std::pair<CallToken*, uint64_t>> due;
    {
      std::lock_guard lock(net_->mu_);
      const auto now = Clock::now();
      while (!pending_.empty() && pending_.begin()->first <= now) {
        due.push_back(pending_.begin()->second);
        pending_.erase(pending_.begin());
      }
    }
    static int result = 0;
    for (auto [t, rate] : due) {
      if (rate > 0) sink_->OnLinkRate(rate);
      sink_->OnReply(t, ReplyStatus::kSuccess, &result, nullptr);
    }
    return true;
  }
  int Issue(const std::shared_ptr<RpcCall>& call, uint32_t, const Cred&, CallToken* token) override {
    const auto bytes = static_cast<int64_t>(call->BytesIn());
    std::lock_guard lock(net_->mu_);
    net_->bytes_[host_] += bytes;
    uint64_t rate = 0;
    if (static_cast<uint64_t>(bytes) >= LinkRate::kMinRecord) {
      // How fast its reply crosses the link: the model's speed, give or take the noise.
      const PathModel& m = net_->paths.at(host_);
      const double mib_per_s = m.per_mib > Clock::duration::zero()
                                   ? 1 / std::chrono::duration<double>(m.per_mib).count()
                                   : static_cast<double>(kFastLink >> 20);
      const double noise = 1 + m.rate_noise * std::uniform_real_distribution<double>(-1, 1)(net_->rng_);
      rate = static_cast<uint64_t>(mib_per_s * noise * (1 << 20));
    }
    Add(net_->Due(host_, bytes, Clock::now(), pending_.size() + 1), token, rate);
    return 0;
  }
  int IssueProbe(uint32_t, CallToken* token) override {
    std::lock_guard lock(net_->mu_);
    Add(Clock::now(), token, 0);
    return 0;
  }
  void Close() override {
    std::multimap<Clock::time_point, std::pair<CallToken*, uint64_t>> p;
    {
      std::lock_guard lock(net_->mu_);
      std::erase(net_->live_, this);
      p.swap(pending_);
    }
    for (auto& [at, t] : p) sink_->OnReply(t.first, ReplyStatus::kCancel, nullptr, nullptr);
  }
  std::string LastError() const override { return "timed fake"; }

 private:
  friend class TimedNet;
  void Signal() {
    uint64_t one = 1;
    ssize_t n = write(efd_, &one, sizeof(one));
    (void)n;
  }
  // Under net_->mu_. Replies come back in the order they are due.
  // `rate`: the link rate its reply reports, 0 none.
  void Add(Clock::time_point due, CallToken* token, uint64_t rate) {
    pending_.emplace(due, std::make_pair(token, rate));
    net_->cv_.notify_all();
  }

  TimedNet* net_;
  TransportSink* sink_;
  int efd_;
  std::string host_;
  bool connecting_ = false;
  // By due time, with the link rate each reports; guarded by net_->mu_.
  std::multimap<Clock::time_point, std::pair<CallToken*, uint64_t>> pending_;
};

Clock::time_point TimedNet::Due(const std::string& host, int64_t bytes, Clock::time_point now,
                                  size_t waiting) {
  const PathModel& m = paths.at(host);
  Clock::time_point t = now;
  if (m.per_mib > Clock::duration::zero()) {
    auto& free = link_free_[host];
    free = std::max(free, now) + Scaled(m.per_mib, bytes);
    t = free;
  }
  if (server_per_mib > Clock::duration::zero()) {
    server_free_ = std::max(server_free_, t) + Scaled(server_per_mib, bytes);
    t = server_free_;
  }
  return t + (m.batching ? m.latency / static_cast<int>(std::min<size_t>(waiting, 8)) : m.latency);
}

void TimedNet::Run() {
  std::unique_lock lock(mu_);
  while (!stop_) {
    Clock::time_point next = Clock::time_point::max();
    const auto now = Clock::now();
    for (TimedTransport* t : live_) {
      if (t->pending_.empty()) continue;
      if (t->pending_.begin()->first <= now) {
        t->Signal();  // its loop takes what is due; the next one is seen after
        continue;
      }
      next = std::min(next, t->pending_.begin()->first);
    }
    if (next == Clock::time_point::max()) {
      cv_.wait_for(lock, 5ms);  // also re-signals a loop that has not read yet
    } else {
      cv_.wait_until(lock, std::min(next, now + 5ms));
    }
  }
}

// A READ of `bytes` that tells the driver when it is answered.
class ReadCall : public RpcCall {
 public:
  ReadCall(size_t bytes, std::shared_ptr<std::counting_semaphore<>> done)
      : bytes_(bytes), done_(std::move(done)) {}
  const char* Name() const override { return "READ"; }
  size_t BytesIn() const override { return bytes_; }
  bool EncodeArgs(proto::XdrOut&) override { return false; }
  bool DecodeResult(proto::XdrIn&, void*) override { return false; }
  void Complete(const CallOutcome& o) override {
    if (o.status != CallStatus::kOk) failed.fetch_add(1);
    done_->release();
  }
  static inline std::atomic<int> failed{0};

 private:
  size_t bytes_;
  // Shared: a driver that gave up (a failed assertion) may be gone.
  std::shared_ptr<std::counting_semaphore<>> done_;
};

class BalanceTest : public ::testing::Test {
 protected:
  static constexpr size_t kMiB = 1 << 20;

  std::unique_ptr<Engine> Start(std::vector<std::string> hosts, std::vector<int> weights = {}) {
    EngineOptions o;
    for (size_t k = 0; k < hosts.size(); ++k) {
      o.paths.push_back(Endpoint{hosts[k], 2049, {}, k < weights.size() ? weights[k] : 1});
    }
    o.weighed = !weights.empty();
    o.timeo = 60s;
    o.connect_timeout = 2s;
    o.loops = 2;
    auto e = std::make_unique<Engine>(o, [this](TransportSink* sink) {
      return std::make_unique<TimedTransport>(&net_, sink);
    });
    e->Start();
    testing::WaitAllUp(*e);
    return e;
  }
  // Keeps `depth` READs of `bytes` outstanding until `n` have been answered;
  // with `pin`, every call is pinned to that path.
  static void Drive(Engine& e, int n, int depth, size_t bytes, std::optional<Endpoint> pin = {}) {
    auto done = std::make_shared<std::counting_semaphore<>>(0);
    const int before = ReadCall::failed.load();
    int sent = 0;
    for (; sent < depth && sent < n; ++sent) {
      e.Submit(std::make_shared<ReadCall>(bytes, done), Cred{}, SubmitOptions{.deadline = std::nullopt, .path = pin});
    }
    for (int answered = 0; answered < n; ++answered) {
      ASSERT_TRUE(done->try_acquire_for(30s)) << "a call was never answered";
      if (sent < n) {
        e.Submit(std::make_shared<ReadCall>(bytes, done), Cred{}, SubmitOptions{.deadline = std::nullopt, .path = pin});
        ++sent;
      }
    }
    EXPECT_EQ(ReadCall::failed.load(), before);
  }
  // The share of the bytes that went to `host` since the last Reset().
  double Share(const std::string& host) {
    auto b = net_.Bytes();
    int64_t total = 0;
    for (auto& [h, n] : b) total += n;
    return total == 0 ? 0 : static_cast<double>(b[host]) / static_cast<double>(total);
  }

  void UnevenPastThenFree();

  TimedNet net_;
};

// Two equal paths that the past loaded unequally: one carried eight calls at
// a time, the other one. Once the same traffic may go either way, they must
// share it about evenly. A balancer that weighs a path by the throughput it
// delivered takes the path it loaded less for a slower one (a path that is
// not the limit delivers in proportion to what it is given) and keeps
// starving it.
void BalanceTest::UnevenPastThenFree() {
  const Endpoint a{"10.0.0.1", 2049, {}}, b{"10.0.1.1", 2049, {}};
  auto e = Start({a.host, b.host});
  std::thread busy([&] { Drive(*e, 800, 8, kMiB, a); });
  std::thread light([&] { Drive(*e, 100, 1, kMiB, b); });
  busy.join();
  light.join();
  net_.Reset();
  Drive(*e, 800, 8, kMiB);
  EXPECT_GT(Share(a.host), 0.35);
  EXPECT_GT(Share(b.host), 0.35);
}

TEST_F(BalanceTest, EqualPathsShareTheWorkWhateverTheyCarriedBefore) {
  net_.paths = {{"10.0.0.1", {5ms, {}}}, {"10.0.1.1", {5ms, {}}}};
  UnevenPastThenFree();
}

TEST_F(BalanceTest, PathsToAServerThatIsTheLimitShareTheWorkWhateverTheyCarriedBefore) {
  net_.paths = {{"10.0.0.1", {500us, {}}}, {"10.0.1.1", {500us, {}}}};
  net_.server_per_mib = 1ms;
  UnevenPastThenFree();
}

// A server that answers a busy connection sooner: the path loaded more in
// the past is the quicker one now. A balancer that weighs paths by how long
// their calls take keeps loading it, and so keeps it quicker.
TEST_F(BalanceTest, PathsToAServerThatAnswersBusyConnectionsSoonerShareTheWork) {
  net_.paths = {{"10.0.0.1", {8ms, {}, true}}, {"10.0.1.1", {8ms, {}, true}}};
  UnevenPastThenFree();
}

// Equal links whose rates are measured with noise (up to 30% either way):
// the upper quartile of each one's recent samples is about the same, so
// they share the work about evenly, whatever they carried before.
TEST_F(BalanceTest, EqualLinksMeasuredWithNoiseShareTheWork) {
  net_.paths = {{"10.0.0.1", {1ms, 2ms, false, 0.3}}, {"10.0.1.1", {1ms, 2ms, false, 0.3}}};
  UnevenPastThenFree();
}

// Links four times apart, both far faster than the server they share: the
// server is the limit, so the links' rates (above what the mount moves)
// count the same and the paths share the work.
TEST_F(BalanceTest, LinksFasterThanTheMountMovesCountTheSame) {
  net_.paths = {{"10.0.0.1", {500us, 125us}}, {"10.0.1.1", {500us, 500us}}};
  net_.server_per_mib = 1ms;
  UnevenPastThenFree();
}

// A path four times as fast carries most of the bytes (both are kept busy).
// Queues of about 80 ms on the fast link: a loaded machine's delays in
// refilling them are small beside that.
TEST_F(BalanceTest, AFasterPathCarriesMore) {
  net_.paths = {{"10.0.0.1", {2ms, 10ms}}, {"10.0.1.1", {2ms, 40ms}}};
  auto e = Start({"10.0.0.1", "10.0.1.1"});
  Drive(*e, 300, 16, kMiB);
  EXPECT_GT(Share("10.0.0.1"), 0.7);
  EXPECT_GT(Share("10.0.1.1"), 0.05);
}

// Balanced by bytes alone, the slower path's calls would wait behind as many
// bytes as the faster path's, so about four times as long. With the link
// rates measured (no weights given), or with weights that say the speeds,
// its queue is four times shorter and its calls wait about as long.
void ExpectTheSlowerPathsQueueShort(Engine& e, double fast_share) {
  const auto st = e.Stats();
  ASSERT_EQ(st.size(), 2u);
  ASSERT_GT(st[0].sojourn_us, 0u);
  ASSERT_GT(st[1].sojourn_us, 0u);
  EXPECT_LT(st[1].sojourn_us, 2 * st[0].sojourn_us) << st[0].sojourn_us << " " << st[1].sojourn_us;
  EXPECT_GT(fast_share, 0.7);
}

TEST_F(BalanceTest, MeasuredLinkRatesKeepTheSlowerPathsQueueShort) {
  net_.paths = {{"10.0.0.1", {2ms, 10ms, false, 0.1}}, {"10.0.1.1", {2ms, 40ms, false, 0.1}}};
  auto e = Start({"10.0.0.1", "10.0.1.1"});
  Drive(*e, 300, 16, kMiB);
  const auto st = e->Stats();
  ASSERT_EQ(st.size(), 2u);
  EXPECT_GT(st[0].link_rate_bps, 3 * st[1].link_rate_bps);
  ExpectTheSlowerPathsQueueShort(*e, Share("10.0.0.1"));
}

TEST_F(BalanceTest, WeightsThatSayTheSpeedsKeepTheSlowerPathsQueueShort) {
  net_.paths = {{"10.0.0.1", {2ms, 10ms}}, {"10.0.1.1", {2ms, 40ms}}};
  auto e = Start({"10.0.0.1", "10.0.1.1"}, {4, 1});
  Drive(*e, 300, 16, kMiB);
  ExpectTheSlowerPathsQueueShort(*e, Share("10.0.0.1"));
}

// Weights given override the measured rates: with weights that call the
// paths equal, the slower path's queue is as long in bytes as the faster
// one's, so its calls wait much longer, although its link measures 4x
// slower.
TEST_F(BalanceTest, GivenWeightsOverrideMeasuredRates) {
  net_.paths = {{"10.0.0.1", {2ms, 10ms}}, {"10.0.1.1", {2ms, 40ms}}};
  auto e = Start({"10.0.0.1", "10.0.1.1"}, {1, 1});
  Drive(*e, 300, 16, kMiB);
  const auto st = e->Stats();
  ASSERT_EQ(st.size(), 2u);
  EXPECT_GT(st[0].link_rate_bps, 3 * st[1].link_rate_bps);
  EXPECT_GT(st[1].sojourn_us, 2 * st[0].sojourn_us) << st[0].sojourn_us << " " << st[1].sojourn_us;
}

}  // namespace
}  // namespace mpnfs::engine
