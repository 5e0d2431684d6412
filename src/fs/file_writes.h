// FileWrites: the state of one file's writes to the NFS server, and the
// rules that read and change it, each here once.
//
// What it holds:
// - the write order (fs/write_order.h): every WRITE, resend and truncate of
//   the file takes a place in it, so a later overlapping one never
//   overtakes an earlier one;
// - the UNSTABLE writes kept until a COMMIT answers with the verifier their
//   WRITE did (Buffered), and the COMMIT round, one at a time;
// - what a resend after a verifier change must not write over: truncates
//   answered since (the truncate log) and newer data no kept list holds
//   (the newer-write log: FILE_SYNC answers and the SSD cache flusher's
//   writes);
// - the write-behind window (bytes acknowledged to the application and not
//   yet answered, writes parked for room) and those waiting for it to drain;
// - error reporting: the errseq of write-behind failures, the refusal of
//   write-behind after one, and the page doubts (events after which the
//   kernel's pages of the file may not be the server's data);
// - the size high-water mark of this client's writes.
//
// The sending (NFS calls, the SSD cache's bookkeeping of them) is the
// filesystem's (fs/write.cc); it asks this object what to send, in what
// order, and tells it what came back.
//
// Threads and locks: `mu` guards everything here; every method but the
// constructor and Lost() requires it. Lock order: the same inode's
// Inode::mu before FileWrites::mu (common/mutex.h has the whole order).
// Callbacks handed in (`start` of an admitted write, drain and commit
// waiters) are never called here: they are handed back to be run after
// unlocking. A parked write's admission is the exception: WriteEnded calls
// it under `mu`, by contract (it admits the write in the order and appends
// what to run afterwards, and takes only leaf locks).
//
// Durability: nothing here is durable; a kept write lives in memory until
// a COMMIT with its verifier covers it.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "engine/cred.h"
#include "fs/write_order.h"
#include "mpnfs/result.h"
#include "nfs/types.h"

namespace mpnfs::fs {

// A kept UNSTABLE write: its data is sent again if the server's write
// verifier changes before a COMMIT covers it.
struct Buffered {
  uint64_t off;
  nfs::Buffer buf;
  size_t buf_off;
  size_t len;
  uint64_t verf;
  WriteOrder::Seq seq;  // its place in the file's write order
  engine::Cred cred;    // who wrote it: COMMIT and resends go as that user
};

class FileWrites {
 public:
  using BufferedP = std::shared_ptr<Buffered>;
  using Run = std::vector<std::function<void()>>;

  FileWrites() = default;
  FileWrites(const FileWrites&) = delete;
  FileWrites& operator=(const FileWrites&) = delete;

  mutable Mutex mu;

  // --- the write order
  bool Admit(uint64_t off, uint64_t len, WriteOrder::Start start, WriteOrder::Seq* seq)
      REQUIRES(mu) {
    return order_.Admit(off, len, std::move(start), seq);
  }
  bool AdmitTail(uint64_t size, WriteOrder::Start start, WriteOrder::Seq* seq) REQUIRES(mu) {
    return order_.AdmitTail(size, std::move(start), seq);
  }
  // Ends `seq`'s place; returns the admitted calls that may start now.
  Run Finish(WriteOrder::Seq seq) REQUIRES(mu);

  // --- answers
  // A WRITE answered UNSTABLE: kept until a COMMIT with its verifier.
  void Keep(BufferedP b) REQUIRES(mu);
  // A WRITE of `seq` answered FILE_SYNC: durable, and newer than anything
  // kept before it, so no resend may write over it.
  void Durable(WriteOrder::Seq seq, uint64_t off, uint64_t len) REQUIRES(mu);
  // A write outside this order (the SSD cache flusher's) would be sent now.
  // False if a write of this order (a write, a resend; not a truncate)
  // overlapping it is on its way or waiting: the two could land in either
  // order, and an older one land last, so it must wait for a later round
  // (the flusher's pages stay dirty). This cannot close a cycle because no
  // place in the order waits for the flusher: a truncate that must flush
  // gives its place up first (Filesystem::SendSetattr). Else records it as
  // newer data (no resend may write older data over it) and true.
  bool Foreign(uint64_t off, uint64_t len) REQUIRES(mu);
  // A truncate (its place `tseq`) was answered: a resend never writes data
  // older than it past `size`; sizes from before it no longer count.
  void Truncated(WriteOrder::Seq tseq, uint64_t size) REQUIRES(mu);

