// FUSE low-level front end: decodes kernel requests, calls the Filesystem,
// replies. No NFS knowledge here.
//
// Handlers never wait on the network: each hands its request to the
// Filesystem and returns; the reply is sent from the completion, on an
// engine loop thread. Names and other pointer arguments die when a handler
// returns, so they are copied first.
//
// Credentials: every request runs as its caller (uid, gid and supplementary
// groups, read from /proc by ReadGroups (proc_groups.h) and cached per pid for a
// second), so the server enforces per-user permissions on an allow_other mount.
#pragma once

#define FUSE_USE_VERSION 314
#include <fuse_lowlevel.h>

#include <chrono>
#include <functional>
#include <unordered_map>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "engine/cred.h"
#include "fs/filesystem.h"
#include "fs/locks.h"

namespace mpnfs::fuse {

class FuseTransport;

struct FrontOptions {
  unsigned max_write = 1u << 20;
  unsigned max_readahead = 1u << 20;
  unsigned max_background = 512;
  bool readdirplus = true;
  // FsOptions::kernel_cache: no invalidation of cached pages when the
  // attributes the kernel fetches show a new mtime (FUSE_CAP_EXPLICIT_INVAL_DATA).
  bool kernel_cache = false;
};

class CredCache {
 public:
  engine::Cred For(fuse_req_t req);

 private:
  struct Entry {
    engine::Cred cred;
    std::chrono::steady_clock::time_point expires;
  };
  Mutex mu_;
  std::unordered_map<pid_t, Entry> by_pid_ GUARDED_BY(mu_);
};

struct FuseContext {
  fs::Filesystem* fs = nullptr;
  // Locks that go to the server (local_lock=): fcntl/OFD locks, flock. The
  // kernel keeps the others itself. `locks` null while they go to the
  // server: the server has no lock manager (ENOLCK, as nfs(5) says).
  bool posix_locks_to_server = false;
  bool flocks_to_server = false;
  fs::Locks* locks = nullptr;
  // Drops the kernel's cached pages and attributes of an inode (a lock was
  // granted: what another host wrote under it must be read), then runs
  // `then`; on a thread of its own, since dropping a page waits for the
  // requests that hold it, whose replies come from the engine's threads.
  std::function<void(uint64_t ino, std::function<void()> then)> invalidate_data;
  FrontOptions opts;
  CredCache creds;
  // The device I/O's owner (transport.h), found by its hooks through here.
  FuseTransport* transport = nullptr;
};

// The operation table; userdata passed to fuse_session_new must be a FuseContext*.
const fuse_lowlevel_ops* Operations();

}  // namespace mpnfs::fuse
