// WriteOrder: the rule that a later overlapping WRITE never overtakes an
// earlier one, for one file.
//
// NFS servers run requests on many threads, and mpnfs sends a file's WRITEs
// over several connections, so two WRITEs in flight may execute in either
// order. The Linux client never has two WRITEs of the same page in flight (a
// page under writeback is waited for before it is written again); this is
// the same rule on byte ranges. Every WRITE the filesystem sends for a file
// (write-behind, synchronous and O_DIRECT writes, the pieces of a split
// write, resends after a verifier change) is admitted here first, in the
// order the application's writes were accepted. A write that overlaps an
// earlier one still unanswered waits; the others go at once. Writes that do
// not overlap keep their full parallelism.
//
// Each admitted write has a sequence number (`Seq`), increasing in admission
// order; the filesystem also tags its kept UNSTABLE data with it, so that a
// resend after a verifier change can tell which bytes newer writes own.
//
// Not thread safe: the owner guards it with its own lock (FileWrites::mu) and
// runs the returned start functions after releasing that lock. Admission
// under the same lock that decides the order of writes is what makes the
// order the application's.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <utility>
#include <vector>

namespace mpnfs::fs {

class WriteOrder {
 public:
  using Seq = uint64_t;
  using Start = std::function<void(Seq)>;

  // Admits a write of [off, off+len) with the next sequence number, which is
  // returned in `*seq`. If no earlier unfinished write overlaps it, returns
  // true and the caller calls start(*seq) now (`start` is dropped);
  // otherwise keeps `start` to hand back from the Finish() that frees it,
  // and returns false.
  bool Admit(uint64_t off, uint64_t len, Start start, Seq* seq);
  // A truncate to `off`: it covers [off, end of file) until Finish(), so
  // writes and resends past the new size wait for it, and it waits for them.
  bool AdmitTail(uint64_t off, Start start, Seq* seq);
  // A sequence number with no entry (a write that needs no ordering here,
  // e.g. the SSD cache flusher's, recorded elsewhere as newer data).
  Seq Reserve() { return next_seq_++; }
  // The write `seq` was answered (or failed for good). Returns, in admission
  // order, the writes it was the last to block, their sequence numbers bound.
  std::vector<std::function<void()>> Finish(Seq seq);

  // Whether an unfinished write (started or waiting; not a truncate)
  // overlaps [off, off+len).
  bool WriteOverlaps(uint64_t off, uint64_t len) const;
  bool empty() const { return by_seq_.empty(); }
  size_t size() const { return by_seq_.size(); }
  Seq last_seq() const { return next_seq_ - 1; }
  // Waiting (not yet started) writes: for tests.
  size_t waiting() const;

 private:
  struct Entry {
    uint64_t off = 0, end = 0;
    bool tail = false;            // a truncate: end is infinity
    int blockers = 0;             // earlier unfinished writes overlapping this one
    std::vector<Seq> dependents;  // later writes this one blocks
    Start start;                  // set while waiting
  };
  // Every write whose range could overlap [off, end): start offsets within
  // max_len_ below `end`.
  template <class Fn>
  void Overlapping(uint64_t off, uint64_t end, Fn fn) const;
  bool AdmitEntry(uint64_t off, uint64_t end, bool tail, Start start, Seq* seq);

  std::map<Seq, Entry> by_seq_;
  std::multimap<uint64_t, Seq> by_off_;  // start offset -> seq (not tails)
  std::vector<Seq> tails_;               // truncates: [off, infinity)
  uint64_t max_len_ = 0;                 // longest write admitted since the table was last empty
  Seq next_seq_ = 1;
};

// [off, off+len) minus every range in `holes` (offset, length): the pieces
// left, in offset order.
std::vector<std::pair<uint64_t, uint64_t>> SubtractRanges(
    uint64_t off, uint64_t len, std::vector<std::pair<uint64_t, uint64_t>> holes);

}  // namespace mpnfs::fs
