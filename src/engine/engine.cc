#include "engine/engine.h"

#include <random>
#include <thread>

#include "engine/connection.h"
#include "engine/event_loop.h"

namespace mpnfs::engine {

Engine::Engine(EngineOptions opts, TransportFactory factory)
    : opts_(std::move(opts)), factory_(std::move(factory)), xid_(std::random_device{}()) {}

Engine::~Engine() { Stop(); }

void Engine::Start() {
  const int nconns = static_cast<int>(opts_.paths.size()) * std::max(1, opts_.conns_per_path);
  int nloops = opts_.loops > 0 ? opts_.loops
                               : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  nloops = std::max(1, std::min(nloops, nconns));
  for (int i = 0; i < nloops; ++i) loops_.push_back(std::make_unique<Loop>(i));
  int index = 0;
  for (int k = 0; k < std::max(1, opts_.conns_per_path); ++k) {
    for (const auto& ep : opts_.paths) {
      Loop* loop = loops_[index % nloops].get();
      conns_.push_back(std::make_unique<Connection>(this, loop, ep, index, opts_, factory_));
      loop->Add(conns_.back().get());
      ++index;
    }
  }
  for (auto& l : loops_) l->Start();
  for (auto& c : conns_) {
    Connection* conn = c.get();
    conn->loop()->Run([conn] { conn->Connect(); });
  }
  started_ = true;
}

void Engine::Stop() {
  if (stopped_) return;
  stopped_ = true;
  for (auto& l : loops_) l->Stop();
}

Connection* Engine::PickConnection(const Connection* avoid, int64_t cost) {
  const size_t n = conns_.size();
  if (n == 0) return nullptr;
  // A connection not measured yet is assumed as fast as the fastest one
  // measured, so it gets traffic and thereby a measurement.
  const auto now = Clock::now();
  constexpr auto kFresh = std::chrono::seconds(2);
  uint64_t fastest = 0;
  for (const auto& c : conns_) fastest = std::max(fastest, c->rate(now, kFresh));
  const double unknown = fastest > 0 ? static_cast<double>(fastest) : 100e6;
  const size_t start = rr_.fetch_add(1, std::memory_order_relaxed) % n;
  Connection* best = nullptr;
  double best_score = 0;
  for (size_t i = 0; i < n; ++i) {
    Connection* c = conns_[(start + i) % n].get();
    if (c == avoid || !c->up()) continue;
    const uint64_t rate = c->rate(now, kFresh);
    // Expected seconds until this call is done there.
    double score = static_cast<double>(c->outstanding_bytes() + cost) /
                   (rate > 0 ? static_cast<double>(rate) : unknown);
    if (c->suspect()) score += 1e6;  // silent: only if nothing else is up
    if (best == nullptr || score < best_score) {
      best = c;
      best_score = score;
    }
  }
  if (best == nullptr && avoid == nullptr) best = conns_[start].get();
  return best;
}

Connection* Engine::PickOnPath(size_t path, int64_t /*cost*/) {
  // conns_[i] serves paths[i % paths.size()] (see Start()).
  const size_t np = opts_.paths.size();
  if (path >= np) return nullptr;
  Connection* best = nullptr;
  Connection* any = nullptr;
  for (size_t i = path; i < conns_.size(); i += np) {
    Connection* c = conns_[i].get();
    if (any == nullptr) any = c;
    if (!c->up()) continue;
    if (best == nullptr || c->outstanding_bytes() < best->outstanding_bytes()) best = c;
  }
  return best != nullptr ? best : any;
}

bool Engine::AnotherHeardSince(const Connection* self, Clock::time_point since) const {
  for (const auto& c : conns_) {
    if (c.get() != self && c->up() && c->last_heard() >= since) return true;
  }
  return false;
}

void Engine::ProbeOthers(const Connection* self) {
  for (const auto& c : conns_) {
    Connection* conn = c.get();
    if (conn != self && conn->up()) conn->loop()->Run([conn] { conn->ProbeNow(); });
  }
}

int Engine::IdleConnections() const {
  constexpr int64_t kIdle = 64 << 10;
  int n = 0;
  for (const auto& c : conns_) n += c->up() && c->outstanding_bytes() < kIdle ? 1 : 0;
  return n;
}

void Engine::Submit(std::shared_ptr<RpcCall> call, const Cred& cred, SubmitOptions so) {
  auto r = std::make_shared<Request>();
  r->call = std::move(call);
  r->cred = cred;
  if (r->cred.groups.size() > Cred::kMaxGroups) r->cred.groups.resize(Cred::kMaxGroups);
  r->xid = NextXid();
  r->cost = static_cast<int64_t>(r->call->BytesOut() + r->call->BytesIn()) + 512;
  auto now = Clock::now();
  if (so.deadline) {
    r->give_up = now + *so.deadline;
  } else if (opts_.soft) {
    Millis total{0};
    for (int n = 1; n <= opts_.retrans + 1; ++n) total += RetransmitTimeout(opts_.timeo, n);
    r->give_up = now + total;
  }
  if (stopped_ || !started_) {
    r->done = true;
    r->call->Complete(CallOutcome{CallStatus::kShutdown, nullptr, false, "engine stopped"});
    return;
  }
  Connection* c = so.path ? PickOnPath(*so.path, r->cost) : PickConnection(nullptr, r->cost);
  if (c == nullptr) {
    r->done = true;
    r->call->Complete(CallOutcome{CallStatus::kShutdown, nullptr, false, "no such path"});
    return;
  }
  c->Deliver(std::move(r));
}

void Engine::SubmitAfter(std::chrono::milliseconds delay, std::shared_ptr<RpcCall> call,
                         const Cred& cred) {
  if (stopped_ || loops_.empty()) return Submit(std::move(call), cred);
  Loop* l = loops_[rr_.fetch_add(1, std::memory_order_relaxed) % loops_.size()].get();
  auto later = [this, call, cred]() mutable { Submit(std::move(call), cred); };
  if (!l->RunAt(Clock::now() + delay, std::move(later))) Submit(std::move(call), cred);  // stopped
}

std::vector<ConnectionStats> Engine::Stats() const {
  std::vector<ConnectionStats> out;
  for (const auto& c : conns_) out.push_back(c->Snapshot());
  return out;
}

}  // namespace mpnfs::engine
