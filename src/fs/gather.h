// Gather: the completion count of one operation made of several NFS calls
// (a read or write split into rsize/wsize pieces, a batch of resends).
// Keeps the first error; the call whose Done() returns true finishes the
// whole operation. Thread safe.
#pragma once

#include <mutex>
#include <optional>

#include "common/thread_annotations.h"
#include "mpnfs/result.h"

namespace mpnfs::fs {

class Gather {
 public:
  explicit Gather(size_t parts) : remaining_(parts) {}

  // Records one part's outcome; true for the part that completes the whole.
  template <class T>
  bool Done(const Result<T>& r) {
    std::lock_guard lock(mu_);
    if (!r && !err_) err_ = r.error();
    return --remaining_ == 0;
  }
  void AddParts(size_t n) {
    std::lock_guard lock(mu_);
    remaining_ += n;
  }
  // REQUIRES: Done() returned true (no part is running any more).
  const std::optional<Error>& error() const NO_THREAD_SAFETY_ANALYSIS { return err_; }

 private:
  std::mutex mu_;
  size_t remaining_ GUARDED_BY(mu_);
  std::optional<Error> err_ GUARDED_BY(mu_);
};

}  // namespace mpnfs::fs
