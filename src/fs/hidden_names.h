// HiddenNames: the hidden names ("silly renames") of files removed while
// open, from the close that may be their last until their REMOVE is
// answered, so that a listing or an rmdir right after that close does not
// find them.
//
// Why. The kernel NFS client removes its ".nfs" name before the last close
// returns. FUSE cannot: close(2) waits for FLUSH, but RELEASE (the last
// close, where the hidden name is removed) is sent in the background after
// it, and is served by another thread than the next request. So a FLUSH of
// a hidden file's only open marks it closing here; RELEASE marks it
// removing; the answer to its REMOVE (or its failure) ends it. A listing
// of the directory, or an rmdir, waits first (Settle) until no removal
// there is in progress and no close younger than `grace` awaits its
// RELEASE. A close that was not the last (the descriptor was duplicated or
// inherited) holds nobody up for longer than `grace`.
//
// Thread safety: all methods are thread safe. Settle() blocks the calling
// thread (a FUSE worker, never an engine event loop). Its lock is a leaf:
// the filesystem calls in while it holds an Inode::mu (the program's lock
// order: common/mutex.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "common/mutex.h"
#include "common/thread_annotations.h"

namespace mpnfs::fs {

class HiddenNames {
 public:
  using Clock = std::chrono::steady_clock;
  // `grace`: how long a close waits for a RELEASE; `limit`: the longest a
  // Settle() waits for removals (a server that does not answer).
  explicit HiddenNames(Clock::duration grace = std::chrono::milliseconds(300),
                       Clock::duration limit = std::chrono::seconds(10))
      : grace_(grace), limit_(limit) {}

  // The only open of file `ino`, hidden in directory `dir`, was flushed.
  void Closing(const std::string& dir, uint64_t ino);
  // Its last close: the hidden name's REMOVE is on its way.
  void Removing(const std::string& dir, uint64_t ino);
  // Its REMOVE was answered (or failed).
  void Done(const std::string& dir, uint64_t ino);
  // The last close of `ino` came with no hidden name to remove (a failed
  // rename gave the file its name back): whatever it left here goes.
  void Released(uint64_t ino);
  // Returns once nothing in `dir` ("" for every directory) is closing
  // within `grace` or being removed, or after `limit`.
  void Settle(const std::string& dir);
  // Entries for tests.
  size_t size() const;

 private:
  struct State {
    bool removing = false;
    Clock::time_point since;
  };
  // Whether something in `dir` holds a listing up at `now`; the earliest
  // time a closing entry stops doing so in `*until`.
  bool Busy(const std::string& dir, Clock::time_point now, Clock::time_point* until) const
      REQUIRES(mu_);

  const Clock::duration grace_, limit_;
  mutable Mutex mu_;
  CondVar cv_;
  std::map<std::pair<std::string, uint64_t>, State> names_ GUARDED_BY(mu_);
};

}  // namespace mpnfs::fs
