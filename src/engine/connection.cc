#include "engine/connection.h"

#include <fmt/format.h>
#include <poll.h>

#include <algorithm>

#include "engine/event_loop.h"
#include "engine/silence.h"

namespace mpnfs::engine {

Connection::Connection(Engine* engine, Loop* loop, Endpoint ep, int index,
                       const EngineOptions& opts, TransportFactory& factory)
    : engine_(engine),
      loop_(loop),
      ep_(std::move(ep)),
      weight_(ep_.weight),
      name_(fmt::format("{}:{}#{}", ep_.host, ep_.port, index)),
      opts_(opts),
      factory_(factory),
      log_(Log(opts.log_layer)),
      backoff_(opts.backoff_initial, opts.backoff_max) {}

Connection::~Connection() = default;

const char* Connection::StateName() const {
  switch (state_pub_.load(std::memory_order_relaxed)) {
    case 3: return "probing";
    case 2: return up() ? "up" : "probing";  // !up(): enabled, probe to come
    case 1: return "connecting";
    default: return "down";
  }
}

const char* Connection::StateName(State s) {
  switch (s) {
    case State::kProbing: return "probing";
    case State::kUp: return "up";
    case State::kConnecting: return "connecting";
    default: return "down";
  }
}

void Connection::SetState(State to, std::string reason) {
  const State from = state_;
  state_ = to;
  if (to == State::kDown) down_reason_ = reason;
  state_pub_ = to == State::kDown ? 0 : to == State::kConnecting ? 1 : to == State::kUp ? 2 : 3;
  const auto now = std::chrono::system_clock::now();
  MutexLock lock(history_mu_);
  ++transitions_;
  if (!history_.empty()) {
    StateChange& last = history_.back();
    if (last.from == StateName(from) && last.to == StateName(to) && last.reason == reason) {
      ++last.count;
      last.last = now;
      return;
    }
  }
  if (history_.size() == kHistory) history_.pop_front();
  history_.push_back(StateChange{now, now, StateName(from), StateName(to), std::move(reason), 1});
}

ConnectionStats Connection::Snapshot() const {
  ConnectionStats s;
  s.endpoint = name_;
  s.state = StateName();
  s.calls = stats_.calls;
  s.replies = stats_.replies;
  s.errors = stats_.errors;
  s.retransmits = stats_.retransmits;
  s.reissues = stats_.reissues;
  s.reconnects = stats_.reconnects;
  s.failovers = stats_.failovers;
  s.probes = stats_.probes;
  s.outstanding_bytes = charged_bytes_;
  s.weight = weight();
  s.rate_bps = rate_;
  s.link_rate_bps = link_rate_.Get(Clock::now());
  s.sojourn_us = static_cast<uint64_t>(sojourn_.load(std::memory_order_relaxed) * 1e6);
  s.bytes_out = stats_.bytes_out;
  s.bytes_in = stats_.bytes_in;
  s.inflight = stats_.inflight;
  s.queued = stats_.queued;
  const LatencySnapshot lat = stats_.latency.Snapshot();
  s.latency_mean_us = lat.MeanUs();
  s.latency_p50_us = lat.PercentileUs(50);
  s.latency_p99_us = lat.PercentileUs(99);
  for (int i = 0; i < kProcCount; ++i) {
    const auto& a = stats_.op[i];
    OpStats& o = s.ops[i];
    o.ops = a.ops.load(std::memory_order_relaxed);
    o.transmissions = a.transmissions.load(std::memory_order_relaxed);
    o.retransmits = a.retransmits.load(std::memory_order_relaxed);
    o.errors = a.errors.load(std::memory_order_relaxed);
    o.nfs_errors = a.nfs_errors.load(std::memory_order_relaxed);
    o.bytes_out = a.bytes_out.load(std::memory_order_relaxed);
    o.bytes_in = a.bytes_in.load(std::memory_order_relaxed);
    o.exe_us = a.exe_us.load(std::memory_order_relaxed);
    o.rtt = a.rtt.Snapshot();
  }
  for (int k = 0; k < kStabilityCount; ++k) {
    s.write_stability[k].ops = stats_.write_ops[k].load(std::memory_order_relaxed);
    s.write_stability[k].bytes = stats_.write_bytes[k].load(std::memory_order_relaxed);
  }
  MutexLock lock(history_mu_);
  s.transitions = transitions_;
  s.history.assign(history_.begin(), history_.end());
  return s;
}

int Connection::fd() const { return t_ ? t_->Fd() : -1; }
int Connection::events() const { return t_ ? t_->Events() : 0; }

void Connection::Connect() {
  if (state_ != State::kDown) return;
  connect_tried_ = true;
  connect_failed_ = false;
  t_ = factory_(this);
  if (failed_connects_ == 0) {
    SetState(State::kConnecting, ever_up_ ? "reconnecting" : "first connect");
  } else {
    // A retry after failed attempts: counted, not recorded (the failures are).
    state_ = State::kConnecting;
    state_pub_ = 1;
    MutexLock lock(history_mu_);
    ++transitions_;
  }
  // A path that was up before is being re-probed: give up on an attempt
  // sooner, so a path that comes back is found within seconds.
  Millis limit = opts_.connect_timeout;
  if (ever_up_ && opts_.path_timeout.count() > 0) {
    limit = std::min(limit, std::max<Millis>(2 * opts_.path_timeout, Millis(2000)));
  }
  connect_deadline_ = Clock::now() + limit;
  NoteDeadline(connect_deadline_);
  std::string err;
  if (!t_->StartConnect(ep_, &err)) Fail(err);
}

void Connection::OnConnected(bool ok, const std::string& error) {
  // Runs inside Transport::Service(): record only; OnEvents() acts on it.
  if (closing_) return;
  if (!ok) {
    connect_failed_ = true;
    fail_reason_ = error;
    return;
  }
  // TCP is up; the connection is used once the server answers a NULL call.
  SetState(State::kProbing, "TCP connected; waiting for the answer to an NFS NULL call");
}

void Connection::BecomeUp() {
  SetState(State::kUp, failed_connects_ > 0
                           ? fmt::format("NFS NULL call answered (after {} failed attempts)",
                                         failed_connects_)
                           : std::string("NFS NULL call answered"));
  up_ = true;
  backoff_.Reset();
  // A new connection starts unmeasured.
  rate_.store(0, std::memory_order_relaxed);
  link_rate_.Reset();
  sojourn_.store(0, std::memory_order_relaxed);
  win_bytes_ = 0;
  win_busy_ = {};
  win_wait_ = 0;
  if (disabled()) {
    // A disabled path is quiet (see engine.h).
    log_->info("connection {} of a disabled path is up", name_);
  } else if (reprobe_) {
    log_->info("connection {} answered its probe: it takes calls again", name_);
  } else if (failed_connects_ > 0 || ever_up_) {
    log_->warn("connection {} is up again (after {} failed attempts)", name_, failed_connects_);
  } else {
    log_->info("connection {} is up", name_);
  }
  ever_up_ = true;
  reprobe_ = false;
  failed_connects_ = 0;
  // Calls still in flight (a path enabled again while they were out): their
  // retransmission and silence checks were not kept while it was probing.
  if (stats_.inflight.load(std::memory_order_relaxed) > 0) NoteDeadline(Clock::now());
}

void Connection::Charge(Request& r) {
  charged_bytes_.fetch_add(r.cost, std::memory_order_relaxed);
  r.charged = this;
  r.charged_at = Clock::now();
}

void Connection::Uncharge(Request& r) {
  if (r.charged == nullptr) return;
  r.charged->charged_bytes_.fetch_sub(r.cost, std::memory_order_relaxed);
  r.charged = nullptr;
}

void Connection::Heard(Clock::time_point now) {
  heard_ = now;
  last_heard_.store(now.time_since_epoch().count(), std::memory_order_relaxed);
  asked_others_ = false;
  suspect_.store(false, std::memory_order_relaxed);
}

void Connection::Deliver(std::shared_ptr<Request> r) {
  Uncharge(*r);
  Charge(*r);
  stats_.queued.fetch_add(1, std::memory_order_relaxed);
  // The queue-depth-1 fast path: with the loop asleep, queue the call and
  // write it to the socket from this thread (event_loop.h, direct sections).
  if (loop_->TryRunHere([&] {
        Enqueue(std::move(r));
        if (state_ == State::kUp && t_) OnEvents(POLLOUT);
      })) {
    return;
  }
  if (!loop_->Post(this, r)) {
    // Submitted as the engine stopped, after the loop's last look at its
    // mailbox: nobody else will complete it.
    stats_.queued.fetch_sub(1, std::memory_order_relaxed);
    Finish(r, CallOutcome{CallStatus::kShutdown, nullptr, r->reissued, "engine stopped"});
  }
}

void Connection::Enqueue(std::shared_ptr<Request> r) {
  if (r->done) {
    stats_.queued.fetch_sub(1, std::memory_order_relaxed);
    Uncharge(*r);
    return;
  }
  if (shut_down_) {  // delivered while the loop ended
    stats_.queued.fetch_sub(1, std::memory_order_relaxed);
    Finish(r, CallOutcome{CallStatus::kShutdown, nullptr, r->reissued, "shutdown"});
    return;
  }
  if (r->pinned && state_ == State::kDown && connect_tried_) {
    // Pinned to this path (SubmitOptions::path): not moved, and not kept
    // for a reconnect that may never come. (Before the first connect has
    // begun the connection is not down but not yet started: the call
    // waits here for that connect's outcome.)
    stats_.queued.fetch_sub(1, std::memory_order_relaxed);
    const std::string why = "pinned path down: " + down_reason_;
    Finish(r, CallOutcome{CallStatus::kTimedOut, nullptr, r->reissued, why});
    return;
  }
  if (disabled() && !r->pinned) {
    // Picked just before its path was disabled or removed (or the last
    // resort of a picker). The target counts it queued before this one
    // stops counting it: totals never dip.
    if (Connection* other = engine_->PickElsewhere(this, r->cost)) {
      other->Deliver(std::move(r));
      stats_.queued.fetch_sub(1, std::memory_order_relaxed);
      return;
    }
    // No enabled connection seen (path operations racing): not into
    // pending_ of a connection that may be down or closed for good, and so
    // never pumped again; try again shortly. Still counted queued here.
    auto later = [this, r] { Enqueue(r); };
    if (!loop_->RunAt(Clock::now() + Millis(10), std::move(later))) {
      stats_.queued.fetch_sub(1, std::memory_order_relaxed);
      Finish(r, CallOutcome{CallStatus::kShutdown, nullptr, r->reissued, "shutdown"});
    }
    return;
  }
  if (state_ == State::kDown && !r->pinned) {
    // Picked just before this connection went down: another one takes it.
    if (Connection* other = engine_->PickConnection(this, r->cost)) {
      other->Deliver(std::move(r));
      stats_.queued.fetch_sub(1, std::memory_order_relaxed);
      return;
    }
  }
  if (r->give_up != Clock::time_point::max()) NoteDeadline(r->give_up);
  pending_.push_back(std::move(r));
  Pump();
}

void Connection::Pump() {
  if (disabled()) {
    MovePending();
    MaybeClose();
  }
  // !up(): just enabled, its AdminChanged() (a probe first) still to run.
  if (state_ != State::kUp || !up()) return;
  auto now = Clock::now();
  while (!pending_.empty() &&
         stats_.inflight.load(std::memory_order_relaxed) < opts_.max_inflight) {
    auto r = std::move(pending_.front());
    pending_.pop_front();
    stats_.queued.fetch_sub(1, std::memory_order_relaxed);
    if (r->done) continue;
    Send(std::move(r), now);
    if (state_ != State::kUp) break;
  }
}

void Connection::Send(std::shared_ptr<Request> r, Clock::time_point now) {
  r->transmissions++;
  if (stats_.inflight.load(std::memory_order_relaxed) == 0) {
    // Busy from now: idle time counts neither as silence nor as slowness.
    busy_since_ = now;
    mark_ = now;
    if (opts_.path_timeout.count() > 0) NoteDeadline(now + UntilSilenceCheck({}, opts_.path_timeout));
  }
  Attempt& a = inflight_.emplace_back();
  a.self = std::prev(inflight_.end());
  a.sink = this;
  a.req = r;
  a.deadline = now + RetransmitTimeout(opts_.timeo, r->transmissions);
  a.sent = now;
  NoteDeadline(a.deadline);
  if (t_->Issue(r->call, r->xid, r->cred, &a) < 0) {
    inflight_.erase(a.self);
    std::string err = t_->LastError();
    log_->error("{}: cannot queue {}: {}", name_, r->call->Name(), err);
    Finish(r, CallOutcome{CallStatus::kFailed, nullptr, r->reissued, err});
    return;
  }
  r->unanswered++;
  const size_t out = r->call->BytesOut();
  stats_.inflight.fetch_add(1, std::memory_order_relaxed);
  stats_.calls.fetch_add(1, std::memory_order_relaxed);
  stats_.bytes_out.fetch_add(out, std::memory_order_relaxed);
  auto& op = stats_.op[static_cast<int>(r->proc)];
  op.transmissions.fetch_add(1, std::memory_order_relaxed);
  op.bytes_out.fetch_add(out, std::memory_order_relaxed);
}

void Connection::SendProbe(Clock::time_point now) {
  Attempt& a = inflight_.emplace_back();
  a.self = std::prev(inflight_.end());
  a.sink = this;
  a.probe = true;
  a.sent = now;
  a.deadline = Clock::time_point::max();
  if (t_->IssueProbe(engine_->NextXid(), &a) < 0) {
    inflight_.erase(a.self);
    if (state_ == State::kProbing) Fail("cannot send an NFS NULL probe: " + t_->LastError());
    return;
  }
  probe_ = &a;
  stats_.probes.fetch_add(1, std::memory_order_relaxed);
}

void Connection::ProbeNow() {
  auto now = Clock::now();
  if (state_ == State::kUp && probe_ == nullptr && now - heard_ > Millis(50)) SendProbe(now);
}

void Connection::OnProbeReply(Attempt* a, ReplyStatus status, const char* error) {
  if (probe_ == a) probe_ = nullptr;
  inflight_.erase(a->self);
  if (closing_ || status == ReplyStatus::kCancel) return;
  if (status == ReplyStatus::kError) {
    if (state_ == State::kProbing) {
      // Acted on by OnEvents() once Service() returns.
      connect_failed_ = true;
      fail_reason_ = fmt::format("NFS NULL probe failed: {}", error ? error : "rpc error");
    }
    return;
  }
  Heard(Clock::now());
  if (state_ == State::kProbing) BecomeUp();
}

void Connection::Account(Clock::time_point now, int64_t bytes, Clock::duration sojourn) {
  // Throughput over busy time only (Send() restarts the mark when the
  // connection was idle), and the byte-weighted mean sojourn, over the same
  // windows. Windows of small calls are discarded: too few bytes to tell.
  win_busy_ += now - mark_;
  mark_ = now;
  win_bytes_ += bytes;
  win_wait_ += static_cast<double>(bytes) * std::chrono::duration<double>(sojourn).count();
  constexpr int64_t kMinBytes = 1 << 20;
  const auto busy_ms = std::chrono::duration_cast<Millis>(win_busy_).count();
  if (win_bytes_ >= kMinBytes && (busy_ms >= 200 || (win_bytes_ >= 8 * kMinBytes && busy_ms >= 20))) {
    const double sample = static_cast<double>(win_bytes_) * 1000.0 / static_cast<double>(busy_ms);
    const double old = static_cast<double>(rate_.load(std::memory_order_relaxed));
    const double next = old == 0 ? sample : 0.75 * old + 0.25 * sample;
    rate_.store(static_cast<uint64_t>(std::max(next, 65536.0)), std::memory_order_relaxed);
    const double wait = std::max(win_wait_ / static_cast<double>(win_bytes_), 1e-6);
    const double old_wait = sojourn_.load(std::memory_order_relaxed);
    sojourn_.store(old_wait == 0 ? wait : 0.75 * old_wait + 0.25 * wait, std::memory_order_relaxed);
    win_bytes_ = 0;
    win_busy_ = {};
    win_wait_ = 0;
  } else if (busy_ms >= 2000) {
    win_bytes_ = 0;
    win_busy_ = {};
    win_wait_ = 0;
  }
}

void Connection::CheckSilence(Clock::time_point now) {
  if (opts_.path_timeout.count() <= 0) return;
  if (stats_.inflight.load(std::memory_order_relaxed) == 0) {
    suspect_.store(false, std::memory_order_relaxed);
    return;
  }
  Clock::duration silent = now - std::max(heard_, busy_since_);
  const int64_t tcp = t_ ? t_->SilentMs() : -1;
  if (tcp >= 0) silent = std::min<Clock::duration>(silent, Millis(tcp));
  if (silent >= opts_.path_timeout / 2) {
    suspect_.store(true, std::memory_order_relaxed);
    if (probe_ == nullptr) SendProbe(now);
  }
  if (silent >= opts_.path_timeout) {
    const bool other_heard = engine_->AnotherHeardSince(this, now - opts_.path_timeout);
    // Nobody heard lately: maybe the other paths are merely idle. Ask them.
    if (!other_heard && !asked_others_) {
      asked_others_ = true;
      engine_->ProbeOthers(this);
    }
    // The probe has a quarter of path_timeout to draw at least a TCP ACK
    // before the path is judged: a check that comes late (a starved loop
    // thread) must not send the probe and declare the path dead at once.
    const auto grace = opts_.path_timeout / 4;
    if (probe_ != nullptr && now - probe_->sent < grace) {
      NoteDeadline(probe_->sent + grace);
      return;
    }
    if (other_heard) {
      stats_.failovers.fetch_add(1, std::memory_order_relaxed);
      Fail(fmt::format("nothing heard for {} ms while another path answers; path declared dead",
                       std::chrono::duration_cast<Millis>(silent).count()));
      return;
    }
  }
  NoteDeadline(now + UntilSilenceCheck(silent, opts_.path_timeout));
}

void Connection::Finish(std::shared_ptr<Request> r, const CallOutcome& o) {
  if (r->done) return;
  r->done = true;
  Uncharge(*r);
  Release(*r);
  if (o.status != CallStatus::kOk) stats_.errors.fetch_add(1, std::memory_order_relaxed);
  if (o.status != CallStatus::kShutdown) {
    // Per procedure; a call ended by the engine stopping is not counted
    // (that may happen off the loop thread, which alone writes these).
    auto& op = stats_.op[static_cast<int>(r->proc)];
    op.ops.fetch_add(1, std::memory_order_relaxed);
    if (o.status != CallStatus::kOk) op.errors.fetch_add(1, std::memory_order_relaxed);
    const auto exe = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - r->submitted);
    op.exe_us.fetch_add(static_cast<uint64_t>(std::max<int64_t>(0, exe.count())),
                        std::memory_order_relaxed);
    if (r->proc == Proc::kWrite) {
      const int k = std::min(static_cast<int>(r->call->WriteStability()), kStabilityCount - 1);
      stats_.write_ops[k].fetch_add(1, std::memory_order_relaxed);
      stats_.write_bytes[k].fetch_add(r->call->BytesOut(), std::memory_order_relaxed);
    }
  }
  if (o.result == nullptr && loop_->InDirectSection()) {
    // In a direct section (a submitting thread acting for the loop, see
    // event_loop.h), a call that ends without a reply: its callback runs on
    // the loop thread, not on the submitter while it holds the loop.
    auto later = [call = r->call, status = o.status, reissued = o.reissued,
                  error = std::string(o.error)] {
      call->Complete(CallOutcome{status, nullptr, reissued, error});
    };
    if (loop_->Run(later)) return;
  }
  r->call->Complete(o);
}

