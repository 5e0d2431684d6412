// The write-back ownership record: a small file, `.mpnfs-owner`, in the
// export's root directory, naming the host and the cache directory whose
// write-back cache may hold data the server does not have yet.
//
// A write-back mount writes it (FILE_SYNC) before it serves anything and
// removes it at an unmount (or online detach) that left nothing dirty. Any
// mount that finds a record naming another cache refuses to start: a
// second gateway, or this one without its cache, would serve data older
// than what that cache holds (mpnfs(8), "Write-back").
//
// Thread safety: the functions block on NFS calls; never call them from an
// engine loop thread.
#pragma once

#include <optional>
#include <string>

#include "mpnfs/result.h"
#include "nfs/client.h"

namespace mpnfs::fs {

inline constexpr char kOwnerName[] = ".mpnfs-owner";

struct OwnerRecord {
  std::string host, cache_dir, cache_id;
  std::string text;  // the whole file
};

// The record in `root`, or nullopt if there is none.
Result<std::optional<OwnerRecord>> ReadOwner(nfs::Client& nfs, const nfs::Fh& root);
// Writes the record for this host and the cache (`id` from BlockCache::id()).
Result<Ok> ClaimOwner(nfs::Client& nfs, const nfs::Fh& root, const std::string& cache_dir,
                      const std::string& id);
Result<Ok> ReleaseOwner(nfs::Client& nfs, const nfs::Fh& root);
// Why a mount must not go on while `r` exists.
std::string OwnerRefusal(const OwnerRecord& r, const std::string& export_name);

}  // namespace mpnfs::fs
