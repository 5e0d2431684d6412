#include "engine/event_loop.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <stdexcept>

#include "engine/connection.h"

namespace mpnfs::engine {

Loop::Loop(int index, Clock::duration idle_cap, Clock::duration busy_poll)
    : index_(index), idle_cap_(idle_cap), busy_poll_(busy_poll) {
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  evfd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epfd_ < 0 || evfd_ < 0) throw std::runtime_error(std::string("epoll/eventfd: ") + strerror(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;
  epoll_ctl(epfd_, EPOLL_CTL_ADD, evfd_, &ev);
}

Loop::~Loop() {
  Stop();
  close(evfd_);
  close(epfd_);
}

void Loop::Start() {
  thread_ = std::thread([this] { Main(); });
}

void Loop::Stop() {
  if (!thread_.joinable()) return;
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  Wake();
  thread_.join();
}

void Loop::Wake() {
  uint64_t one = 1;
  ssize_t n = write(evfd_, &one, sizeof(one));
  (void)n;  // EAGAIN means the counter is already non-zero: the loop will wake
}

bool Loop::Post(Connection* c, std::shared_ptr<Request> r) {
  bool wake;
  {
    MutexLock lock(mu_);
    if (ended_) return false;
    mail_.push_back(Delivery{c, std::move(r)});
    wake = !woken_ && !OnLoopThread();
    if (wake) woken_ = true;
  }
  if (wake) Wake();
  return true;
}

bool Loop::Run(std::function<void()> fn) {
  bool wake;
  {
    MutexLock lock(mu_);
    if (ended_) return false;
    tasks_.push_back(std::move(fn));
    wake = !woken_ && !OnLoopThread();
    if (wake) woken_ = true;
  }
  if (wake) Wake();
  return true;
}

bool Loop::RunAt(Clock::time_point when, std::function<void()> fn) {
  bool wake;
  {
    MutexLock lock(mu_);
    if (ended_) return false;
    const bool earliest = timers_.empty() || when < timers_.begin()->first;
    timers_.emplace(when, std::move(fn));
    wake = earliest && !woken_ && !OnLoopThread();
    if (wake) woken_ = true;
  }
  if (wake) Wake();
  return true;
}

bool Loop::EnterDirect() {
  if (OnLoopThread() || InDirectSection() || awake_.load(std::memory_order_relaxed)) return false;
  if (!run_mu_.TryLock()) return false;
  bool ok = running_;
  if (ok) {
    MutexLock lock(mu_);
    ok = !stop_ && mail_.empty() && tasks_.empty();
  }
  if (!ok) {
    run_mu_.Unlock();
    return false;
  }
  holder_.store(std::this_thread::get_id(), std::memory_order_relaxed);
  return true;
}

void Loop::LeaveDirect() {
  for (auto* c : conns_) SyncPoll(c);
  const auto due = NextDue();
  holder_.store(std::thread::id{}, std::memory_order_relaxed);
  bool wake = false;
  {
    MutexLock lock(mu_);
    const bool early = due.time_since_epoch().count() < sleep_until_.load(std::memory_order_relaxed);
    if ((early || !mail_.empty() || !tasks_.empty()) && !woken_) {
      woken_ = true;
      wake = true;
    }
  }
  run_mu_.Unlock();
  direct_.fetch_add(1, std::memory_order_relaxed);
  if (wake) Wake();
}

Clock::time_point Loop::NextDue() const {
  auto next = Clock::time_point::max();
  for (auto* c : conns_) next = std::min(next, c->NextDeadline());
  return next;
}

void Loop::SyncPoll(Connection* c) {
  int fd = c->fd();
  uint32_t want = fd >= 0 ? static_cast<uint32_t>(c->events()) : 0;
  if (fd != c->registered_fd) {
    if (c->registered_fd >= 0) epoll_ctl(epfd_, EPOLL_CTL_DEL, c->registered_fd, nullptr);
    c->registered_fd = -1;
    if (fd >= 0) {
      epoll_event ev{};
      ev.events = want;
      ev.data.ptr = c;
      if (epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) == 0 ||
          (errno == EEXIST && epoll_ctl(epfd_, EPOLL_CTL_MOD, fd, &ev) == 0)) {
        c->registered_fd = fd;
        c->registered_events = want;
      }
    }
  } else if (fd >= 0 && want != c->registered_events) {
    epoll_event ev{};
    ev.events = want;
    ev.data.ptr = c;
    if (epoll_ctl(epfd_, EPOLL_CTL_MOD, fd, &ev) != 0 && errno == ENOENT) {
      epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev);
    }
    c->registered_events = want;
  }
}

