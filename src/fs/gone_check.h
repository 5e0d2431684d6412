// GoneCheck: asks the server whether a file is gone for good, before the
// SSD cache's unflushed writes to it are dropped.
//
// A file's unflushed cached writes may be dropped only if nobody can ever
// read them: the server has lost the file (its handle is stale). The server
// is asked, and its answer is believed only when it holds up against the
// ways a live file can look stale:
//  - as each user whose writes wait, with their uid, gid and groups, as the
//    flusher sends them: a server may answer ESTALE to one user and not to
//    another (knfsd's subtree_check for a user, or root squashed, who cannot
//    search the file's directories). Every answer must be ESTALE;
//  - between two GETATTRs of the export's root, before and after, that both
//    succeed: a server answers ESTALE for every handle while its exports are
//    not loaded yet after a restart, or during a failover, and one that came
//    back between two answers would make a live file look gone.
// Anything else (the file answers, the root does not, any other error) is
// not "gone": the writes are kept. So is any ask after Cancel().
//
// Load. At most `max_in_flight` files are being asked about at once (each
// ask sends 2 + writers GETATTRs); the others queue, in order. A kernel
// dropping its whole inode cache forgets thousands of files at once.
//
// Thread safety: Ask may be called from any thread; `done` runs on the
// thread of the reply that decided (an engine event loop thread, or the
// caller's when nothing needs asking), without any lock of this class held.
// The state is shared with the calls in flight: destroying a GoneCheck with
// asks still in flight is safe (they finish; their `done` still runs), as
// long as the nfs::Client outlives them.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cache/block_cache.h"
#include "nfs/client.h"

namespace mpnfs::fs {

class GoneCheck {
 public:
  enum class Answer {
    kGone,      // stale to every writer, between two answers of the root
    kLive,      // the file answered, or failed otherwise than ESTALE
    kNoExport,  // the export's root did not answer: the server cannot tell
  };
  static constexpr size_t kDefaultMaxInFlight = 16;

  GoneCheck(nfs::Client& nfs, nfs::Fh root, size_t max_in_flight = kDefaultMaxInFlight);
  GoneCheck(const GoneCheck&) = delete;
  GoneCheck& operator=(const GoneCheck&) = delete;

  // `writers` must not be empty (the root is asked as the first).
  void Ask(const nfs::Fh& fh, std::vector<nfs::Cred> writers, std::function<void(Answer)> done);
  // The one rule for a file's unflushed cached writes when the file may be
  // gone (the flusher's WRITE answered ESTALE; this mount's last use of the
  // file ended): asks about `fh` as the users whose writes wait now, and if
  // it is gone and `may_drop` (if given) still allows it, drops those
  // writes, never sent (BlockCache::DropAsOf: writes made while the server
  // was asked stay, to be asked about at their flush). The question holds
  // the cache weakly (one detached meanwhile is not kept alive by it).
  // False, and `done` is not called, if no writes wait.
  struct Outcome {
    Answer answer;
    cache::BlockCache::DropResult dropped = cache::BlockCache::DropResult::kNothing;
  };
  bool AskToDrop(const std::shared_ptr<cache::BlockCache>& cache, const nfs::Fh& fh,
                 std::function<bool()> may_drop, std::function<void(Outcome)> done);
  // From now on nothing more is sent: asks in flight and queued, and new
  // ones, answer kLive (keep the writes) at their next step. For good.
  void Cancel();

 private:
  friend class GoneCheckSteps;
  struct State;
  std::shared_ptr<State> st_;
};

// The users whose writes wait (BlockCache::DirtyWriters), as they are asked.
std::vector<nfs::Cred> AsCreds(std::vector<cache::BlockCache::Writer> writers);

}  // namespace mpnfs::fs
