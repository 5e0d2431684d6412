// Loop: one event-loop thread driving a set of Connections with epoll.
//
// Cross-thread hand-off goes through Post(): a mutex-protected mailbox plus
// an eventfd that wakes epoll_wait. The loop sleeps until a socket is ready,
// the mailbox is written, or the nearest connection deadline is due.
//
// Direct sections (the queue-depth-1 fast path). Waking the loop thread for
// every call costs a thread hand-off per call, which at queue depth 1 is a
// large part of the latency. So the loop's state (its connections, their
// transports, epoll registrations) is owned not by the loop thread as
// such but by whoever holds `run_mu_`: the loop thread holds it all the time
// except while it sleeps in epoll_wait. TryRunHere() lets another thread
// (a FUSE worker submitting a call) take it when it is free, the loop being
// asleep, and act as the loop: queue the call and write it to the socket
// itself. The loop thread then wakes only for the reply. A direct section
// is refused (the caller posts as before) when the loop is busy, has mail
// not yet drained (so calls are never sent ahead of earlier posted ones),
// has not started or has ended, or when the caller already is in a section
// of this loop or is the loop thread, and while the loop is awake (from
// epoll_wait's return to its next sleep: the loop thread is never made to
// wait behind submitters). After a section, the loop is woken if the section
// left a deadline earlier than the one it sleeps until. An idle loop sleeps
// at most `idle_cap` (the shortest deadline a new call sets: min(timeo,
// path_timeout/2), as the engine sets it), so a direct call at idle needs no
// wake-up for its deadlines; the price is that an idle loop wakes that often
// to find nothing to do. A loop with no connections (kept for paths added
// later) has no direct sections, so it is not capped: it sleeps until told.
// Busy polling (opt-in, `busy_poll`): a loop that has just handled events
// and has at most one call in flight on its own connections (each loop
// decides for itself: on a mount whose calls spread over several loops,
// each may poll) polls epoll without sleeping for up to `busy_poll` (never
// past its next deadline) before it sleeps. At queue depth 1 the next call's reply then finds the loop thread
// on its CPU instead of asleep: one wake-up (and its scheduling latency)
// less per call, for a core kept busy while a single caller waits on the
// server. With more than one call in flight the loop sleeps as usual: the
// replies come often enough to keep it awake, and a spinning thread would
// take CPU from the calls (and, on a shared machine, from the server).
// While polling, the loop counts as asleep: direct sections may run.
// Completions without a reply that a section produces (a call that fails at
// once) are not run in it: Connection::Finish hands them to the loop thread.
// A reply read within a section completes there (see connection.h: not
// with RpcTransport, whose section only writes).
//
// Lock order (all of the program's: common/mutex.h): run_mu_ before mu_;
// Loop::mu_ is a leaf lock (nothing is called while holding it). run_mu_ of
// one loop is only ever try-locked by a thread holding another loop's
// run_mu_, never waited for.
#pragma once

#include <sys/epoll.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "engine/request.h"

namespace mpnfs::engine {

class Connection;

class Loop {
 public:
  explicit Loop(int index, Clock::duration idle_cap = Clock::duration::max(),
                Clock::duration busy_poll = Clock::duration::zero());
  ~Loop();
  Loop(const Loop&) = delete;
  Loop& operator=(const Loop&) = delete;

  // REQUIRES: before Start(), or on the loop thread outside the loop's walk
  // over its connections (in a Run() task).
  void Add(Connection* c) { conns_.push_back(c); }
  // The loop drives `c` no more. REQUIRES: as Add(); `c` has no socket
  // registered (closed). Mail for `c` is still delivered to it.
  void Remove(Connection* c) { std::erase(conns_, c); }
  void Start();
  // Shuts the connections down on the loop thread and joins it.
  void Stop();

  // Any thread: deliver `r` to `c` (which must belong to this loop).
  // False once the loop has ended (after Stop()'s last look at its
  // mailbox): `r` was not taken, and the caller must complete it.
  bool Post(Connection* c, std::shared_ptr<Request> r);
  // Any thread: run `fn` on the loop thread. False once the loop has ended:
  // `fn` will never run.
  bool Run(std::function<void()> fn);
  // Any thread: run `fn` on the loop thread once `when` has come (or when
  // the loop stops, whichever is first). False once the loop has ended.
  bool RunAt(Clock::time_point when, std::function<void()> fn);

