// Gather: the completion count of one operation made of several NFS calls
// (a read or write split into rsize/wsize pieces, a batch of resends).
// Keeps the first error; the call whose Done() returns true finishes the
// whole operation. Thread safe.
#pragma once

#include <optional>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "mpnfs/result.h"

namespace mpnfs::fs {

class Gather {
 public:
  explicit Gather(size_t parts) : remaining_(parts) {}

  // Records one part's outcome; true for the part that completes the whole.
  template <class T>
  bool Done(const Result<T>& r) {
    MutexLock lock(mu_);
    if (!r && !err_) err_ = r.error();
    return --remaining_ == 0;
  }
  void AddParts(size_t n) {
    MutexLock lock(mu_);
    remaining_ += n;
  }
  // The first error; final once Done() returned true (no part is running
  // any more).
  std::optional<Error> error() const {
    MutexLock lock(mu_);
    return err_;
  }

 private:
  mutable Mutex mu_;  // a leaf
  size_t remaining_ GUARDED_BY(mu_);
  std::optional<Error> err_ GUARDED_BY(mu_);
};

}  // namespace mpnfs::fs
