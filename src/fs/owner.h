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
// The claim is atomic: the record is made by an EXCLUSIVE CREATE, which the
// server performs only if the name does not exist, so of two gateways
// claiming at once exactly one makes it and the other finds the winner's
// record (perhaps still empty) and refuses. The create's verifier is
// derived from the cache's id: a CREATE of this cache that the engine
// resent, or a claim interrupted by a crash before the content was
// written, gets the same file back (RFC 1813 EXCLUSIVE semantics), and a
// record that names this cache is this cache's own and is taken over.
// Order: CREATE, mode, content (FILE_SYNC), then size and times (which
// replace the verifier the server kept there).
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
  std::string host, cache_dir, cache_id;  // empty in a record not written yet
  std::string text;  // the whole file
  nfs::Fh fh;
};

// The record in `root`, or nullopt if there is none.
Result<std::optional<OwnerRecord>> ReadOwner(nfs::Client& nfs, const nfs::Fh& root);
// Claims the export for this host and the cache `id` (BlockCache::id()),
// atomically (see above). nullopt: the record names this cache now. Else
// the record of the cache that holds the export (refuse: OwnerRefusal).
Result<std::optional<OwnerRecord>> ClaimOwner(nfs::Client& nfs, const nfs::Fh& root,
                                              const std::string& cache_dir, const std::string& id);
// The EXCLUSIVE CREATE verifier of the cache `id`'s claims from this host.
uint64_t OwnerVerifier(const std::string& id);
// Removes the record if it is the cache `id`'s from this host; a record
// that another cache (or this id on another host) holds by now is left in
// place and reported (EPERM). There is no conditional REMOVE in NFSv3: a
// claim made between our look and our REMOVE is not seen (the window is one
// round trip, at detach or unmount only).
Result<Ok> ReleaseOwner(nfs::Client& nfs, const nfs::Fh& root, const std::string& id);
// Why a mount must not go on while `r` exists.
std::string OwnerRefusal(const OwnerRecord& r, const std::string& export_name);

}  // namespace mpnfs::fs