  bool OnLoopThread() const {
    return std::this_thread::get_id() == loop_tid_.load(std::memory_order_relaxed);
  }
  // This thread is in a direct section of this loop.
  bool InDirectSection() const {
    return holder_.load(std::memory_order_relaxed) == std::this_thread::get_id();
  }

  // Any thread: if the loop is asleep with an empty mailbox, run `fn` now on
  // this thread as the loop would (see "Direct sections" above) and return
  // true; else return false without running it.
  template <typename Fn>
  bool TryRunHere(Fn&& fn) {
    if (!EnterDirect()) return false;
    struct SCOPED_CAPABILITY Leave {  // adopts the run_mu_ EnterDirect took
      Loop* loop;
      explicit Leave(Loop* l) REQUIRES(l->run_mu_) : loop(l) {}
      ~Leave() RELEASE() { loop->LeaveDirect(); }
    } leave{this};
    fn();
    return true;
  }
  // Direct sections run since Start (for tests and statistics).
  uint64_t direct_sections() const { return direct_.load(std::memory_order_relaxed); }
  // Times the loop woke from epoll_wait since Start, a busy poll's end
  // counted once (for tests).
  uint64_t wakeups() const { return wakeups_.load(std::memory_order_relaxed); }
  // Polls of epoll that did not sleep, made while busy polling, since Start.
  uint64_t busy_polls() const { return busy_polls_.load(std::memory_order_relaxed); }
  // Its place among the engine's loops.
  int index() const { return index_; }

 private:
  struct Delivery {
    Connection* conn;
    std::shared_ptr<Request> req;
  };

  void Main();
  void Step(epoll_event* evs, int n) REQUIRES(run_mu_);
  bool EnterDirect() TRY_ACQUIRE(true, run_mu_);
  void LeaveDirect() RELEASE(run_mu_);
  Clock::time_point NextDue() const REQUIRES(run_mu_);
  // Calls in flight on this loop's connections.
  int64_t InFlight() const REQUIRES(run_mu_);
  // epoll_wait for events until `next` (max: until woken), busy polling
  // first if `poll`.
  int Wait(epoll_event* evs, Clock::time_point next, bool poll) EXCLUDES(run_mu_);
  void Wake();
  void SyncPoll(Connection* c);
  void DrainMailbox();

  const int index_;
  const Clock::duration idle_cap_;
  const Clock::duration busy_poll_;
  int epfd_ = -1;
  int evfd_ = -1;
  std::thread thread_;
  std::vector<Connection*> conns_;

  // Held by the loop thread except in epoll_wait, or by a direct section.
  Mutex run_mu_;
  bool running_ GUARDED_BY(run_mu_) = false;  // Main() is in its loop
  // When the sleeping loop will wake by itself (published under run_mu_).
  std::atomic<Clock::rep> sleep_until_{Clock::time_point::max().time_since_epoch().count()};
  std::atomic<uint64_t> direct_{0};
  std::atomic<uint64_t> wakeups_{0};
  std::atomic<uint64_t> busy_polls_{0};
  std::atomic<std::thread::id> holder_{};  // the thread in a direct section
  std::atomic<std::thread::id> loop_tid_{};  // set by Main()
  // Between epoll_wait's return and the loop's next sleep: the loop has
  // work and takes run_mu_ next, so direct sections are refused (the loop
  // is not made to wait behind submitters).
  std::atomic<bool> awake_{true};

  Mutex mu_;
  std::vector<Delivery> mail_ GUARDED_BY(mu_);
  std::vector<std::function<void()>> tasks_ GUARDED_BY(mu_);
  std::multimap<Clock::time_point, std::function<void()>> timers_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  bool ended_ GUARDED_BY(mu_) = false;  // the mailbox is closed for good
  bool woken_ GUARDED_BY(mu_) = false;
};

}  // namespace mpnfs::engine
