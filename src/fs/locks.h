// fs::Locks: byte-range locks (fcntl F_SETLK/F_SETLKW/F_GETLK and their
// OFD forms) and whole-file locks (flock, taken as a lock of the whole
// file, as the Linux NFS client does) forwarded to the server's lock
// manager (NLM v4: nfs/nlm.h), so that they exclude each other on every
// host that mounts the export. The server splits and merges ranges.
//
// Owners. The kernel names a lock's owner with a 64-bit id (FUSE's
// lock_owner: a process's file table for fcntl locks, an open file for
// OFD and flock locks). The server knows an owner by `oh`: 8 bytes drawn
// at random for this mount (two mounts on one host are different owners),
// then the kernel's id; and by svid, 31 bits of the id mixed with the
// mount's bytes. F_GETLK reports a conflicting lock of this mount with the
// pid that took it, another host's with its svid (which the kernel shows
// as pid 0).
//
// Waiting. A waiting request (F_SETLKW, a blocking flock) asks the server
// without blocking it, and asks again while the lock is held elsewhere:
// after 10 ms, doubling to at most kMaxPoll (a lock released elsewhere is
// taken within about that long), until granted or interrupted (a signal:
// EINTR). Any request answered "grace period" (the server restarted and
// lets its clients reclaim first) is asked again every kGracePoll, also a
// non-waiting one, as the Linux client does.
//
// Data. Locks order other hosts' access to the data only if what was
// written under a lock is on the server before the lock goes, and what is
// read under one is the server's: as the Linux NFS client does, the front
// end (fuse/fuse_ops.cc) writes the file's data back before an unlock or a
// release, and drops the kernel's cached pages and attributes once a lock
// is granted.
//
// Release. A lock request is recorded, with the open file it came through,
// before its LOCK is sent (a request left unanswered counts as granted);
// one refused, for an owner with no lock of the file granted and no other
// request on its way, is forgotten.
// A close by the owner (FUSE's flush) releases all of its locks on the
// file (POSIX); the last close of an open file releases those of owners
// that locked only through it (OFD and flock locks); ReleaseAll (unmount)
// releases all.
//
// Server restarts. What the server granted is kept per owner and file
// (fs/lock_ranges.h). While this mount holds a lock, every `check_every`
// one held range (the owners take turns, exclusive ranges first) is tested
// under an owner of no one's. A server in its grace period (it restarted:
// only reclaims are granted) gets every lock asked for again with
// `reclaim` (at each check in the period). A server that grants the test, or denies it for another
// host's lock that cannot stand beside this mount's, has forgotten the
// lock (it restarted, and its grace period passed unseen): every lock is
// asked for again as a new one. A lock another host took meanwhile is
// lost: logged as an error and counted (LostLocks). A server that names
// no holder in its denial (Linux's lockd) is taken to deny it for this
// mount's lock. While an owner's locks on a file are asked for again,
// every request on that file (lock, unlock, close) waits, so that none
// crosses a LOCK sent for the same bytes; a request granted meanwhile
// (one that was waiting) has its owner's ranges asked for again as they
// are then. The unmount's ReleaseAll waits for those LOCKs.
//
// Holding. `may_hold(true)` runs before the LOCK that takes this mount from
// holding nothing to holding something is sent (if it fails, so does the
// request), and `may_hold(false)` once the mount holds nothing again (every
// UNLOCK answered), on the timer's thread: they keep the state file that
// says whether a killed gateway left locks on the server (cli/lock_service.h).
//
// Thread safety: all methods are thread safe. `cb` runs on an engine loop
// thread, on the timer's, or inline. hold_mu_ > mu_ > the timer's
// (common/mutex.h).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "common/mutex.h"
#include "common/timer.h"
#include "fs/lock_ranges.h"
#include "nfs/nlm.h"

namespace mpnfs::fs {

class Locks {
 public:
  static constexpr std::chrono::milliseconds kFirstPoll{10};
  static constexpr std::chrono::milliseconds kMaxPoll{500};
  static constexpr std::chrono::milliseconds kGracePoll{1000};
  static constexpr std::chrono::milliseconds kCheckEvery{2000};

  // What the kernel asks: `type` F_RDLCK, F_WRLCK or F_UNLCK over
  // [start, start + length) (length 0: to the end), for `owner`, by `pid`.
  struct Request {
    uint64_t owner = 0;
    uint32_t pid = 0;
    int type = 0;
    uint64_t start = 0;
    uint64_t length = 0;
  };
  // A lock that conflicts (F_GETLK's answer).
  struct Conflict {
    int type = 0;
    uint64_t start = 0;
    uint64_t length = 0;
    int32_t pid = 0;
  };

  // `instance`: this mount's 8 bytes (random); `may_hold`: see "Holding".
  Locks(nfs::LockClient& nlm, std::array<char, 8> instance,
        std::function<Result<Ok>(bool may_hold)> may_hold = {},
        std::chrono::milliseconds check_every = kCheckEvery);