void Connection::Release(Request& r) {
  if (r.unanswered == 0) return;
  // The transport still holds these transmissions and reports each later (a
  // reply with their XID, or the close); they wait for nothing any more.
  stats_.inflight.fetch_sub(r.unanswered, std::memory_order_relaxed);
  r.unanswered = 0;
  for (Attempt& a : inflight_) {
    if (a.req.get() == &r) a.req.reset();
  }
}

void Connection::OnReply(CallToken* token, ReplyStatus status, void* result, const char* error) {
  auto* a = static_cast<Attempt*>(token);
  if (a->probe) return OnProbeReply(a, status, error);
  std::shared_ptr<Request> r = std::move(a->req);
  const Clock::time_point sent = a->sent;
  inflight_.erase(a->self);
  if (r == nullptr) return;  // its call finished before: Release() uncounted it
  r->unanswered--;
  stats_.inflight.fetch_sub(1, std::memory_order_relaxed);
  if (r->done) return;
  if (closing_ || status == ReplyStatus::kCancel || (status == ReplyStatus::kError && servicing_)) {
    // A broken or closing connection: decide after Service()/Close() returns
    // whether the call is resent (the connection broke) or failed (the server
    // rejected just this call).
    if (!r->rescued) {
      r->rescued = true;
      (closing_ || status == ReplyStatus::kCancel ? rescued_ : errored_).push_back(std::move(r));
    }
    return;
  }
  if (status == ReplyStatus::kError) {
    Finish(r, CallOutcome{CallStatus::kFailed, nullptr, r->reissued, error ? error : "rpc error"});
    return;
  }
  const auto now = Clock::now();
  Heard(now);
  Account(now, r->cost, now - r->charged_at);
  const ReplySummary sum = r->call->Summarize(result);
  const uint64_t in = sum.data_bytes >= 0 ? static_cast<uint64_t>(sum.data_bytes) : r->call->BytesIn();
  engine_->NoteMoved(static_cast<int64_t>(in + r->call->BytesOut()));
  const auto rtt = std::chrono::duration_cast<std::chrono::microseconds>(now - sent);
  stats_.replies.fetch_add(1, std::memory_order_relaxed);
  stats_.bytes_in.fetch_add(in, std::memory_order_relaxed);
  stats_.latency.Record(rtt);
  auto& op = stats_.op[static_cast<int>(r->proc)];
  op.bytes_in.fetch_add(in, std::memory_order_relaxed);
  op.rtt.Record(rtt);
  if (sum.nfs_status != 0) op.nfs_errors.fetch_add(1, std::memory_order_relaxed);
  Finish(r, CallOutcome{CallStatus::kOk, result, r->reissued, {}});
}

