// Connection: one TCP connection of a path, driven by one Loop.
//
// States: kDown -> kConnecting -> kProbing -> kUp -> kDown ... A new TCP
// connection becomes usable only once the server has answered an NFS NULL
// call on it (kProbing), so a path whose TCP answers but whose NFS service
// does not is not used. Calls wait in `pending_` while the connection is not
// up or has `max_inflight` calls outstanding, and live in `inflight_` (one
// Attempt each transmission) until the transport reports them. A transmission
// counts in flight (`stats_.inflight`, against max_inflight) until the
// transport reports it or its call finishes (answered through any of its
// transmissions, failed or given up), whichever is first; the transmissions
// of a finished call still with the transport then let go of it (the
// transport resolves one transmission per reply; see request.h). When the transport
// breaks, or
// the connection is declared dead (see Engine), every unanswered call is
// rescued: marked reissued and handed to another connection that is up, or
// kept here until the reconnect. A down connection retries with capped
// exponential backoff (the circuit breaker: a dead path costs one connect
// attempt every few seconds, and one log line a minute).
//
// Every state change is recorded with its reason in a ring of the last
// kHistory (see SetState()), for the statistics.
//
// Thread safety: everything but the atomics in `stats_` and `up_`, and the
// history under `history_mu_`, is owned by the loop: its thread, or a thread
// in one of its direct sections (event_loop.h), which holds the loop's
// run_mu_. Deliver() from another thread tries a direct section first; a
// call that ends inside a section without a reply (fails at once) is
// completed on the loop thread afterwards (Finish). A call whose reply is
// read inside a section completes there, on the submitting thread: with
// RpcTransport that cannot happen (a section only writes: it services POLLOUT),
// but a fake transport that answers at once does it. A call submitted as
// the engine stops (the loop takes no more mail, or cannot run the deferred
// completion) completes on the submitting thread. The picker in Engine reads
// only the atomics.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "common/log.h"
#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "engine/backoff.h"
#include "engine/latency.h"
#include "engine/link_rate.h"
#include "engine/engine.h"
#include "engine/request.h"
#include "engine/transport.h"

namespace mpnfs::engine {

class Loop;

class Connection : public TransportSink {
 public:
  enum class State { kDown, kConnecting, kProbing, kUp };
  static constexpr size_t kHistory = 32;  // state changes kept for the statistics

  Connection(Engine* engine, Loop* loop, Endpoint ep, int index, const EngineOptions& opts,
             TransportFactory& factory);
  ~Connection() override;

  // --- any thread ---
  bool up() const { return up_.load(std::memory_order_relaxed); }
  // Silent with work outstanding: about to be probed or declared dead.
  bool suspect() const { return suspect_.load(std::memory_order_relaxed); }
  int64_t outstanding_bytes() const { return charged_bytes_.load(std::memory_order_relaxed); }
  int64_t inflight() const { return stats_.inflight.load(std::memory_order_relaxed); }
  Clock::time_point last_heard() const {
    return Clock::time_point(Clock::duration(last_heard_.load(std::memory_order_relaxed)));
  }
  Loop* loop() const { return loop_; }
  // The path's endpoint as it was added; its `weight` is the initial one
  // (weight() is the current one).
  const Endpoint& endpoint() const { return ep_; }
  // The path's weight (the balancer divides outstanding bytes by it);
  // changed online by Engine::SetWeight. Relaxed: a pick that reads the old
  // value just balances by it once more.
  int weight() const { return weight_.load(std::memory_order_relaxed); }
  void set_weight(int w) { weight_.store(w, std::memory_order_relaxed); }
  // What its link carries, bytes per second (link_rate.h); 0: unknown.
  uint64_t link_rate(Clock::time_point now) const { return link_rate_.Get(now); }
  ConnectionStats Snapshot() const;

  // Online path maintenance (see engine.h). Out of the balancing: its path
  // is disabled or removed. The picker skips such a connection.
  bool disabled() const {
    return disabled_.load() || removed_.load();
  }
  bool removed() const { return removed_.load(); }
  // Any thread: sets the flags; the engine then runs AdminChanged() on the
  // loop. The flags are sequentially consistent: Engine::PickConnection()
  // relies on it to detect a scan torn by path operations.
  // Enabling also stops the picker from seeing it up until it has answered
  // a probe (AdminChanged()).
  void SetAdmin(bool disabled, bool removed) {
    if (!disabled && disabled_.load()) up_.store(false);
    disabled_.store(disabled);
    if (removed) removed_.store(true);
  }

  // Any thread: hand `r` to this connection: queued and sent at once from
  // this thread if its loop sleeps (a direct section, event_loop.h), else
  // through the loop's mailbox. The call counts as queued from now on, so
  // the picker sees it at once.
  void Deliver(std::shared_ptr<Request> r);

  // --- loop thread only ---
  void Enqueue(std::shared_ptr<Request> r);
  void Connect();
  // Socket events; then sends what the in-flight limit allows.
  void OnEvents(int revents);
  // Deadlines: connect timeout, retransmissions, soft give-up, reconnect.
  void OnTimer(Clock::time_point now);
  // The earliest time OnTimer() has something to do.
  Clock::time_point NextDeadline() const { return next_check_; }
  void Pump();
  // Ends every call with kShutdown, and those delivered later too.
  void Shutdown();
  // Sends a NULL probe unless one is out or the server was just heard.
  void ProbeNow();
  // After SetAdmin(): a disabled connection hands its queue to enabled ones,
  // a removed one closes once nothing is in flight, an enabled one that is
  // down reconnects now, and one that is up takes calls again only once it
  // has answered a NULL probe (its link may have died while it was idle
  // and disabled, sending no probes).
  void AdminChanged();
  int fd() const;
  int events() const;

