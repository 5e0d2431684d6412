#include "engine/connection.h"

#include <fmt/format.h>

#include "engine/event_loop.h"

namespace mpnfs::engine {

Connection::Connection(Engine* engine, Loop* loop, Endpoint ep, int index,
                       const EngineOptions& opts, TransportFactory& factory)
    : engine_(engine),
      loop_(loop),
      ep_(std::move(ep)),
      name_(fmt::format("{}:{}#{}", ep_.host, ep_.port, index)),
      opts_(opts),
      factory_(factory),
      log_(Log("engine")),
      backoff_(opts.backoff_initial, opts.backoff_max) {}

Connection::~Connection() = default;

const char* Connection::StateName() const {
  switch (state_pub_.load(std::memory_order_relaxed)) {
    case 2: return "up";
    case 1: return "connecting";
    default: return "down";
  }
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
  s.bytes_out = stats_.bytes_out;
  s.bytes_in = stats_.bytes_in;
  s.inflight = stats_.inflight;
  s.queued = stats_.queued;
  s.latency_mean_us = stats_.latency.MeanUs();
  s.latency_p99_us = stats_.latency.PercentileUs(99);
  return s;
}

int Connection::fd() const { return t_ ? t_->Fd() : -1; }
int Connection::events() const { return t_ ? t_->Events() : 0; }

void Connection::Connect() {
  if (state_ != State::kDown) return;
  connect_failed_ = false;
  t_ = factory_(this);
  state_ = State::kConnecting;
  state_pub_ = 1;
  connect_deadline_ = Clock::now() + opts_.connect_timeout;
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
  state_ = State::kUp;
  state_pub_ = 2;
  up_ = true;
  backoff_.Reset();
  if (failed_connects_ > 0 || ever_up_) {
    log_->warn("connection {} is up again (after {} failed attempts)", name_, failed_connects_);
  } else {
    log_->info("connection {} is up", name_);
  }
  ever_up_ = true;
  failed_connects_ = 0;
}

void Connection::Deliver(std::shared_ptr<Request> r) {
  stats_.queued.fetch_add(1, std::memory_order_relaxed);
  loop_->Post(this, std::move(r));
}

void Connection::Enqueue(std::shared_ptr<Request> r) {
  if (r->done) {
    stats_.queued.fetch_sub(1, std::memory_order_relaxed);
    return;
  }
  if (r->give_up != Clock::time_point::max()) NoteDeadline(r->give_up);
  pending_.push_back(std::move(r));
  Pump();
}

void Connection::Pump() {
  if (state_ != State::kUp) return;
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
  Attempt& a = inflight_.emplace_back();
  a.self = std::prev(inflight_.end());
  a.sink = this;
  a.req = r;
  a.deadline = now + RetransmitTimeout(opts_.timeo, r->transmissions);
  a.sent = now;
  NoteDeadline(a.deadline);
  if (t_->Issue(*r->call, r->xid, r->cred, &a) < 0) {
    inflight_.erase(a.self);
    std::string err = t_->LastError();
    log_->error("{}: cannot queue {}: {}", name_, r->call->Name(), err);
    Finish(r, CallOutcome{CallStatus::kFailed, nullptr, r->reissued, err});
    return;
  }
  stats_.inflight.fetch_add(1, std::memory_order_relaxed);
  stats_.calls.fetch_add(1, std::memory_order_relaxed);
  stats_.bytes_out.fetch_add(r->call->BytesOut(), std::memory_order_relaxed);
}

void Connection::Finish(const std::shared_ptr<Request>& r, const CallOutcome& o) {
  if (r->done) return;
  r->done = true;
  if (o.status != CallStatus::kOk) stats_.errors.fetch_add(1, std::memory_order_relaxed);
  r->call->Complete(o);
}

void Connection::OnReply(CallToken* token, ReplyStatus status, void* result, const char* error) {
  auto* a = static_cast<Attempt*>(token);
  std::shared_ptr<Request> r = std::move(a->req);
  const Clock::time_point sent = a->sent;
  inflight_.erase(a->self);
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
  stats_.replies.fetch_add(1, std::memory_order_relaxed);
  stats_.bytes_in.fetch_add(r->call->BytesIn(), std::memory_order_relaxed);
  stats_.latency.Record(std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - sent));
  Finish(r, CallOutcome{CallStatus::kOk, result, r->reissued, {}});
}

void Connection::OnEvents(int revents) {
  if (!t_) return;
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
  }
  Pump();
}

void Connection::Fail(const std::string& why) {
  if (state_ == State::kDown) return;
  const bool was_up = state_ == State::kUp;
  state_ = State::kDown;
  state_pub_ = 0;
  up_ = false;
  closing_ = true;
  if (t_) t_->Close();  // fires kCancel for every call still in flight
  t_.reset();
  closing_ = false;
  registered_fd = -1;  // the socket is closed: epoll has dropped it
  registered_events = 0;

  // Calls that were on the wire may have executed: resend them flagged, in
  // their order, on a live connection if there is one, else here after the
  // reconnect (ahead of what was still queued).
  auto rescued = std::move(rescued_);
  rescued_.clear();
  for (auto& r : rescued) {
    r->rescued = false;
    r->reissued = true;
    r->transmissions = 0;
  }
  stats_.reissues.fetch_add(rescued.size(), std::memory_order_relaxed);
  std::vector<std::shared_ptr<Request>> keep;  // no live connection (it may vanish meanwhile)
  for (auto& r : rescued) {
    Connection* other = keep.empty() ? engine_->PickConnection(this) : nullptr;
    if (other != nullptr) {
      other->Deliver(r);
    } else {
      keep.push_back(r);
    }
  }
  pending_.insert(pending_.begin(), keep.begin(), keep.end());
  stats_.queued.fetch_add(static_cast<int64_t>(keep.size()), std::memory_order_relaxed);
  while (keep.empty() && !pending_.empty()) {
    Connection* other = engine_->PickConnection(this);
    if (other == nullptr) break;
    other->Deliver(std::move(pending_.front()));
    pending_.pop_front();
    stats_.queued.fetch_sub(1, std::memory_order_relaxed);
  }

  if (was_up) {
    stats_.reconnects.fetch_add(1, std::memory_order_relaxed);
    log_->warn("connection {} lost: {}; {} calls will be resent; reconnecting", name_, why,
               rescued.size());
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
  if (state_ == State::kDown) {
    if (now >= reconnect_at_) {
      reconnect_at_ = Clock::time_point::max();
      Connect();
    } else {
      NoteDeadline(reconnect_at_);
    }
  }
  if (state_ == State::kConnecting) {
    if (now >= connect_deadline_) {
      Fail(fmt::format("no connection within {} ms", opts_.connect_timeout.count()));
    } else {
      NoteDeadline(connect_deadline_);
    }
  }
  bool major = false;
  if (state_ == State::kUp) {
    for (auto it = inflight_.begin(); it != inflight_.end(); ++it) {
      Attempt& a = *it;
      if (a.superseded || a.req->done) continue;
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
    if (r->give_up != Clock::time_point::max()) NoteDeadline(r->give_up);
    ++it;
  }
  Pump();
}

void Connection::Shutdown() {
  closing_ = true;
  if (t_) t_->Close();
  t_.reset();
  closing_ = false;
  state_ = State::kDown;
  state_pub_ = 0;
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
