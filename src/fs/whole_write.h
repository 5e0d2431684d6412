// WholeWrite: one range written to the NFS server by WRITE calls until all
// of it is written, with the SSD cache told of each call. The one place
// that says what a WRITE's answer means; the filesystem's writes
// (fs/write.cc) and the write-back cache's flusher (fs/flusher.cc) both
// send through it.
//
// Rules:
// - A short count is no error: the rest is sent at once, from where the
//   server stopped (RFC 1813: a server may write less than asked), as the
//   same write (the caller's place in its file's write order holds for
//   all of it).
// - A count of 0 for a non-empty range is EIO ("server wrote nothing"):
//   sending again would loop.
// - Each call's answer goes to the SSD cache (BlockCache::WriteDone, with
//   the WCC versions; `admit`: a whole answer may store the data), also
//   when it failed.
// - `answered` sees each answered part (its reply, offset and length), in
//   order, before the next part is sent; a part answered UNSTABLE carries
//   its own verifier, which a later COMMIT must match for that part.
//
// Threads: `answered` and `done` run on the engine's completion thread, or
// inline on the caller's for an error found before sending (with whatever
// lock the caller holds: the flusher sends under its send lock).
#pragma once

#include <functional>
#include <memory>

#include "cache/block_cache.h"
#include "engine/cred.h"
#include "mpnfs/result.h"
#include "nfs/client.h"

namespace mpnfs::fs {

struct WholeWrite {
  nfs::Fh fh;
  uint64_t off = 0;
  nfs::Buffer data;
  size_t buf_off = 0;
  size_t len = 0;
  bool stable = false;  // FILE_SYNC
  engine::Cred cred;
  std::shared_ptr<cache::BlockCache> cache;  // may be null
  // The cache drops what it holds of the range before the call (the
  // flusher's writes carry what the cache holds: false), and may store a
  // whole answer's data (writethrough, not a scan).
  bool invalidate = true;
  bool admit = false;
};

void SendWholeWrite(nfs::Client& nfs, WholeWrite w,
                    std::function<void(const nfs::WriteReply&, uint64_t off, size_t n)> answered,
                    std::function<void(Result<Ok>)> done);

}  // namespace mpnfs::fs