  // --- COMMIT rounds (one at a time: a resend after a verifier change
  // must know every newer write)
  // Starts a round: false if none is needed (nothing kept: `cb` is handed
  // back to be called) or one runs (`cb` waits for the next round: taken).
  // True: `*kept` are this round's writes.
  enum class Begin { kNothingKept, kQueued, kStarted };
  Begin BeginCommit(std::function<void(Result<Ok>)>* cb, std::vector<BufferedP>* kept) REQUIRES(mu);
  // The COMMIT failed: its writes are kept again (before newer ones).
  void CommitFailed(const std::vector<BufferedP>& kept) REQUIRES(mu);
  // The kept writes the server lost (not covered by the COMMIT's answer:
  // nfs::CommitCovers), oldest first.
  static std::vector<BufferedP> Lost(const std::vector<BufferedP>& kept, const nfs::CommitReply& commit);
  // A part of a lost write to send again, FILE_SYNC.
  struct Piece {
    BufferedP b;
    uint64_t off, len;
  };
  // What of the lost write `b` (from the round's `kept`) to send again,
  // asked when its resend's place in the write order (its whole range) is
  // reached: every write admitted before it that overlaps has been
  // answered. All but the bytes that newer writes hold (newer kept data,
  // of the round or answered since; newer data answered FILE_SYNC or the
  // flusher's) and those a later truncate cut. Only answered writes count:
  // a newer write that failed leaves its bytes to the older data, and one
  // admitted after the resend waits for it and lands after it.
  std::vector<Piece> ResendPieces(const std::vector<BufferedP>& kept, const BufferedP& b) REQUIRES(mu);
  // The round ended: returns those who came during it (they need a round
  // of their own, which covers every write answered before it starts).
  std::vector<std::function<void(Result<Ok>)>> EndCommit() REQUIRES(mu);
  bool HasKept() const REQUIRES(mu) { return !uncommitted_.empty(); }
  // Kept bytes past `threshold` and no round running: a COMMIT is due.
  bool CommitDue(uint64_t threshold) const REQUIRES(mu) {
    return !commit_running_ && uncommitted_bytes_ >= threshold;
  }
  // Nothing written or kept yet, and no round: a small new file's first
  // write may go FILE_SYNC (filesystem.h, "Small new files").
  bool Untouched() const REQUIRES(mu) {
    return order_.empty() && uncommitted_.empty() && !commit_running_;
  }

  // --- write-behind
  // Whether a write of `size` bytes written behind must park: others are
  // parked, or it does not fit the window (`window` bytes; an empty window
  // takes any one write).
  bool MustPark(size_t size, uint64_t window) const REQUIRES(mu) {
    return !parked_.empty() || (behind_bytes_ > 0 && behind_bytes_ + size > window);
  }
  // Called under mu, in order, when the window has room: admits the write
  // and appends what to run after unlocking.
  using Admission = std::function<void(Run*)>;
  void Park(size_t size, Admission admit) REQUIRES(mu) { parked_.push_back(Parked{size, std::move(admit)}); }
  // A write of `size` bytes is written behind (acknowledged now).
  void Behind(size_t size) REQUIRES(mu) { behind_bytes_ += size; }
  bool HasParked() const REQUIRES(mu) { return !parked_.empty(); }
  bool BehindPending() const REQUIRES(mu) { return behind_bytes_ > 0 || !parked_.empty(); }
  // A write's calls went out (counted until WriteEnded).
  void WriteStarted() REQUIRES(mu) { ++writes_inflight_; }
  // A write ended (`done_seq`: the filesystem's sequence number now). If it
  // was written behind (`behind_size` > 0), its bytes leave the window and
  // parked writes that now fit are admitted, in order; once nothing is
  // pending, the drain waiters are appended to `run`.
  void WriteEnded(uint64_t done_seq, size_t behind_size, uint64_t window, Run* run) REQUIRES(mu);
  // Queues `fn` until no write-behind is pending; false (not queued) if
  // none is.
  bool WhenDrained(std::function<void()>& fn) REQUIRES(mu);