void Loop::DrainMailbox() {
  std::vector<Delivery> mail;
  std::vector<std::function<void()>> tasks;
  {
    MutexLock lock(mu_);
    mail.swap(mail_);
    tasks.swap(tasks_);
    woken_ = false;
    const auto now = Clock::now();
    while (!timers_.empty() && timers_.begin()->first <= now) {
      tasks.push_back(std::move(timers_.begin()->second));
      timers_.erase(timers_.begin());
    }
  }
  for (auto& d : mail) d.conn->Enqueue(std::move(d.req));
  for (auto& t : tasks) t();
}

void Loop::Step(epoll_event* evs, int n) {
  for (int i = 0; i < n; ++i) {
    auto* c = static_cast<Connection*>(evs[i].data.ptr);
    if (c == nullptr) {
      uint64_t v;
      ssize_t r = read(evfd_, &v, sizeof(v));
      (void)r;
      continue;
    }
    c->OnEvents(static_cast<int>(evs[i].events));
  }
  DrainMailbox();
  auto now = Clock::now();
  for (auto* c : conns_) {
    if (now >= c->NextDeadline()) c->OnTimer(now);
  }
  for (auto* c : conns_) SyncPoll(c);
}

int64_t Loop::InFlight() const {
  int64_t n = 0;
  for (const auto* c : conns_) n += c->inflight();
  return n;
}

int Loop::Wait(epoll_event* evs, Clock::time_point next, bool poll) {
  if (poll) {
    const auto until = std::min(next, Clock::now() + busy_poll_);
    uint64_t polls = 0;
    int n;
    do {
      n = epoll_wait(epfd_, evs, 64, 0);
      ++polls;
    } while (n == 0 && Clock::now() < until);
    busy_polls_.fetch_add(polls, std::memory_order_relaxed);
    if (n != 0) return n;
  }
  int timeout_ms = -1;  // next == max: until woken
  if (next != Clock::time_point::max()) {
    auto ms = std::chrono::ceil<std::chrono::milliseconds>(next - Clock::now()).count();
    timeout_ms = static_cast<int>(std::clamp<int64_t>(ms, 0, INT_MAX));
  }
  return epoll_wait(epfd_, evs, 64, timeout_ms);
}

void Loop::Main() {
  epoll_event evs[64];
  loop_tid_.store(std::this_thread::get_id(), std::memory_order_relaxed);
  MutexLock run(run_mu_);
  running_ = true;
  // The loop has handled events since it last slept or polled in vain: a
  // pass that only drains mail or tasks keeps it so.
  bool had_events = false;
  for (;;) {
    bool work = false;  // mail or tasks waiting: look at the sockets, do not sleep
    bool stop;
    auto next = Clock::time_point::max();
    {
      MutexLock lock(mu_);
      stop = stop_;
      work = !mail_.empty() || !tasks_.empty();
      if (!timers_.empty()) next = timers_.begin()->first;
    }
    if (stop) break;
    const auto now0 = Clock::now();
    if (!work) {
      next = std::min(next, NextDue());
      // Idle cap (see the header): a direct section's new deadlines are
      // never earlier than this, so it need not wake the loop for them. No
      // connection, no direct section: no cap.
      if (idle_cap_ != Clock::duration::max() && !conns_.empty() && next - now0 > idle_cap_) {
        next = now0 + idle_cap_;
      }
    } else {
      next = now0;
    }
    const bool poll = busy_poll_ > Clock::duration::zero() && !work && had_events && InFlight() <= 1;
    sleep_until_.store(next.time_since_epoch().count(), std::memory_order_relaxed);
    awake_.store(false, std::memory_order_relaxed);
    run.Unlock();
    int n = Wait(evs, next, poll);
    had_events = n > 0 || (had_events && work);
    awake_.store(true, std::memory_order_relaxed);
    wakeups_.fetch_add(1, std::memory_order_relaxed);
    run.Lock();
    Step(evs, n);
  }
  DrainMailbox();
  for (auto* c : conns_) c->Shutdown();
  // Delayed submissions run now: the engine is stopped, so they complete
  // with kShutdown rather than never.
  std::multimap<Clock::time_point, std::function<void()>> timers;
  {
    MutexLock lock(mu_);
    timers.swap(timers_);
  }
  for (auto& [when, fn] : timers) fn();
  // Calls completed by the shutdown may have posted more; whatever is
  // posted from now on is refused (Post and Run say so), never lost here.
  while (true) {
    {
      MutexLock lock(mu_);
      if (mail_.empty() && tasks_.empty() && timers_.empty()) {
        ended_ = true;
        running_ = false;
        break;
      }
    }
    DrainMailbox();
    std::multimap<Clock::time_point, std::function<void()>> late;
    {
      MutexLock lock(mu_);
      late.swap(timers_);
    }
    for (auto& [when, fn] : late) fn();
  }
}

}  // namespace mpnfs::engine
