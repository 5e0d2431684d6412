// InodeTable: FUSE inode numbers <-> NFS file handles, with lookup counts.
//
// FUSE gives each inode a lookup count: every successful reply that names an
// inode (lookup, create, mkdir, readdirplus entry, ...) adds one, and forget
// subtracts. The table keeps an Inode while its count is above zero; the root
// (ino 1) is pinned. Numbers are never reused within a mount, so a late
// request for a forgotten inode gets ESTALE, never another file.
//
// Lock order: InodeTable::mu_ before Inode::mu (the program's whole order:
// common/mutex.h). Forget re-checks the count under mu_, so a concurrent
// Intern() cannot resurrect a dying inode.
//
// Thread safety: all methods are thread safe.
#pragma once

#include <atomic>
#include <list>
#include <functional>
#include <optional>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "engine/cred.h"
#include "fs/write_order.h"
#include "mpnfs/result.h"
#include "nfs/types.h"

namespace mpnfs::fs {

struct Buffered;  // an uncommitted write kept for resending (filesystem.h)

class Inode {
 public:
  Inode(uint64_t ino, nfs::Fh fh) : ino_(ino), fh_(std::move(fh)) {}
  Inode(const Inode&) = delete;
  Inode& operator=(const Inode&) = delete;

  uint64_t ino() const { return ino_; }
  const nfs::Fh& fh() const { return fh_; }

  Mutex mu;
  // Close-to-open: attributes seen at the last open (or write) by this client.
  nfs::Time open_mtime GUARDED_BY(mu);
  uint64_t open_size GUARDED_BY(mu) = 0;
  bool have_open_attr GUARDED_BY(mu) = false;
  // Permission bits (07777) in the attributes the server last reported
  // (replies to GETATTR, SETATTR, LOOKUP, ..., and WRITE's post-op).
  uint32_t mode GUARDED_BY(mu) = 0;
  // Adaptive attribute timeout (acregmin..acregmax / acdirmin..acdirmax).
  double ac_timeout GUARDED_BY(mu) = 0;
  nfs::Time ac_last_ctime GUARDED_BY(mu);
  // Size high-water mark of this client's writes: attributes from replies
  // that may predate a completed write never report a smaller size.
  uint64_t size_hwm GUARDED_BY(mu) = 0;
  int writes_inflight GUARDED_BY(mu) = 0;
  uint64_t last_write_done_seq GUARDED_BY(mu) = 0;
  // Every WRITE of this file is admitted here first (fs/write_order.h): a
  // later overlapping WRITE never overtakes an earlier one.
  WriteOrder order GUARDED_BY(mu);
  // UNSTABLE writes not yet covered by a COMMIT with the same verifier.
  std::vector<std::shared_ptr<Buffered>> uncommitted GUARDED_BY(mu);
  uint64_t uncommitted_bytes GUARDED_BY(mu) = 0;
  // One COMMIT round at a time per file: a resend after a verifier change
  // must know every newer write (see Filesystem::Commit). Callers that come
  // while a round runs wait for the next one.
  bool commit_running GUARDED_BY(mu) = false;
  // Successful truncates since the kept data was last empty: (the
  // truncate's seq in `order`, new size). A resend never writes data older
  // than a truncate past its size.
  std::vector<std::pair<uint64_t, uint64_t>> truncations GUARDED_BY(mu);
  // Newer data that no kept list holds, recorded while kept data exists:
  // writes the server answered FILE_SYNC and the SSD cache flusher's writes
  // (seq, offset, length). A resend never writes older data over them.
  struct Newer {
    uint64_t seq, off, len;
  };
  std::vector<Newer> newer_log GUARDED_BY(mu);
  // Whether a resend could still happen (kept data, a round, writes out).
  bool MayResend() const REQUIRES(mu) {
    return !uncommitted.empty() || commit_running || !order.empty();
  }
  // Once nothing is kept, no round runs and no write is out, no resend can
  // happen: the logs that only resends read are emptied.
  void PruneResendLogs() REQUIRES(mu) {
    if (uncommitted.empty() && !commit_running && order.empty()) {
      truncations.clear();
      newer_log.clear();
    }
  }
  std::vector<std::function<void(Result<Ok>)>> commit_waiters GUARDED_BY(mu);
  // Write-behind: bytes acknowledged to the application but not yet answered
  // by the server, writes waiting for room.
  struct Parked {
    size_t bytes;
    // Called under mu, in order, when the window has room: admits the write
    // and appends what to run after unlocking.
    std::function<void(std::vector<std::function<void()>>*)> admit;
  };
  uint64_t behind_bytes GUARDED_BY(mu) = 0;
  // (A list, not a deque: an empty std::deque allocates ~600 bytes, and
  // every inode the kernel knows has one.)
  std::list<Parked> parked GUARDED_BY(mu);
  // Write-behind failures, as the kernel's errseq: `err_seq` counts them and
  // `last_error` is the latest; each open file remembers the count it has
  // seen (OpenFile::err_seen), so every open learns each error once, and an
  // open made after an error never sees it.
  uint64_t err_seq GUARDED_BY(mu) = 0;
  std::optional<Error> last_error GUARDED_BY(mu);
  // Events after which the kernel's pages of the file may not be the
  // server's data: uncached (O_DIRECT, direct_io) writes, counted when they
  // start and when they end (the kernel drops its pages before an uncached
  // write, 6.6+, and a reader may read old data back meanwhile), and writes
  // the SSD cache disk lost before they were flushed, and refused writes
  // answered as such (the kernel keeps a refused mmap writeback's pages).
  uint64_t page_doubts GUARDED_BY(mu) = 0;
  // err_seq and page_doubts at the last open: if either moved since, the
  // kernel's cached pages may not be the server's data (a failed
  // write-behind left pages the server never got), and Open() drops them
  // whatever cto and kernel_cache say.
  uint64_t open_err_seq GUARDED_BY(mu) = 0;
  uint64_t open_page_doubts GUARDED_BY(mu) = 0;
  // The server's size and mtime in the attributes last given to the kernel
  // (MakeAttr: lookups, GETATTR, SETATTR, READDIRPLUS entries, creates).
  // An open that finds others asks the kernel to fetch them again. Replies
  // built in one order may reach the kernel in another (which keeps the
  // first applied), so once two differing ones were given, which the kernel
  // holds is uncertain until an open has asked it to fetch them again.
  uint64_t kernel_size GUARDED_BY(mu) = 0;
  nfs::Time kernel_mtime GUARDED_BY(mu);
  bool kernel_attr_known GUARDED_BY(mu) = false;
  bool kernel_attr_uncertain GUARDED_BY(mu) = false;
  // Set by a write-behind failure (err_seq): the file's writes are not
  // written behind (each waits for the server and returns its own error)
  // until an fsync or close through a descriptor with nothing left to
  // report commits (CommitAfterDrain).
  bool behind_refused GUARDED_BY(mu) = false;
  // Run once no write-behind is pending (reads, stats, truncates, fsync and
  // close wait here). Synchronous writes (O_DIRECT, O_SYNC) are not waited
  // for: their callers have no answer yet, so nobody may rely on them.
  std::vector<std::function<void()>> drain_waiters GUARDED_BY(mu);
  bool WriteBehindPending() const REQUIRES(mu) { return behind_bytes > 0 || !parked.empty(); }
  // Open files of this mount, and the hidden name a removal while open left
  // the file under (as the kernel client's "silly rename"): the directory and
  // the name to REMOVE at the last close.
  int opens GUARDED_BY(mu) = 0;
  struct Silly {
    nfs::Fh dir;
    std::string name;
    engine::Cred cred;  // who removed the file: the hidden name goes as that user
  };
  std::optional<Silly> silly GUARDED_BY(mu);

