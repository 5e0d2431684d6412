// Disk: the file-I/O seam under the SSD cache. Every read, write, sync,
// truncate, rename and directory sync of the cache's files goes through it,
// in the spirit of leveldb's Env: RealDisk() calls the kernel, and a test can
// substitute a disk that records each write and each barrier and rebuilds
// every state a crash may leave (src/cache/crash_disk.h), or that fails.
//
// What a caller may rely on is only what a crash-safe program may rely on
// from POSIX filesystems: a write is durable after Sync() of its file; a
// rename is atomic and durable after SyncDir() of its directory; nothing is
// promised about the order in which unsynced writes reach the disk, nor that
// a write reaches it whole (a 4 KiB sector is the unit that lands or not).
//
// Thread safety: a Disk and its Files may be used from any thread; calls on
// one File at different offsets may run concurrently (as pread/pwrite).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "mpnfs/result.h"

namespace mpnfs::cache {

class File {
 public:
  virtual ~File() = default;
  // False with errno set on failure; reading past the end is EIO.
  virtual bool ReadAt(char* p, size_t n, uint64_t off) = 0;
  virtual bool WriteAt(const char* p, size_t n, uint64_t off) = 0;
  virtual bool Sync() = 0;  // fdatasync
  virtual bool Truncate(uint64_t size) = 0;
  // Reserves [0, size) (posix_fallocate); true where that is unsupported.
  virtual bool Allocate(uint64_t size) = 0;
  virtual uint64_t Size() = 0;
};

class Disk {
 public:
  enum OpenFlags { kCreate = 1, kDirect = 2 };
  virtual ~Disk() = default;
  // Opens a regular file, never through a symbolic link. kDirect asks for
  // O_DIRECT and falls back to buffered I/O where the filesystem refuses it.
  virtual Result<std::unique_ptr<File>> Open(const std::string& path, int flags) = 0;
  virtual bool Exists(const std::string& path) = 0;
  virtual bool Rename(const std::string& from, const std::string& to) = 0;
  virtual bool Remove(const std::string& path) = 0;
  virtual bool SyncDir(const std::string& dir) = 0;
  // Bytes the file occupies on disk (0 if absent).
  virtual uint64_t Allocated(const std::string& path) = 0;
};

// The kernel's filesystems.
Disk& RealDisk();

// The whole content of a small file; ENOENT if there is none.
Result<std::string> ReadWholeFile(Disk& disk, const std::string& path);
// Replaces dir/name with `content` atomically and durably: a temporary
// file is written and synced, renamed over the old one, and the directory
// synced. A crash leaves the old content or the new, never a mix or nothing.
Status ReplaceFile(Disk& disk, const std::string& dir, const std::string& name,
                   const std::string& content);

}  // namespace mpnfs::cache
