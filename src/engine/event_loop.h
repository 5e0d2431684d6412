// Loop: one event-loop thread driving a set of Connections with epoll.
//
// Cross-thread hand-off goes through Post(): a mutex-protected mailbox plus
// an eventfd that wakes epoll_wait. The loop sleeps until a socket is ready,
// the mailbox is written, or the nearest connection deadline is due.
//
// Lock order: Loop::mu_ is a leaf lock (nothing is called while holding it).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/thread_annotations.h"
#include "engine/request.h"

namespace mpnfs::engine {

class Connection;

class Loop {
 public:
  explicit Loop(int index);
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

  bool OnLoopThread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  struct Delivery {
    Connection* conn;
    std::shared_ptr<Request> req;
  };

  void Main();
  void Wake();
  void SyncPoll(Connection* c);
  void DrainMailbox();

  const int index_;
  int epfd_ = -1;
  int evfd_ = -1;
  std::thread thread_;
  std::vector<Connection*> conns_;

  std::mutex mu_;
  std::vector<Delivery> mail_ GUARDED_BY(mu_);
  std::vector<std::function<void()>> tasks_ GUARDED_BY(mu_);
  std::multimap<Clock::time_point, std::function<void()>> timers_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  bool ended_ GUARDED_BY(mu_) = false;  // the mailbox is closed for good
  bool woken_ GUARDED_BY(mu_) = false;
};

}  // namespace mpnfs::engine
