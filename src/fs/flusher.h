// Flusher: writes the SSD cache's dirty pages (cache_mode=writeback) to the
// NFS server, on its own thread.
//
// When. In the background: once dirty blocks pass dirty_high % of the cache
// it flushes until they are under dirty_low %, and it flushes any block
// dirty for dirty_age seconds (requests that keep coming do not starve
// these rounds: one runs between requests at least every 200 ms). On request: Flush() for one file (fsync with
// wb_fsync=server, a truncate, a write that must go around the cache) or
// for all (mpnfsctl cache flush, detach, unmount, the start-up recovery).
//
// How. A round takes dirty runs in file-offset order (BlockCache::
// CollectDirty), joins neighbours into WRITE calls of up to wsize, sends
// them UNSTABLE as the user who wrote them (uid, gid and groups are kept
// with the pages), then COMMITs each file. A run becomes clean only if the
// COMMIT covers what its WRITE returned (nfs::CommitCovers): a server that
// restarted in between may have lost it, and it is written again at once,
// FILE_SYNC (a server that answers that UNSTABLE leaves it dirty, for the
// next round). Rounds flushing by age carry at
// most 1 MiB, rounds above the high watermark 8 MiB, so the application's
// calls are not queued behind a long flush on a slow path.
//
// Gone files. A file the server no longer has cannot be written: nobody can
// read its dirty pages, which are dropped, with a warning. A WRITE or COMMIT
// answered ESTALE is not enough to say so: the server is asked (GoneCheck:
// the handle stale to each user whose writes wait, between two answers of
// the export's root). A server that answers ESTALE for everything while its
// exports load or during a failover has not lost the file: the writes are
// kept and the round fails (EIO; background: retried in 1 s). A file that
// itself still answers although its WRITE got ESTALE is kept too, but alone:
// background rounds leave it out for 1 s, doubling up to 30 s while it stays
// so, and a flush request goes on with the other files and then fails with
// EIO. Of a file written to while the server was asked, only what was
// asked about goes; the newer writes are asked about at its next round.
//
// Interrupt. A flush to a server that has gone away waits for it on a hard
// mount, for ever. Interrupt() (SIGTERM during the flush at unmount) makes
// the flusher give up: the round in progress is abandoned (its calls end
// when the engine stops, and change nothing in the cache but the fill
// bookkeeping of WriteDone), nothing more is sent, and flush requests fail
// with EINTR. The dirty pages stay dirty, for the next mount to flush.
//
// Thread safety: all public methods are thread safe.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "cache/block_cache.h"
#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "fs/gone_check.h"
#include "mpnfs/result.h"
#include "nfs/client.h"

namespace mpnfs::fs {

class Flusher {
 public:
  // Asked before each WRITE is sent (file handle, offset, length), under
  // the flusher's send lock: false if a write of the filesystem's own that
  // overlaps it is on its way (a resend after a server restart, a write
  // around the cache): the WRITE is not sent this round, its pages stay
  // dirty and the flush goes round again (fs/file_writes.h, Foreign). True:
  // the filesystem has recorded it as newer than any kept write of that
  // file, so that a resend never writes older data over it.
  using WriteHook = std::function<bool(const std::string&, uint64_t, uint64_t)>;
  // `root`: the export's root handle (asked before dropping a gone file's
  // writes).
  Flusher(nfs::Client& nfs, std::shared_ptr<cache::BlockCache> cache, uint32_t wsize,
          nfs::Fh root, WriteHook before_write = nullptr);
  // Stops the thread; flushes nothing more (see Flush for that).
  ~Flusher();
  Flusher(const Flusher&) = delete;
  Flusher& operator=(const Flusher&) = delete;

  // Writes every dirty page (only `fh`'s, if not empty) to the server;
  // `done` runs on the flusher thread once they are clean there, or with
  // the error that stopped it. A file with stale claims in a broken index
  // (BlockCache::StaleClaims) makes it flush every file, for the index to
  // be emptied, and fail (EIO) if it cannot be.
  void Flush(const std::string& fh, std::function<void(Result<Ok>)> done);
  // Flush("") and wait.
  Result<Ok> FlushAll();
  // Stops flushing for good (see above). On return the flusher sends
  // nothing more; a FlushAll() waiting returns EINTR.
  void Interrupt();

 private:
  struct RoundState;
  struct Request {
    std::string fh;
    std::function<void(Result<Ok>)> done;
  };
  void Main();
  // Files whose writes a round kept although a WRITE or COMMIT was answered
  // ESTALE (GoneCheck did not confirm the file gone), each with the error.
  using Kept = std::map<std::string, Error>;
  // One round over at most `max_bytes`, leaving out the files in `skip`;
  // the bytes made clean (or dropped: their file is gone), 0 if nothing
  // matched or none were. `*pending` says whether anything matched at all;
  // files kept are added to `*kept` (not an error of the round), and the
  // files it sent to `*files_sent` (if given).
  // `*deferred` (if given): a WRITE was held back by the hook.
  Result<uint64_t> Round(const std::string& fh, uint64_t max_bytes,
                         std::chrono::steady_clock::time_point older_than, bool* pending,
                         const std::set<std::string>& skip, Kept* kept,
                         std::set<std::string>* files_sent = nullptr, bool* deferred = nullptr);
  Result<Ok> Drain(const std::string& fh);

  nfs::Client& nfs_;
  const std::shared_ptr<cache::BlockCache> cache_;
  const uint32_t wsize_;
  const WriteHook before_write_;
  GoneCheck gone_;
  Mutex mu_;
  CondVar cv_;
  std::deque<Request> requests_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  // Calls are sent under send_mu_, only while not interrupted_; round_ is
  // the round waiting for its calls (Interrupt() wakes it). send_mu_ comes
  // before the locks sending takes (common/mutex.h).
  Mutex send_mu_;
  std::atomic<bool> interrupted_{false};
  std::shared_ptr<RoundState> round_ GUARDED_BY(send_mu_);
  // Background rounds (the flusher thread only): kept files left out until
  // `until`.
  struct Backoff {
    std::chrono::steady_clock::time_point until;
    int tries = 0;
  };
  std::map<std::string, Backoff> backoff_;
  std::thread thread_;
};

}  // namespace mpnfs::fs