  void Get(const nfs::Fh& fh, const Request& r, const nfs::Cred& c, nfs::Cb<std::optional<Conflict>> cb);
  // F_RDLCK/F_WRLCK through `file` (recorded; never dereferenced), or
  // F_UNLCK. `wait`: until granted or `interrupted()`.
  void Set(const nfs::Fh& fh, const void* file, const Request& r, bool wait, std::function<bool()> interrupted,
           const nfs::Cred& c, nfs::Cb<Ok> cb);
  // Every lock of `owner` on the file.
  void ReleaseOwner(const nfs::Fh& fh, uint64_t owner, const nfs::Cred& c, nfs::Cb<Ok> cb);
  // The last close of `file`: the locks of owners that locked only through it.
  void ReleaseFile(const nfs::Fh& fh, const void* file, const nfs::Cred& c, nfs::Cb<Ok> cb);
  // All of this mount's locks.
  void ReleaseAll(const nfs::Cred& c, nfs::Cb<Ok> cb);
  // The mount ends: lock requests fail with ESHUTDOWN from now on (a wait
  // ends at its next try), a lock granted from now on is given back at
  // once. Called before ReleaseAll.
  void Shutdown();
  // Whether this mount may hold locks on the server (some were asked for
  // and not all released); of `owner` on the file; through `file`.
  bool MayHold() const;
  bool MayHold(const nfs::Fh& fh, uint64_t owner) const;
  bool MayHoldThrough(const nfs::Fh& fh, const void* file) const;

  nfs::LockOwner OwnerOf(uint64_t owner) const;
  // Locks a server restart lost to another host, since the mount began.
  uint64_t LostLocks() const { return lost_.load(); }

 private:
  using Key = std::pair<nfs::Fh, uint64_t>;  // file, owner
  void Attempt(const nfs::Fh& fh, const void* file, const Request& r, bool wait, std::function<bool()> interrupted,
               const nfs::Cred& c, nfs::Cb<Ok> cb, std::chrono::milliseconds next);
  // UNLOCKs the whole file for each owner, then cb (the first error, if any).
  void UnlockAll(std::vector<Key> keys, const nfs::Cred& c, nfs::Cb<Ok> cb);
  // A LOCK request ended: granted, refused for good, or unanswered (the
  // server may have granted it: kept as held).
  enum class Outcome { kGranted, kRefused, kUnknown };
  void Answered(const Key& k, const void* file, Outcome o, const Request& r, const nfs::Cred& c);
  // Whether locks of the file are being asked for again (then a request
  // on it runs Later: it must not cross a LOCK sent for the same bytes).
  bool ReassertingLocked(const nfs::Fh& fh) const REQUIRES(mu_);
  void Later(std::function<void()> fn);
  // Restart detection: Check tests one held range; Reassert asks for every
  // held lock again (with `reclaim` in the grace period).
  void ScheduleCheckLocked() REQUIRES(mu_);
  void NextCheck();
  void Check();
  void Reassert(bool reclaim);
  void ReassertKey(const Key& k, bool reclaim, std::function<void()> done);
  // Once every LOCK of a ReassertKey round was answered (`gen`: the key's
  // when the round began).
  void EndReassertKey(const Key& k, bool reclaim, uint64_t gen, std::function<void()> done);
  void ForgetPidLocked(uint64_t owner) REQUIRES(mu_);
  // UNLOCK, asked again while the server is in its grace period.
  void UnlockRange(const nfs::Fh& fh, uint64_t owner, uint64_t start, uint64_t length, const nfs::Cred& c,
                   nfs::Cb<Ok> cb);
  // Once nothing is held: may_hold_(false), on the timer's thread.
  void MaybeNothingHeld();

  nfs::LockClient& nlm_;
  const std::array<char, 8> instance_;
  const std::function<Result<Ok>(bool)> may_hold_;
  Mutex hold_mu_;  // serializes may_hold_ (taken before mu_)
  bool marked_ GUARDED_BY(hold_mu_) = false;  // may_hold_(true) said last
  mutable Mutex mu_;
  struct Held {
    std::set<const void*> files;  // the open files it locked through
    bool granted = false;         // a lock of the owner on the file was (or may have been) granted
    int pending = 0;              // LOCK requests on their way
    int sending = 0;              // their LOCK calls unanswered now
    LockRanges ranges;            // what the server granted
    uint64_t gen = 0;             // counts changes to `ranges`
    nfs::Cred cred;               // of the last request (asking again carries it)
    bool reasserting = false;     // its locks are being asked for again
  };
  std::atomic<bool> stopping_{false};
  std::map<Key, Held> held_ GUARDED_BY(mu_);
  std::map<uint64_t, uint32_t> pids_ GUARDED_BY(mu_);  // owner: the pid of its last lock request
  const std::chrono::milliseconds check_every_;
  bool checking_ GUARDED_BY(mu_) = false;        // a Check is scheduled or running
  std::optional<Key> last_probed_ GUARDED_BY(mu_);
  bool in_grace_ GUARDED_BY(mu_) = false;        // the last Check found the server in its grace period (logged)
  int reasserts_ GUARDED_BY(mu_) = 0;            // keys being asked for again
  std::atomic<uint64_t> lost_{0};
  Timer timer_;  // last: its thread runs retries that use the members above
};

}  // namespace mpnfs::fs
