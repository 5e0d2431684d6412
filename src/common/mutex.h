// Mutex, MutexLock, CondVar: std::mutex and std::condition_variable with the
// clang thread-safety annotations (common/thread_annotations.h), so that
// clang's -Wthread-safety checks every GUARDED_BY and REQUIRES in the
// program (a plain std::mutex carries no capability: nothing was checked).
//
// Lock order: a thread holding a lock may take one listed after it ("A >
// B": A before B), never one before it. This is the whole list for the
// program and its fakes; the headers that state an order point here.
//   cli::Control's cache_ops (cli/main.cc) > the locks of fs/, cache/ and
//     engine/ a cache command takes (it runs under it).
//   FlushWithProgress's mu (cli/main.cc) > cache::BlockCache::mu_ (Stats()).
//   engine::Loop::run_mu_ (held by the loop thread, which runs the NFS
//     completions, or by a direct section) > engine::Engine::admin_mu_
//     (Retire) > engine::Loop::mu_ and engine::Connection::history_mu_;
//     run_mu_ > Loop::mu_ (event_loop.h), and > every lock of fs/ and
//     cache/ but fs::Flusher::send_mu_ (what a completion takes). A thread
//     holding a run_mu_ only try-locks another loop's, never waits for one.
//   fs::Flusher::send_mu_ (calls are sent under it) > fs::InodeTable::mu_,
//     fs::FileWrites::mu (the write hook, one after the other),
//     cache::BlockCache::mu_ (WriteStart), fs::GoneCheck's State::mu,
//     fs::Flusher::RoundState::mu (a completion run inline) and the
//     engine's Loop::mu_ (Loop::run_mu_: try-locked only).
//   fs::DirHandle::mu > fs::InodeTable::mu_ > fs::Inode::mu (FillDir's
//     READDIRPLUS lookups) > fs::FileWrites::mu (the same inode's: its
//     writes) > fs::Gather::mu_; Inode::mu > fs::HiddenNames::mu_;
//     DirHandle::mu > cache::BlockCache::mu_ (MakeAttr: SizeFloor). No
//     thread holds two Inode::mu, or two FileWrites::mu, at once.
//   cache::BlockCache::mu_ > LogState::mu (common/log.cc, in Log()) and
//     the cache disk's (test::CrashDisk::mu_; at Init() and destruction).
//     cache::CrcStore has no lock: it runs under BlockCache::mu_.
//   fs::Locks::hold_mu_ > fs::Locks::mu_ > Timer::mu_ (its own timer's).
//   Leaves (nothing is taken under them): Loop::mu_, history_mu_,
//     Timer::mu_ (common/timer.h), cli::LockService::watch_mu_ and stats_mu_,
//     engine::MountRate::mu_ (engine/link_rate.h: try-locked only),
//     nfs::ServiceCounters::mu_,
//     HiddenNames::mu_, Gather::mu_, fs::Filesystem::postop_mu_ and its
//     ReadOp::mu and reaper_mu_, GoneCheck's State::mu, Flusher::mu_ and RoundState::mu,
//     BlockCache::Reader::mu_, fuse::CredCache::mu_,
//     cli::ControlSocket::mu_, calibrate's StepState::mu, LogState::mu,
//     WriteBack's page-map lock (fs/write.cc), and in the fakes
//     testing::FakeNfs::mu_ (taken under FileWrites::mu: Parallelism()),
//     testing::FakeNet::mu (under run_mu_) and test::CrashDisk::mu_.
//
// Thread safety: as std::mutex and std::condition_variable.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "common/thread_annotations.h"

namespace mpnfs {

class CondVar;

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  bool TryLock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // Tells the analysis that the calling thread holds the lock (checks nothing).
  void AssertHeld() ASSERT_CAPABILITY(this) {}

  // BasicLockable / Lockable, for the std algorithms that need them.
  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }
  bool try_lock() TRY_ACQUIRE(true) { return mu_.try_lock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds `mu` for its scope. Unlock() and Lock() let go of it and take it
// again within the scope; the destructor unlocks only if it is held.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ACQUIRE(mu) : mu_(mu) { mu_.Lock(); }
  ~MutexLock() RELEASE() {
    if (held_) mu_.Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() RELEASE() {
    mu_.Unlock();
    held_ = false;
  }
  void Lock() ACQUIRE() {
    mu_.Lock();
    held_ = true;
  }

 private:
  Mutex& mu_;
  bool held_ = true;
};

// A condition variable waited on with a Mutex held (as leveldb's
// port::CondVar: the std::mutex is adopted for the wait and released after,
// so the caller keeps holding it).
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  void Wait(Mutex& mu) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // False if `deadline` passed (the caller checks its condition either way).
  template <class Clock, class Duration>
  bool WaitUntil(Mutex& mu, const std::chrono::time_point<Clock, Duration>& deadline) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    const std::cv_status s = cv_.wait_until(lock, deadline);
    lock.release();
    return s == std::cv_status::no_timeout;
  }
  // False if `timeout` passed.
  template <class Rep, class Period>
  bool WaitFor(Mutex& mu, const std::chrono::duration<Rep, Period>& timeout) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    const std::cv_status s = cv_.wait_for(lock, timeout);
    lock.release();
    return s == std::cv_status::no_timeout;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace mpnfs