void Connection::OnEvents(int revents) {
  if (!t_) return;
  if ((revents & POLLIN) != 0 && (state_ == State::kUp || state_ == State::kProbing)) {
    Heard(Clock::now());
  }
  servicing_ = true;
  bool ok = t_->Service(revents);
  servicing_ = false;
  auto errored = std::move(errored_);
  errored_.clear();
  if (!ok || connect_failed_) {
    std::string why = connect_failed_ ? fail_reason_ : t_->LastError();
    connect_failed_ = false;
    for (auto& r : errored) rescued_.push_back(std::move(r));
    Fail(why);
  } else {
    for (auto& r : errored) {
      r->rescued = false;
      Finish(r, CallOutcome{CallStatus::kFailed, nullptr, r->reissued, "rpc error"});
    }
    if (state_ == State::kProbing && probe_ == nullptr) SendProbe(Clock::now());
  }
  Pump();
}

void Connection::Fail(const std::string& why) {
  if (state_ == State::kDown) return;
  const bool was_up = state_ == State::kUp;
  SetState(State::kDown, (was_up ? "connection lost: " : "connect failed: ") + why);
  up_ = false;
  suspect_ = false;
  asked_others_ = false;
  closing_ = true;
  if (t_) t_->Close();  // fires kCancel for every call still in flight
  t_.reset();
  closing_ = false;
  registered_fd = -1;  // the socket is closed: epoll has dropped it
  registered_events = 0;

  // Calls that were on the wire may have executed: resend them flagged, in
  // their order, on a live connection if there is one, else here after the
  // reconnect (ahead of what was still queued); those that change state
  // after resend_fence (below).
  auto rescued = std::move(rescued_);
  rescued_.clear();
  for (auto& r : rescued) {
    r->rescued = false;
    r->reissued = true;
    r->transmissions = 0;
  }
  stats_.reissues.fetch_add(rescued.size(), std::memory_order_relaxed);
  // Calls pinned to this path are not moved to another: they fail now.
  const std::string pinned_why = "pinned path down: " + down_reason_;
  auto fail_pinned = [this, &pinned_why](std::shared_ptr<Request>& r) {
    if (!r->pinned) return false;
    Finish(r, CallOutcome{CallStatus::kTimedOut, nullptr, r->reissued, pinned_why});
    return true;
  };
  std::erase_if(rescued, fail_pinned);
  const size_t pending_before = pending_.size();
  std::erase_if(pending_, fail_pinned);
  stats_.queued.fetch_sub(static_cast<int64_t>(pending_before - pending_.size()),
                          std::memory_order_relaxed);
  // A call that changes the server's state may be in the server's hands and
  // still executed there later: resent after resend_fence (engine.h), so
  // that its answer, and what the application does after it, come after
  // such a late execution.
  const auto fence_until = Clock::now() + opts_.resend_fence;
  size_t fenced = 0;
  std::vector<std::shared_ptr<Request>> keep;  // no live connection (it may vanish meanwhile)
  for (auto& r : rescued) {
    if (opts_.resend_fence.count() > 0 && ChangesState(r->proc)) {
      // Held by no connection meanwhile: charged to none, counted nowhere.
      Uncharge(*r);
      auto later = [engine = engine_, r] { engine->ResendFenced(r); };
      if (loop_->RunAt(fence_until, std::move(later))) {
        ++fenced;
        continue;
      }
      // The loop has ended: resent now (it ends with the engine).
    }
    Connection* other = keep.empty() ? engine_->PickConnection(this, r->cost) : nullptr;
    if (other != nullptr) {
      other->Deliver(r);
    } else {
      keep.push_back(r);
    }
  }
  pending_.insert(pending_.begin(), keep.begin(), keep.end());
  stats_.queued.fetch_add(static_cast<int64_t>(keep.size()), std::memory_order_relaxed);
  while (keep.empty() && !pending_.empty()) {
    Connection* other = engine_->PickConnection(this, pending_.front()->cost);
    if (other == nullptr) break;
    other->Deliver(std::move(pending_.front()));
    pending_.pop_front();
    stats_.queued.fetch_sub(1, std::memory_order_relaxed);
  }

  if (disabled()) {
    // Out of the balancing: what it held goes to the enabled paths (up or
    // not), and it stays down, quietly, until its path is enabled.
    MovePending();
    reconnect_at_ = Clock::time_point::max();
    if (was_up) {
      stats_.reconnects.fetch_add(1, std::memory_order_relaxed);
      log_->info("connection {} of a {} path closed: {}; {} calls moved to other paths ({} of "
                 "them after resend_fence)", name_, removed() ? "removed" : "disabled", why,
                 rescued.size(), fenced);
    }
    return;
  }

  if (was_up) {
    stats_.reconnects.fetch_add(1, std::memory_order_relaxed);
    log_->warn("connection {} lost: {}; {} calls will be resent ({} that change the server's "
               "state after resend_fence); reconnecting", name_, why, rescued.size(), fenced);
  } else {
    ++failed_connects_;
    uint64_t suppressed = 0;
    if (down_log_.Allow(&suppressed)) {
      log_->warn("cannot connect {}: {} ({} failed attempts; retrying with backoff up to {} ms)",
                 name_, why, failed_connects_, opts_.backoff_max.count());
    }
  }
  reconnect_at_ = Clock::now() + backoff_.Next();
  NoteDeadline(reconnect_at_);
}