  // --- errors (as the kernel's errseq: each open file remembers the count
  // it has seen, learns each error once, and an open made after an error
  // never sees it)
  // A write-behind failure, or data a failed resend lost: every open file
  // learns it once, and the file's writes stop being written behind.
  void RecordError(const Error& e) REQUIRES(mu);
  uint64_t err_seq() const REQUIRES(mu) { return err_seq_; }
  // The error `*seen` has not reported, if any (now it has).
  std::optional<Error> TakeError(uint64_t* seen) REQUIRES(mu);
  // After a write-behind failure, writes wait for the server (each returns
  // its own error) until a sync through an open with nothing left to report
  // commits (Resume).
  bool Refused() const REQUIRES(mu) { return behind_refused_; }
  void Refuse() REQUIRES(mu) { behind_refused_ = true; }
  void Resume() REQUIRES(mu) { behind_refused_ = false; }
  // An event after which the kernel's pages may not be the server's data:
  // an uncached write (counted when it starts and when it ends), a write
  // the SSD cache disk lost, a refused write.
  void Doubt() REQUIRES(mu) { ++page_doubts_; }
  // Whether an error or a doubt came since the last open asked (the open's
  // pages must then be dropped whatever cto and kernel_cache say).
  bool DoubtedSinceOpen() REQUIRES(mu);

  // --- sizes
  // The end of this client's writes: attributes from replies that may
  // predate a completed write never report a smaller size.
  uint64_t size_hwm() const REQUIRES(mu) { return size_hwm_; }
  void Wrote(uint64_t end) REQUIRES(mu) { size_hwm_ = std::max(size_hwm_, end); }
  // A GETATTR sent at `sent_seq` was answered: if every write of ours had
  // completed before it was sent and nothing kept may still be resent (a
  // server restart may have taken it from the server's size for now), its
  // size is authoritative and the mark goes.
  void Settled(uint64_t sent_seq) REQUIRES(mu);

  // For tests: the resend logs are empty (nothing can be resent).
  bool ResendLogsEmpty() const REQUIRES(mu) { return truncations_.empty() && newer_log_.empty(); }

 private:
  // Whether a resend could still happen (kept data, a round, writes out).
  bool MayResend() const REQUIRES(mu) { return !uncommitted_.empty() || commit_running_ || !order_.empty(); }
  // Once no resend can happen, the logs only resends read are emptied.
  void PruneResendLogs() REQUIRES(mu);

  WriteOrder order_ GUARDED_BY(mu);
  std::vector<BufferedP> uncommitted_ GUARDED_BY(mu);
  uint64_t uncommitted_bytes_ GUARDED_BY(mu) = 0;
  bool commit_running_ GUARDED_BY(mu) = false;
  std::vector<std::function<void(Result<Ok>)>> commit_waiters_ GUARDED_BY(mu);
  // Successful truncates since the kept data was last empty: (the
  // truncate's place, new size).
  std::vector<std::pair<WriteOrder::Seq, uint64_t>> truncations_ GUARDED_BY(mu);
  struct Newer {
    WriteOrder::Seq seq;
    uint64_t off, len;
  };
  std::vector<Newer> newer_log_ GUARDED_BY(mu);

  struct Parked {
    size_t bytes;
    Admission admit;
  };
  uint64_t behind_bytes_ GUARDED_BY(mu) = 0;
  // (A list, not a deque: an empty std::deque allocates ~600 bytes, and
  // every inode the kernel knows has one of these.)
  std::list<Parked> parked_ GUARDED_BY(mu);
  std::vector<std::function<void()>> drain_waiters_ GUARDED_BY(mu);
  int writes_inflight_ GUARDED_BY(mu) = 0;
  uint64_t last_write_done_seq_ GUARDED_BY(mu) = 0;

  uint64_t err_seq_ GUARDED_BY(mu) = 0;
  std::optional<Error> last_error_ GUARDED_BY(mu);
  bool behind_refused_ GUARDED_BY(mu) = false;
  uint64_t page_doubts_ GUARDED_BY(mu) = 0;
  uint64_t open_err_seq_ GUARDED_BY(mu) = 0;
  uint64_t open_page_doubts_ GUARDED_BY(mu) = 0;

  uint64_t size_hwm_ GUARDED_BY(mu) = 0;
};

}  // namespace mpnfs::fs
