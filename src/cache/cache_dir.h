// The cache directory (cache_dir=): whether it may be trusted, its lock, and
// how its files are opened.
//
// Why. The cache's files hold data that mpnfs later writes to the server as
// the users who wrote it, and mpnfs runs as root. A directory that another
// user can write to would let that user plant a symbolic or hard link where
// a cache file goes (mpnfs would then preallocate, truncate or overwrite
// the link's target) or forge dirty records. So a cache directory must be
// owned by the user running mpnfs and writable by no one else (group or
// other write permission is refused, sticky bit or not), and so must every
// directory above it, except that a sticky one (such as /tmp) may be
// writable by others as long as it is owned by root or by us: there, no one
// else can rename or remove our entries. Inside it, the cache's own files
// (kCacheFiles), where they exist, must be regular files owned by us with a
// single link, and every open goes through OpenCacheFile (O_NOFOLLOW, then
// the same checks on what was opened). A directory that passes the check
// cannot change under us afterwards: only its owner can write to it.
//
// One mount per directory. LockCacheDir takes an exclusive flock on
// `lock` in it, held for the life of the cache (closing the fd releases
// it, also when the process dies). A mount that finds it taken (typically
// the previous mount of the same directory, still flushing after its
// unmount returned) waits for it, up to a bound, saying once that it waits
// and for which process (the holder writes its pid into the lock file).
//
// Thread safety: the functions share no state; they block (LockCacheDir up
// to `wait`).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>

#include "mpnfs/result.h"

namespace mpnfs::cache {

// The names the cache keeps in its directory.
inline constexpr const char* kCacheFiles[] = {"lock", "data", "index", "index.tmp", "meta", "id", "id.tmp", "probe", "crcs"};

// The directory `dir` names, with every symbolic link of its path resolved,
// if it may hold a cache (see above); else an error naming the reason:
// ENOTDIR, ENOENT, EPERM (owner, permissions, a link). The checks hold for
// that resolved path, so the caller opens everything under it, never under
// `dir` again: a link on the way to `dir` may sit in a directory others can
// write to, and be swapped after the check.
Result<std::string> CheckCacheDir(const std::string& dir);

// Opens `dir`/`name` with open(2) `flags` (O_NOFOLLOW and O_CLOEXEC added;
// `mode` for O_CREAT). Refuses a symbolic link (ELOOP), or anything that is
// not a regular file owned by this user with one link (EPERM). Returns the fd.
Result<int> OpenCacheFile(const std::string& dir, const std::string& name, int flags,
                          mode_t mode = 0600);

// Takes the directory's lock, waiting up to `wait` while another process
// holds it; EBUSY once that has passed. Returns the fd that holds it.
Result<int> LockCacheDir(const std::string& dir, std::chrono::seconds wait);

}  // namespace mpnfs::cache