void Connection::OnTimer(Clock::time_point now) {
  next_check_ = Clock::time_point::max();
  if (state_ == State::kDown && !disabled()) {
    if (now >= reconnect_at_) {
      reconnect_at_ = Clock::time_point::max();
      Connect();
    } else {
      NoteDeadline(reconnect_at_);
    }
  }
  if (state_ == State::kConnecting || state_ == State::kProbing) {
    if (now >= connect_deadline_) {
      Fail(state_ == State::kConnecting
               ? "no connection before the connect timeout"
               : "connected, but no answer to an NFS NULL call before the connect timeout");
    } else {
      NoteDeadline(connect_deadline_);
    }
  }
  bool major = false;
  if (state_ == State::kUp) {
    for (auto it = inflight_.begin(); it != inflight_.end(); ++it) {
      Attempt& a = *it;
      if (a.probe || a.superseded || a.req == nullptr) continue;  // null: call finished
      if (now >= a.req->give_up) {
        Finish(a.req, CallOutcome{CallStatus::kTimedOut, nullptr, a.req->reissued,
                                  "no reply before the deadline"});
        continue;
      }
      if (now < a.deadline) {
        NoteDeadline(a.deadline);
        continue;
      }
      if (a.req->transmissions <= opts_.retrans) {
        a.superseded = true;
        stats_.retransmits.fetch_add(1, std::memory_order_relaxed);
        stats_.op[static_cast<int>(a.req->proc)].retransmits.fetch_add(1, std::memory_order_relaxed);
        Send(a.req, now);  // appends; std::list iterators stay valid
        if (state_ != State::kUp) break;
      } else if (opts_.soft) {
        Finish(a.req, CallOutcome{CallStatus::kTimedOut, nullptr, a.req->reissued,
                                  "server not responding (soft mount)"});
      } else {
        major = true;
      }
    }
  }
  if (major) {
    uint64_t suppressed = 0;
    if (down_log_.Allow(&suppressed)) {
      log_->warn("server {} not responding, still trying", name_);
    }
    Fail("no reply after retransmissions");
  }
  if (state_ == State::kUp) CheckSilence(now);
  // Soft limits of calls still waiting to be sent.
  for (auto it = pending_.begin(); it != pending_.end();) {
    auto& r = *it;
    if (!r->done && now >= r->give_up) {
      auto dead = std::move(r);
      it = pending_.erase(it);
      stats_.queued.fetch_sub(1, std::memory_order_relaxed);
      Finish(dead, CallOutcome{CallStatus::kTimedOut, nullptr, dead->reissued,
                               "server not reachable before the deadline"});
      continue;
    }
    if (!r->done && r->give_up != Clock::time_point::max()) NoteDeadline(r->give_up);
    ++it;
  }
  Pump();
}

