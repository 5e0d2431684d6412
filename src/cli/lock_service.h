// LockService: a mount's link to the server's lock manager, for the locks
// that do not stay on this host (local_lock=, mpnfs(8) "LOCKS").
//
// Lock calls (NLM v4, fs/locks.h) go over the mount's first path, on an
// engine of their own with one connection: the server knows a client's
// locks by the address they come from, so they must come from one
// address (a call waits while that path is down, and is sent again when
// it is back). The server's lock manager may come back on another port
// after a restart (it registers wherever it is given, unless configured):
// while that path has no connection up, the port is looked up again every
// kRebind (GETPORT to the server's portmapper) and, if it moved, the path
// moves with it (calls waiting there go to the new port), as the Linux
// client's RPC layer binds again after a reconnect fails.
//
// Restarts. The server knows this host's locks by the address they come
// from, so a state file per local address (/var/lib/mpnfs/nlm/ADDRESS,
// shared by every mount of this host from that address, which take turns
// under an flock of ADDRESS.lock) keeps this host's NSM state number and,
// per running mount, its boot id, pid and start time, and whether it may
// hold locks. A mount says so before the lock request that takes it from
// holding nothing to holding something, and again once it holds nothing;
// its end (every lock released) takes its line out. A mount that starts and
// finds the line of a mount that is gone (killed, or a boot ago) while it
// may have held locks tells the server's status monitor that this host
// restarted (SM_NOTIFY, with the next state number), and the server drops
// the locks it held for the address, as when a host reboots. While another
// running mount may hold locks there it does not (they would go too), and
// if the monitor cannot be told it goes on: the gone mount's line stays
// for the next mount to try. (The kernel's own NFS client, if it also
// locks on that server from that address, is not known here.)
//
// Thread safety: Start and Stop from the mounting thread; locks() and
// Stats() from any. The rebinding runs on a thread of its own; watch_mu_
// and stats_mu_ are leaves.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "cli/options.h"
#include "common/mutex.h"
#include "engine/engine.h"
#include "fs/locks.h"
#include "mpnfs/result.h"
#include "nfs/nlm.h"
#include "nfs/service_stats.h"

namespace mpnfs::cli {

class LockService {
 public:
  static constexpr const char* kStateDir = "/var/lib/mpnfs/nlm";
  static constexpr std::chrono::seconds kRebind{2};

  // An error when the server has no lock manager or the state file cannot
  // be kept.
  // Its port lookups and status-monitor calls are counted in `counters`
  // (which must outlive it).
  static Result<std::unique_ptr<LockService>> Start(const MountOptions& m, const engine::Endpoint& path,
                                                    int tcp_user_timeout_ms, std::chrono::milliseconds timeout,
                                                    nfs::ServiceCounters* counters = nullptr);
  ~LockService();

  // Until Stop().
  fs::Locks& locks() { return *locks_; }
  // The lock calls' statistics ("NLM"), from any thread, also after Stop().
  nfs::ServiceStats Stats() const;
  // Releases every lock (waiting at most `timeout`), records that none is
  // held if they all were, and stops the engine.
  void Stop(std::chrono::milliseconds timeout);

 private:
  LockService() = default;
  // Rewrites this mount's line (held: may hold locks; gone: the mount
  // ends, the line goes).
  Result<Ok> Mark(bool held, bool gone = false);
  // The rebinding thread: see the top.
  void Watch();
  void StopWatch();

  std::string state_file_;
  std::string me_;  // "PID STARTTIME"
  int32_t state_ = 1;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<nfs::Nlm> nlm_;
  // Replaced by null in Stop() under stats_mu_ (Stats() may run then); the
  // other threads use it only before.
  std::unique_ptr<fs::Locks> locks_;
  mutable Mutex stats_mu_;  // a leaf
  uint64_t lost_at_stop_ GUARDED_BY(stats_mu_) = 0;
  nfs::ServiceCounters* counters_ = nullptr;
  bool stopped_ = false;
  engine::Endpoint nlm_path_;      // where lock calls go now (the watch thread's)
  std::chrono::milliseconds lookup_timeout_{0};
  Mutex watch_mu_;
  CondVar watch_cv_;
  bool watch_stop_ GUARDED_BY(watch_mu_) = false;
  std::thread watch_;
};

}  // namespace mpnfs::cli
