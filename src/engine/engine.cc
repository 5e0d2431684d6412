#include "engine/engine.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <random>
#include <thread>

#include "engine/connection.h"
#include "engine/event_loop.h"
#include "engine/silence.h"

namespace mpnfs::engine {

Engine::Engine(EngineOptions opts, TransportFactory factory)
    : opts_(std::move(opts)),
      factory_(std::move(factory)),
      slots_(new std::atomic<Connection*>[kMaxConnections]),
      xid_(std::random_device{}()) {
  weighed_.store(opts_.weighed, std::memory_order_relaxed);
  for (int i = 0; i < kMaxConnections; ++i) slots_[i].store(nullptr, std::memory_order_relaxed);
}

Engine::~Engine() { Stop(); }

void Engine::Start() {
  // Loops for every connection the mount may come to have, not only those
  // of its paths at mount time: a path added later (AddPath) goes to the
  // loop with the fewest connections, and sharing one loop with a busy path
  // starves it (its replies and reconnects wait behind the other's traffic).
  const int most = kMaxPaths * std::max(1, opts_.conns_per_path);
  int nloops = opts_.loops > 0 ? opts_.loops
                               : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  nloops = std::clamp(nloops, 1, most);
  // The shortest deadline a call sets when sent (its retransmission, or
  // the first silence check, silence.h): a loop idle this long needs no
  // wake-up for a call sent in a direct section (event_loop.h).
  auto idle_cap = std::chrono::duration_cast<Clock::duration>(opts_.timeo);
  if (opts_.path_timeout.count() > 0) {
    idle_cap = std::min(idle_cap, UntilSilenceCheck({}, opts_.path_timeout));
  }
  if (idle_cap <= Clock::duration::zero()) idle_cap = Clock::duration::max();
  for (int i = 0; i < nloops; ++i) loops_.push_back(std::make_unique<Loop>(i, idle_cap, opts_.busy_poll));
  MutexLock lock(admin_mu_);
  for (auto ep : opts_.paths) {
    ep.weight = std::clamp(ep.weight, 1, kMaxWeight);  // Scan divides by it
    paths_.push_back(PathEntry{ep, {}, false, false});
  }
  // Connection k of every path before connection k+1 of any: the loops get
  // the paths in turn.
  const int per = std::max(1, opts_.conns_per_path);
  for (int k = 0; k < per; ++k) {
    for (auto& p : paths_) {
      Loop* loop = loops_[next_index_ % nloops].get();
      owned_.push_back(std::make_unique<Connection>(this, loop, p.ep, next_index_, opts_, factory_));
      Connection* c = owned_.back().get();
      ++next_index_;
      p.conns.push_back(c);
      loop->Add(c);
      const size_t i = nslots_.load(std::memory_order_relaxed);
      slots_[i].store(c, std::memory_order_release);
      nslots_.store(i + 1, std::memory_order_release);
    }
  }
  for (auto& l : loops_) l->Start();
  ForEach([](Connection* conn) { conn->loop()->Run([conn] { conn->Connect(); }); });
  started_ = true;
}

void Engine::Stop() {
  {
    // Under admin_mu_: a path operation sees either a running engine whose
    // loops take its tasks before they stop, or a stopped one. Not held
    // while the loops stop (a loop thread takes it in Retire()).
    MutexLock lock(admin_mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  for (auto& l : loops_) l->Stop();
}

Connection* Engine::Scan(const Connection* avoid, int64_t cost, Connection** fallback) {
  const size_t n = nslots_.load(std::memory_order_acquire);
  *fallback = nullptr;
  if (n == 0) return nullptr;
  // The shortest queue in time: a call goes where the work outstanding
  // (queued and in flight), its own included, would drain first, as
  // dm-multipath's service-time selector weighs it: bytes divided by the
  // path's weight where weights are given, else by the connection's link
  // rate. Never by a path's throughput or latency: what a client measures
  // of those depends on the load it gives the path (a path that is not the
  // limit delivers in proportion to what it is given; a server that
  // batches, or TCP after idling, answers a busy connection sooner), so such
  // weights feed on themselves and starve whichever path was given less
  // (balance_test.cc). A link rate is the wire's timing of one large record
  // (link_rate.h), the same whatever else the path carries, counted at most
  // as the mount's recent peak rate (a faster link is not what limits it).
  // A connection whose rate is unknown counts as fast as the fastest known,
  // so it is given work and measured; none known: every connection the
  // same, the shortest queue in bytes. Unweighted by either, a path whose link is the
  // limit would still drain at its speed, but a call on a slower path would
  // wait behind as many bytes as on a faster one, which a single stream
  // feels. Ties go round robin (the scan starts at a rotating slot). A
  // suspect (silent) connection only if nothing else is up.
  const bool weighed = weighed_.load(std::memory_order_relaxed);
  const auto now = Clock::now();
  const uint64_t cap = weighed ? 0 : moved_.Peak(now);
  auto speed_of = [&](const Connection* c) { return static_cast<double>(std::min(c->link_rate(now), cap)); };
  double fastest = 0;
  if (!weighed) {
    for (size_t i = 0; i < n; ++i) {
      const Connection* c = slots_[i].load(std::memory_order_acquire);
      if (c != nullptr && c != avoid && c->up() && !c->disabled()) fastest = std::max(fastest, speed_of(c));
    }
    if (fastest == 0) fastest = 1;
  }
  const size_t start = rr_.fetch_add(1, std::memory_order_relaxed) % n;
  Connection* best = nullptr;
  bool best_suspect = false;
  double best_score = 0;
  for (size_t i = 0; i < n; ++i) {
    Connection* c = slots_[(start + i) % n].load(std::memory_order_acquire);
    if (c == nullptr || c == avoid || c->disabled()) continue;
    if (*fallback == nullptr) *fallback = c;
    if (!c->up()) continue;
    double speed = fastest;
    if (weighed) {
      speed = c->weight();
    } else if (const double r = speed_of(c); r > 0) {
      speed = r;
    }
    const double score = static_cast<double>(c->outstanding_bytes() + cost) / speed;
    const bool suspect = c->suspect();
    if (best == nullptr || (suspect == best_suspect ? score < best_score : best_suspect)) {
      best = c;
      best_score = score;
      best_suspect = suspect;
    }
  }
  return best;
}

Connection* Engine::PickConnection(const Connection* avoid, int64_t cost) {
  // The scan reads the connections one by one, without a lock: between two
  // reads, path operations may enable one already read as disabled and
  // disable one not read yet, so that a scan sees no enabled connection
  // although one always exists. Every path operation bumps admin_gen_ after
  // changing the flags (both sequentially consistent): a scan that found
  // nothing enabled while the generation moved is torn, and is repeated.
  for (int attempt = 0;; ++attempt) {
    const uint64_t gen = admin_gen_.load();
    Connection* fallback = nullptr;
    if (Connection* best = Scan(avoid, cost, &fallback)) return best;
    if (fallback != nullptr) return avoid == nullptr ? fallback : nullptr;
    if (admin_gen_.load() == gen || attempt >= 1000) break;
  }
  if (avoid != nullptr) return nullptr;
  // Last resort (nothing enabled seen, e.g. under a storm of path changes):
  // any connection; a disabled one passes the call on (Connection::Enqueue).
  Connection* any = nullptr;
  ForEach([&](Connection* c) {
    if (any == nullptr) any = c;
  });
  return any;
}

Connection* Engine::PickOnPath(const Endpoint& path, int64_t /*cost*/) {
  // The least loaded up connection of that path (enabled or not: a pin is
  // an explicit choice), else any of its connections (the call waits there).
  Connection* best = nullptr;
  Connection* any = nullptr;
  ForEach([&](Connection* c) {
    if (c->endpoint().host != path.host || c->endpoint().port != path.port || c->removed()) return;
    if (any == nullptr) any = c;
    if (!c->up()) return;
    if (best == nullptr || c->outstanding_bytes() < best->outstanding_bytes()) best = c;
  });
  return best != nullptr ? best : any;
}

Connection* Engine::PickElsewhere(const Connection* self, int64_t cost) {
  for (int attempt = 0;; ++attempt) {
    const uint64_t gen = admin_gen_.load();
    Connection* fallback = nullptr;
    if (Connection* best = Scan(self, cost, &fallback)) return best;
    if (fallback != nullptr) return fallback;  // enabled, not up: it waits there
    if (admin_gen_.load() == gen || attempt >= 1000) return nullptr;  // see PickConnection()
  }
}

void Engine::Route(std::shared_ptr<Request> r) {
  if (Connection* c = PickConnection(nullptr, r->cost)) return c->Deliver(std::move(r));
  // No connection at all (cannot happen while a path is enabled): try again
  // shortly, on a loop; a hard mount's call is never failed for this.
  Loop* l = loops_[rr_.fetch_add(1, std::memory_order_relaxed) % loops_.size()].get();
  auto again = [this, r] {
    if (stopped_) {
      r->done = true;
      r->call->Complete(CallOutcome{CallStatus::kShutdown, nullptr, r->reissued, "engine stopped"});
      return;
    }
    Route(r);
  };
  if (!l->RunAt(Clock::now() + std::chrono::milliseconds(10), again)) {
    r->done = true;
    r->call->Complete(CallOutcome{CallStatus::kShutdown, nullptr, r->reissued, "engine stopped"});
  }
}

void Engine::ResendFenced(std::shared_ptr<Request> r) {
  if (stopped_) {
    r->done = true;
    r->call->Complete(CallOutcome{CallStatus::kShutdown, nullptr, r->reissued, "engine stopped"});
    return;
  }
  if (Clock::now() >= r->give_up) {
    r->done = true;
    r->call->Complete(CallOutcome{CallStatus::kTimedOut, nullptr, r->reissued,
                                  "no reply before the deadline (its connection was lost)"});
    return;
  }
  Route(std::move(r));
}

bool Engine::AnotherHeardSince(const Connection* self, Clock::time_point since) const {
  bool heard = false;
  ForEach([&](Connection* c) {
    if (c != self && c->up() && c->last_heard() >= since) heard = true;
  });
  return heard;
}

void Engine::ProbeOthers(const Connection* self) {
  ForEach([&](Connection* conn) {
    if (conn != self && conn->up() && !conn->disabled()) {
      conn->loop()->Run([conn] { conn->ProbeNow(); });
    }
  });
}

int Engine::IdleConnections() const {
  constexpr int64_t kIdle = 64 << 10;
  int n = 0;
  ForEach([&](Connection* c) {
    n += c->up() && !c->disabled() && c->outstanding_bytes() < kIdle ? 1 : 0;
  });
  return n;
}

void Engine::Submit(std::shared_ptr<RpcCall> call, const Cred& cred, SubmitOptions so) {
  auto r = std::make_shared<Request>();
  r->call = std::move(call);
  r->cred = cred;
  if (r->cred.groups.size() > Cred::kMaxGroups) r->cred.groups.resize(Cred::kMaxGroups);
  r->xid = NextXid();
  r->cost = static_cast<int64_t>(r->call->BytesOut() + r->call->BytesIn()) + 512;
  r->proc = r->call->Procedure();
  if (static_cast<int>(r->proc) >= kProcCount) r->proc = Proc::kOther;  // indexes the statistics
  auto now = Clock::now();
  r->submitted = now;
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
  r->pinned = so.path.has_value();
  if (so.path) {
    Connection* c = PickOnPath(*so.path, r->cost);
    if (c == nullptr) {
      r->done = true;
      r->call->Complete(CallOutcome{CallStatus::kShutdown, nullptr, false, "no such path"});
      return;
    }
    return c->Deliver(std::move(r));
  }
  Route(std::move(r));
}

void Engine::SubmitAfter(std::chrono::milliseconds delay, std::shared_ptr<RpcCall> call,
                         const Cred& cred) {
  if (stopped_ || loops_.empty()) return Submit(std::move(call), cred);
  Loop* l = loops_[rr_.fetch_add(1, std::memory_order_relaxed) % loops_.size()].get();
  auto later = [this, call, cred]() mutable { Submit(std::move(call), cred); };
  if (!l->RunAt(Clock::now() + delay, std::move(later))) Submit(std::move(call), cred);  // stopped
}

uint64_t Engine::BusyPolls() const {
  uint64_t n = 0;
  for (const auto& l : loops_) n += l->busy_polls();
  return n;
}

std::vector<ConnectionStats> Engine::Stats() const {
  std::vector<ConnectionStats> out;
  ForEach([&](Connection* c) { out.push_back(c->Snapshot()); });
  return out;
}

std::vector<ConnectionStats> Engine::StatsEver() const {
  MutexLock lock(admin_mu_);
  std::vector<ConnectionStats> out;
  out.reserve(owned_.size());
  for (const auto& c : owned_) out.push_back(c->Snapshot());
  return out;
}

// --- online path maintenance ---

namespace {

std::string Name(const Endpoint& ep) { return fmt::format("{}:{}", ep.host, ep.port); }

}  // namespace

std::string Engine::Names() const {
  std::string out;
  for (const auto& p : paths_) out += (out.empty() ? "" : ", ") + Name(p.ep);
  return out;
}

std::optional<std::string> Engine::LastUpPath(const PathEntry& path) const {
  const auto up = [](const PathEntry& p) {
    return std::any_of(p.conns.begin(), p.conns.end(), [](Connection* c) { return c->up(); });
  };
  if (!up(path)) return std::nullopt;  // it carries nothing: not the last usable path
  std::string others;
  for (const auto& p : paths_) {
    if (&p == &path || p.disabled || p.removing) continue;
    if (up(p)) return std::nullopt;
    others += (others.empty() ? "" : ", ") + Name(p.ep);
  }
  return fmt::format("path {} is the last enabled path that is up ({} {} not up); refusing to "
                     "take it out: wait until another path is up (`mpnfsctl path list`)",
                     Name(path.ep), others, others.find(',') == std::string::npos ? "is" : "are");
}

int Engine::EnabledPaths() const {
  int n = 0;
  for (const auto& p : paths_) n += !p.disabled && !p.removing ? 1 : 0;
  return n;
}

Result<Engine::PathEntry*> Engine::Find(const std::string& addr) {
  std::string host = addr;
  int port = 0;
  if (auto colon = addr.rfind(':'); colon != std::string::npos) {
    host = addr.substr(0, colon);
    const std::string digits = addr.substr(colon + 1);
    // Decimal digits only (std::stoi would take "+80" or " 80").
    if (digits.empty() || digits.size() > 5 ||
        !std::all_of(digits.begin(), digits.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
      port = -1;
    } else {
      port = std::stoi(digits);
      if (port <= 0 || port > 65535) port = -1;
    }
    if (port < 0) return Error::Errno(EINVAL, "bad port in '" + addr + "'");
  }
  std::vector<PathEntry*> found;
  for (auto& p : paths_) {
    if (p.ep.host == host && (port == 0 || p.ep.port == port)) found.push_back(&p);
  }
  if (found.size() == 1) return found[0];
  if (found.empty()) {
    return Error::Errno(ENOENT, "no path " + addr + " on this mount; paths are: " + Names());
  }
  return Error::Errno(EINVAL, addr + " names " + std::to_string(found.size()) +
                                  " paths (give HOST:PORT); paths are: " + Names());
}

Result<Engine::PathEntry*> Engine::FindActive(const std::string& addr) {
  auto p = Find(addr);
  if (p && (*p)->removing) return Error::Errno(ENOENT, "path " + Name((*p)->ep) + " is being removed");
  return p;
}

void Engine::SetDisabled(PathEntry& p, bool disabled, bool removed) {
  for (Connection* c : p.conns) {
    c->SetAdmin(disabled, removed);
    c->loop()->Run([c] { c->AdminChanged(); });
  }
  admin_gen_.fetch_add(1);  // after the flags: see PickConnection()
}

std::vector<PathInfo> Engine::Paths() const {
  MutexLock lock(admin_mu_);
  std::vector<PathInfo> out;
  for (const auto& p : paths_) {
    PathInfo info;
    info.endpoint = p.ep;
    int connecting = 0;
    for (Connection* c : p.conns) {
      const ConnectionStats s = c->Snapshot();
      info.connections++;
      info.connections_up += s.state == "up" ? 1 : 0;
      connecting += s.state == "connecting" || s.state == "probing" ? 1 : 0;
      info.inflight += s.inflight;
      info.queued += s.queued;
      info.calls += s.calls;
      info.bytes_out += s.bytes_out;
      info.bytes_in += s.bytes_in;
    }
    if (info.connections_up == info.connections && info.connections > 0) {
      info.state = "up";
    } else if (info.connections_up > 0) {
      info.state = "degraded";
    } else {
      info.state = connecting > 0 ? "connecting" : "down";
    }
    if (p.removing) {
      info.admin = "removing";
    } else if (p.disabled) {
      info.admin = info.inflight + info.queued > 0 ? "draining" : "disabled";
    } else {
      info.admin = "enabled";
    }
    out.push_back(std::move(info));
  }
  return out;
}

Result<std::string> Engine::DisablePath(const std::string& addr) {
  MutexLock lock(admin_mu_);
  auto p = FindActive(addr);
  if (!p) return p.error();
  PathEntry& path = **p;
  const std::string name = Name(path.ep);
  if (path.disabled) return "path " + name + " is already disabled\n";
  if (EnabledPaths() <= 1) {
    return Error::Errno(EBUSY, "path " + name + " is the last enabled path of this mount; "
                                   "enable or add another path first");
  }
  if (auto why = LastUpPath(path)) return Error::Errno(EBUSY, *why);
  path.disabled = true;
  SetDisabled(path, true, false);
  return "path " + name + " disabled: it takes no new calls; calls queued there moved to the "
         "other paths, calls in flight there finish there\n";
}

Result<std::string> Engine::EnablePath(const std::string& addr) {
  MutexLock lock(admin_mu_);
  auto p = FindActive(addr);
  if (!p) return p.error();
  PathEntry& path = **p;
  const std::string name = Name(path.ep);
  if (!path.disabled) return "path " + name + " is already enabled\n";
  path.disabled = false;
  SetDisabled(path, false, false);
  return "path " + name + " enabled\n";
}

Status Engine::StartConnections(PathEntry& p) {
  const int per = std::max(1, opts_.conns_per_path);
  // Free slots first (those of removed connections), then new ones.
  std::vector<size_t> free;
  const size_t n = nslots_.load(std::memory_order_relaxed);
  for (size_t i = 0; i < n && free.size() < static_cast<size_t>(per); ++i) {
    if (slots_[i].load(std::memory_order_relaxed) == nullptr) free.push_back(i);
  }
  if (free.size() + (kMaxConnections - n) < static_cast<size_t>(per)) {
    return Error::Errno(ENOSPC, fmt::format("a mount has at most {} connections", kMaxConnections));
  }
  for (int k = 0; k < per; ++k) {
    // The loop with the fewest connections.
    std::vector<int> load(loops_.size(), 0);
    ForEach([&](Connection* c) {
      for (size_t l = 0; l < loops_.size(); ++l) load[l] += loops_[l].get() == c->loop() ? 1 : 0;
    });
    const size_t l = std::min_element(load.begin(), load.end()) - load.begin();
    Loop* loop = loops_[l].get();
    owned_.push_back(std::make_unique<Connection>(this, loop, p.ep, next_index_++, opts_, factory_));
    Connection* c = owned_.back().get();
    p.conns.push_back(c);
    if (!free.empty()) {
      slots_[free.front()].store(c, std::memory_order_release);
      free.erase(free.begin());
    } else {
      const size_t i = nslots_.load(std::memory_order_relaxed);
      slots_[i].store(c, std::memory_order_release);
      nslots_.store(i + 1, std::memory_order_release);
    }
    // stopped_ is false (checked under admin_mu_, which Stop() takes to set
    // it), so the loop runs this task. If it runs in the loop's final drain,
    // after Shutdown() of its other connections, this one is shut down too.
    loop->Run([this, loop, c] {
      loop->Add(c);
      if (stopped_) {
        c->Shutdown();
      } else {
        c->Connect();
      }
    });
  }
  return Ok{};
}

Result<std::string> Engine::AddPath(const Endpoint& ep, bool weight_given) {
  MutexLock lock(admin_mu_);
  if (!started_ || stopped_) return Error::Errno(ESHUTDOWN, "the engine is not running");
  for (const auto& p : paths_) {
    if (p.ep.host == ep.host && p.ep.port == ep.port) {
      return Error::Errno(EEXIST, "path " + Name(ep) + (p.removing ? " is still being removed; "
                                                                      "add it once it is gone"
                                                                    : " is already on this mount"));
    }
  }
  if (paths_.size() >= static_cast<size_t>(kMaxPaths)) {
    return Error::Errno(ENOSPC, fmt::format("a mount has at most {} paths", kMaxPaths));
  }
  paths_.push_back(PathEntry{ep, {}, false, false});
  paths_.back().ep.weight = std::clamp(ep.weight, 1, kMaxWeight);  // Scan divides by it
  if (auto st = StartConnections(paths_.back()); !st) {
    paths_.pop_back();
    return st.error();
  }
  if (weight_given) weighed_.store(true, std::memory_order_relaxed);
  return fmt::format("path {} added (weight {}): {} connection(s) joining the balancing once up\n",
                     Name(ep), paths_.back().ep.weight, paths_.back().conns.size());
}

Result<std::string> Engine::SetWeight(const std::string& addr, int weight) {
  MutexLock lock(admin_mu_);
  auto p = FindActive(addr);
  if (!p) return p.error();
  return SetWeightLocked(**p, weight);
}

Result<std::string> Engine::SetWeights(const std::vector<std::pair<std::string, int>>& weights) {
  MutexLock lock(admin_mu_);
  std::vector<std::string> want, have;
  for (const auto& [name, w] : weights) want.push_back(name);
  for (const auto& p : paths_) have.push_back(Name(p.ep));
  if (want != have) {
    return Error::Errno(EAGAIN, fmt::format("the paths changed (measured {}; now {})",
                                            fmt::join(want, ", "), fmt::join(have, ", ")));
  }
  std::string out;
  for (size_t i = 0; i < weights.size(); ++i) out += SetWeightLocked(paths_[i], weights[i].second);
  return out;
}

std::string Engine::SetWeightLocked(PathEntry& path, int weight) {
  // Weights given online: the balancer goes by them from now on, for every
  // path (one unit for all: paths not named keep their weight, 1 unless
  // given).
  weighed_.store(true, std::memory_order_relaxed);
  const int was = path.ep.weight;
  path.ep.weight = std::clamp(weight, 1, kMaxWeight);  // Scan divides by it
  for (Connection* c : path.conns) c->set_weight(path.ep.weight);
  return fmt::format("path {} weight {} (was {}): new calls are balanced by it\n", Name(path.ep),
                     path.ep.weight, was);
}

Result<std::string> Engine::RemovePath(const std::string& addr) {
  MutexLock lock(admin_mu_);
  auto p = Find(addr);
  if (!p) return p.error();
  PathEntry& path = **p;
  const std::string name = Name(path.ep);
  if (path.removing) return "path " + name + " is already being removed\n";
  if (!path.disabled && EnabledPaths() <= 1) {
    return Error::Errno(EBUSY, "path " + name + " is the last enabled path of this mount; "
                                   "enable or add another path first");
  }
  if (!path.disabled) {
    if (auto why = LastUpPath(path)) return Error::Errno(EBUSY, *why);
  }
  path.disabled = true;
  path.removing = true;
  SetDisabled(path, true, true);
  return "path " + name + " removed: it takes no new calls; its connections close once the "
         "calls in flight there are done (`path list` shows it as removing until then)\n";
}

void Engine::Retire(Connection* c) {
  MutexLock lock(admin_mu_);
  const size_t n = nslots_.load(std::memory_order_relaxed);
  for (size_t i = 0; i < n; ++i) {
    if (slots_[i].load(std::memory_order_relaxed) == c) slots_[i].store(nullptr, std::memory_order_release);
  }
  for (auto it = paths_.begin(); it != paths_.end(); ++it) {
    if (std::erase(it->conns, c) > 0 && it->removing && it->conns.empty()) {
      paths_.erase(it);
      break;
    }
  }
  // The object stays in owned_: a picker may still hold it.
}

}  // namespace mpnfs::engine