void Connection::MovePending() {
  std::deque<std::shared_ptr<Request>> pinned;  // stay here (Fail ends them if it goes down)
  while (!pending_.empty()) {
    if (pending_.front()->pinned) {
      pinned.push_back(std::move(pending_.front()));
      pending_.pop_front();
      continue;
    }
    Connection* other = engine_->PickElsewhere(this, pending_.front()->cost);
    if (other == nullptr) {
      // No enabled connection seen (path operations racing): try again
      // shortly; OnTimer() pumps, and a connection with calls queued is
      // neither closed for good nor dropped by its loop.
      NoteDeadline(Clock::now() + Millis(10));
      break;
    }
    auto r = std::move(pending_.front());
    pending_.pop_front();
    other->Deliver(std::move(r));  // counted there before it stops counting here
    stats_.queued.fetch_sub(1, std::memory_order_relaxed);
  }
  pending_.insert(pending_.begin(), pinned.begin(), pinned.end());
}

void Connection::MaybeClose() {
  if (!removed() || closed_for_good_ || shut_down_ || !pending_.empty() ||
      stats_.inflight.load(std::memory_order_relaxed) > 0) {
    return;
  }
  closed_for_good_ = true;
  const bool was_up = state_ == State::kUp;
  // Nothing is in flight: what the transport still holds are probes and
  // transmissions of calls finished before (their replies are dropped).
  closing_ = true;
  if (t_) t_->Close();
  t_.reset();
  closing_ = false;
  rescued_.clear();
  probe_ = nullptr;
  if (state_ != State::kDown) SetState(State::kDown, "path removed");
  up_ = false;
  suspect_ = false;
  reconnect_at_ = Clock::time_point::max();
  registered_fd = -1;
  registered_events = 0;
  log_->info("connection {} of a removed path closed{}", name_, was_up ? "" : " (it was down)");
  // Not from inside the loop's walk over its connections: as a task.
  Loop* loop = loop_;
  loop->Run([this, loop] {
    loop->Remove(this);
    engine_->Retire(this);
  });
}