  // TransportSink
  void OnConnected(bool ok, const std::string& error) override;
  void OnReply(CallToken* token, ReplyStatus status, void* result, const char* error) override;
  void OnLinkRate(uint64_t bytes_per_s) override { link_rate_.Add(Clock::now(), bytes_per_s); }

  int registered_fd = -1;      // loop's epoll bookkeeping
  uint32_t registered_events = 0;

 private:
  struct AtomicStats {
    std::atomic<uint64_t> calls{0}, replies{0}, errors{0}, retransmits{0}, reissues{0},
        reconnects{0}, failovers{0}, probes{0}, bytes_out{0}, bytes_in{0};
    std::atomic<int64_t> inflight{0}, queued{0};
    LatencyHistogram latency;  // send to reply, first reply of each call
    // Per procedure (see OpStats in engine.h). Written by the loop thread.
    struct Op {
      std::atomic<uint64_t> ops{0}, transmissions{0}, retransmits{0}, errors{0}, nfs_errors{0},
          bytes_out{0}, bytes_in{0}, exe_us{0};
      LatencyHistogram rtt;
    };
    std::array<Op, kProcCount> op;
    std::array<std::atomic<uint64_t>, kStabilityCount> write_ops{}, write_bytes{};
  };

  // Moves to `to`, publishes it and records the change (loop thread).
  void SetState(State to, std::string reason);

  void Send(std::shared_ptr<Request> r, Clock::time_point now);
  void SendProbe(Clock::time_point now);
  void OnProbeReply(Attempt* a, ReplyStatus status, const char* error);
  void BecomeUp();
  void Heard(Clock::time_point now);
  // Throughput and sojourn bookkeeping on each answered call (statistics
  // only: the balancer weighs outstanding bytes and the path's configured
  // weight, engine.cc Scan).
  // `sojourn`: since the call was charged here.
  void Account(Clock::time_point now, int64_t bytes, Clock::duration sojourn);
  // Liveness while up: probe at half path_timeout, declare dead at full.
  void CheckSilence(Clock::time_point now);
  void Charge(Request& r);
  static void Uncharge(Request& r);
  void Fail(const std::string& why);
  // By value: `r` may be the `req` of an Attempt that Release() clears.
  void Finish(std::shared_ptr<Request> r, const CallOutcome& o);
  // `r` is finished: its Attempts still here stop counting in flight.
  void Release(Request& r);
  // Disabled: every queued call goes to an enabled connection.
  void MovePending();
  // Removed and nothing left in flight or queued: close and retire.
  void MaybeClose();
  void NoteDeadline(Clock::time_point t) {
    if (t < next_check_) next_check_ = t;
  }
  const char* StateName() const;
  static const char* StateName(State s);

  Engine* const engine_;
  Loop* const loop_;
  const Endpoint ep_;
  std::atomic<int> weight_;
  const std::string name_;
  const EngineOptions& opts_;
  TransportFactory& factory_;
  std::shared_ptr<spdlog::logger> log_;

  std::unique_ptr<Transport> t_;
  State state_ = State::kDown;
  std::atomic<bool> up_{false};
  std::atomic<int> state_pub_{0};
  bool closing_ = false;
  bool shut_down_ = false;  // Shutdown() ran: the loop is ending
  bool servicing_ = false;
  bool connect_failed_ = false;
  std::string fail_reason_;
  bool ever_up_ = false;
  bool connect_tried_ = false;  // Connect() has run at least once
  std::string down_reason_;     // why it last went down (SetState's reason)
  bool reprobe_ = false;     // probing an up connection just enabled again
  std::deque<std::shared_ptr<Request>> pending_;
  std::list<Attempt> inflight_;
  std::vector<std::shared_ptr<Request>> rescued_;   // collected while closing
  std::vector<std::shared_ptr<Request>> errored_;   // kError seen during Service()
  Clock::time_point connect_deadline_{};
  Clock::time_point reconnect_at_ = Clock::time_point::max();
  Clock::time_point next_check_ = Clock::time_point::max();
  Backoff backoff_;
  uint64_t failed_connects_ = 0;
  // Liveness (loop thread).
  Clock::time_point heard_{};          // last reply, probe answer or readable socket
  Clock::time_point busy_since_{};     // work outstanding since
  Attempt* probe_ = nullptr;           // the NULL probe in flight, if any
  bool asked_others_ = false;
  // Statistics (loop thread writes): throughput while busy and mean sojourn,
  // from the bytes, busy time and waits of the current window.
  Clock::time_point mark_{};
  Clock::duration win_busy_{};
  int64_t win_bytes_ = 0;
  double win_wait_ = 0;  // sum of bytes x sojourn (s) over the window
  std::atomic<int64_t> charged_bytes_{0};
  std::atomic<uint64_t> rate_{0};
  LinkRate link_rate_;  // written by the loop thread (OnLinkRate), read anywhere
  std::atomic<double> sojourn_{0};
  std::atomic<Clock::rep> last_heard_{0};
  std::atomic<bool> suspect_{false};
  RateLimit down_log_{std::chrono::seconds(60)};
  AtomicStats stats_;
  // Online path maintenance: written by the engine (any thread), read anywhere.
  std::atomic<bool> disabled_{false};
  std::atomic<bool> removed_{false};
  bool closed_for_good_ = false;  // loop thread: removed and closed
  mutable Mutex history_mu_;
  std::deque<StateChange> history_ GUARDED_BY(history_mu_);
  uint64_t transitions_ GUARDED_BY(history_mu_) = 0;
};

}  // namespace mpnfs::engine