 private:
  friend class InodeTable;
  const uint64_t ino_;
  const nfs::Fh fh_;
  uint64_t nlookup_ = 0;  // guarded by InodeTable::mu_
};

class InodeTable {
 public:
  static constexpr uint64_t kRootIno = 1;

  explicit InodeTable(nfs::Fh root_fh);

  // The inode for `fh`, created if new; its lookup count grows by one.
  std::shared_ptr<Inode> Intern(const nfs::Fh& fh);
  // nullptr when `ino` is unknown (forgotten or never issued).
  std::shared_ptr<Inode> Get(uint64_t ino) const;
  // The inode for `fh` if this mount knows it (no lookup count taken); else null.
  std::shared_ptr<Inode> Find(const nfs::Fh& fh) const;
  // Drops `n` lookups; removes the inode at zero (never the root) and
  // returns it then (else null).
  std::shared_ptr<Inode> Forget(uint64_t ino, uint64_t n);

  size_t size() const;
  uint64_t LookupCount(uint64_t ino) const;  // for tests

 private:
  mutable Mutex mu_;
  std::unordered_map<uint64_t, std::shared_ptr<Inode>> by_ino_ GUARDED_BY(mu_);
  std::unordered_map<std::string, uint64_t> by_fh_ GUARDED_BY(mu_);
  uint64_t next_ino_ GUARDED_BY(mu_) = kRootIno + 1;
};

}  // namespace mpnfs::fs