void Connection::AdminChanged() {
  if (shut_down_) return;
  if (disabled()) {
    MovePending();
    MaybeClose();
    return;
  }
  if (state_ == State::kDown) {
    // Enabled again: reconnect now rather than after the backoff.
    backoff_.Reset();
    reconnect_at_ = Clock::time_point::max();
    Connect();
  } else if (state_ == State::kUp) {
    // Enabled again while up: trusted only once it answers a NULL probe
    // (within the connect timeout, else it is failed and reconnects).
    SetState(State::kProbing, "path enabled: probed before it takes calls");
    up_ = false;
    suspect_ = false;
    reprobe_ = true;
    Millis limit = opts_.connect_timeout;
    if (opts_.path_timeout.count() > 0) {
      limit = std::min(limit, std::max<Millis>(2 * opts_.path_timeout, Millis(2000)));
    }
    connect_deadline_ = Clock::now() + limit;
    NoteDeadline(connect_deadline_);
    if (probe_ == nullptr) SendProbe(Clock::now());
  }
  Pump();
}

void Connection::Shutdown() {
  shut_down_ = true;
  closing_ = true;
  if (t_) t_->Close();
  t_.reset();
  closing_ = false;
  if (state_ != State::kDown) SetState(State::kDown, "engine stopped");
  up_ = false;
  auto rescued = std::move(rescued_);
  for (auto& r : rescued) Finish(r, CallOutcome{CallStatus::kShutdown, nullptr, r->reissued, "shutdown"});
  while (!pending_.empty()) {
    auto r = std::move(pending_.front());
    pending_.pop_front();
    Finish(r, CallOutcome{CallStatus::kShutdown, nullptr, r->reissued, "shutdown"});
  }
  stats_.queued = 0;
}

}  // namespace mpnfs::engine
