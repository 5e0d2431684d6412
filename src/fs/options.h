// FsOptions: the NFS semantics knobs of the filesystem layer.
#pragma once

#include <cstdint>

namespace mpnfs::fs {

struct FsOptions {
  // Attribute cache timeouts in seconds (Linux nfs(5) semantics): a file's
  // timeout starts at the min, doubles while its attributes stay unchanged,
  // and returns to the min when they change.
  double acregmin = 3, acregmax = 60, acdirmin = 30, acdirmax = 60;
  bool cto = true;          // close-to-open: revalidate on open, commit on close
  // Which name lookups the kernel may answer from its dentry cache, for
  // acdirmin (nfs(5) lookupcache=): all (found and not found), positive
  // (found only: a name another client creates is seen at once) or none
  // (every lookup asks the server: renames and removals by other clients
  // too).
  enum class LookupCache { kAll, kPositive, kNone };
  LookupCache lookupcache = LookupCache::kAll;
  // The export's file data changes only through this mount: the kernel keeps
  // a file's cached pages across opens and attribute changes (the FUSE front
  // end then asks for explicit invalidation, and Open() keeps the cache).
  bool kernel_cache = false;
  bool direct_io = false;   // every data file bypasses the kernel page cache
  bool sync = false;        // FILE_SYNC writes (no COMMIT needed)
  uint32_t rsize = 1 << 20; // upper bounds; the server's FSINFO may lower them
  uint32_t wsize = 1 << 20;
  uint32_t dtpref = 65536;
  uint32_t name_max = 255;
  // Uncommitted data per file that triggers a background COMMIT.
  uint64_t commit_threshold = 64ull << 20;
  // Write-behind window per file for page-cache (non-O_DIRECT) opens; 0: off.
  uint64_t write_behind = 64ull << 20;
};

}  // namespace mpnfs::fs
