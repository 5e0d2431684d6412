#include "fs/file_writes.h"

#include <algorithm>

namespace mpnfs::fs {

FileWrites::Run FileWrites::Finish(WriteOrder::Seq seq) {
  Run run = order_.Finish(seq);
  PruneResendLogs();
  return run;
}

void FileWrites::PruneResendLogs() {
  if (!MayResend()) {
    truncations_.clear();
    newer_log_.clear();
  }
}

void FileWrites::Keep(BufferedP b) {
  uncommitted_bytes_ += b->len;
  uncommitted_.push_back(std::move(b));
}

void FileWrites::Durable(WriteOrder::Seq seq, uint64_t off, uint64_t len) {
  // (The order entry is still the write's, so MayResend counts it.)
  if (MayResend()) newer_log_.push_back(Newer{seq, off, len});
}

bool FileWrites::Foreign(uint64_t off, uint64_t len) {
  if (order_.WriteOverlaps(off, len)) return false;
  if (MayResend()) newer_log_.push_back(Newer{order_.Reserve(), off, len});
  return true;
}

void FileWrites::Truncated(WriteOrder::Seq tseq, uint64_t size) {
  size_hwm_ = 0;
  if (MayResend()) truncations_.emplace_back(tseq, size);
}

FileWrites::Begin FileWrites::BeginCommit(std::function<void(Result<Ok>)>* cb,
                                          std::vector<BufferedP>* kept) {
  if (commit_running_) {
    commit_waiters_.push_back(std::move(*cb));
    return Begin::kQueued;
  }
  if (uncommitted_.empty()) return Begin::kNothingKept;
  commit_running_ = true;
  kept->swap(uncommitted_);
  uncommitted_bytes_ = 0;
  return Begin::kStarted;
}

void FileWrites::CommitFailed(const std::vector<BufferedP>& kept) {
  for (const auto& b : kept) uncommitted_bytes_ += b->len;
  uncommitted_.insert(uncommitted_.begin(), kept.begin(), kept.end());
}

std::vector<FileWrites::BufferedP> FileWrites::Lost(const std::vector<BufferedP>& kept,
                                                    const nfs::CommitReply& commit) {
  std::vector<BufferedP> lost;
  for (const auto& b : kept) {
    if (!nfs::CommitCovers(b->verf, commit)) lost.push_back(b);
  }
  std::sort(lost.begin(), lost.end(), [](const auto& x, const auto& y) { return x->seq < y->seq; });
  return lost;
}

std::vector<FileWrites::Piece> FileWrites::ResendPieces(const std::vector<BufferedP>& kept,
                                                        const BufferedP& b) {
  std::vector<std::pair<uint64_t, uint64_t>> holes;
  auto newer = [&](const std::vector<BufferedP>& list) {
    for (const auto& o : list) {
      if (o->seq > b->seq) holes.emplace_back(o->off, o->len);
    }
  };
  newer(kept);
  newer(uncommitted_);
  for (const auto& [tseq, size] : truncations_) {
    if (tseq > b->seq) holes.emplace_back(size, UINT64_MAX - size);
  }
  for (const auto& n : newer_log_) {
    if (n.seq > b->seq) holes.emplace_back(n.off, n.len);
  }
  std::vector<Piece> pieces;
  for (const auto& [off, len] : SubtractRanges(b->off, b->len, std::move(holes))) {
    pieces.push_back(Piece{b, off, len});
  }
  return pieces;
}

std::vector<std::function<void(Result<Ok>)>> FileWrites::EndCommit() {
  std::vector<std::function<void(Result<Ok>)>> waiters;
  waiters.swap(commit_waiters_);
  commit_running_ = false;
  PruneResendLogs();
  return waiters;
}

void FileWrites::WriteEnded(uint64_t done_seq, size_t behind_size, uint64_t window, Run* run) {
  writes_inflight_--;
  last_write_done_seq_ = done_seq;
  if (behind_size > 0) {
    behind_bytes_ -= behind_size;
    // Admit parked writes that now fit the window, in their order.
    while (!parked_.empty() &&
           (behind_bytes_ == 0 || behind_bytes_ + parked_.front().bytes <= window)) {
      behind_bytes_ += parked_.front().bytes;
      parked_.front().admit(run);
      parked_.pop_front();
    }
  }
  if (!BehindPending()) {
    for (auto& w : drain_waiters_) run->push_back(std::move(w));
    drain_waiters_.clear();
  }
}

bool FileWrites::WhenDrained(std::function<void()>& fn) {
  if (!BehindPending()) return false;
  drain_waiters_.push_back(std::move(fn));
  return true;
}

void FileWrites::RecordError(const Error& e) {
  err_seq_++;
  last_error_ = e;
  behind_refused_ = true;
}

std::optional<Error> FileWrites::TakeError(uint64_t* seen) {
  if (*seen == err_seq_) return std::nullopt;
  *seen = err_seq_;
  return last_error_;
}

bool FileWrites::DoubtedSinceOpen() {
  const bool doubted = err_seq_ != open_err_seq_ || page_doubts_ != open_page_doubts_;
  open_err_seq_ = err_seq_;
  open_page_doubts_ = page_doubts_;
  return doubted;
}

void FileWrites::Settled(uint64_t sent_seq) {
  if (writes_inflight_ == 0 && sent_seq > last_write_done_seq_ && uncommitted_.empty() && !commit_running_) {
    size_hwm_ = 0;
  }
}

}  // namespace mpnfs::fs
