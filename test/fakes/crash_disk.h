// CrashDisk: an in-memory cache::Disk that records every write and every
// barrier, and builds the disk states a crash may leave (leveldb's
// FaultInjectionTestEnv and SQLite's crash VFS are the models).
//
// The crash model is the one cache/disk.h promises callers and no more:
//  - a file's writes since its last Sync() may each have reached the disk
//    or not, page by page (4 KiB): for every page, any prefix of the unsynced
//    writes that touch it (the page cache writes a page back as it was at
//    some moment), independently of every other page, so a write spanning
//    pages can land torn;
//  - a file's size changes (truncate, extending writes) since its last sync
//    land as any prefix of them;
//  - creations, renames and removals since the directory's last SyncDir()
//    land as any prefix of them (journaled in order).
// A Chooser picks among these possibilities, so a test can enumerate them
// all (when few) or sample them with a fixed seed.
//
// Faults: fail() decides per operation whether it fails (EIO); it runs
// unlocked, in the thread doing the operation, and may block it.
//
// Thread safety: all methods are thread safe.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cache/disk.h"
#include "common/mutex.h"
#include "common/thread_annotations.h"

namespace mpnfs::test {

class CrashDisk : public cache::Disk {
 public:
  struct Op {
    enum Kind { kCreate, kWrite, kTruncate, kSync, kRename, kRemove, kSyncDir } kind;
    std::string path{}, to{};  // names: kCreate, kRename, kRemove
    int inode = -1;        // kCreate, kWrite, kTruncate, kSync
    uint64_t off = 0, size = 0;
    std::string data{};    // kWrite
  };
  // Picks one of n possibilities (0..n-1).
  using Chooser = std::function<size_t(size_t n)>;

  CrashDisk() = default;

  // The length of the log: a crash point.
  size_t Mark() const;
  // A disk holding what a crash after the first `point` operations may
  // leave, chosen by `choose`; its log starts empty.
  std::unique_ptr<CrashDisk> CrashState(size_t point, const Chooser& choose) const;
  // How many choices CrashState(point, ...) asks for, and of how many
  // possibilities each (the questions do not depend on the answers).
  std::vector<size_t> Questions(size_t point) const;
  // The current content of `path` (nullopt: absent).
  std::optional<std::string> Content(const std::string& path) const;

  // Prints the first n operations of the log (debugging).
  void DumpLog(size_t n) const;
  void set_fail(std::function<bool(const Op&)> f);

  Result<std::unique_ptr<cache::File>> Open(const std::string& path, int flags) override;
  bool Exists(const std::string& path) override;
  bool Rename(const std::string& from, const std::string& to) override;
  bool Remove(const std::string& path) override;
  bool SyncDir(const std::string& dir) override;
  uint64_t Allocated(const std::string& path) override;

 private:
  friend class CrashFile;
  bool Apply(Op op);  // logs and applies to the current view; false if failed

  mutable Mutex mu_;
  std::map<std::string, int> names_ GUARDED_BY(mu_);  // current view
  std::vector<std::string> files_ GUARDED_BY(mu_);    // by inode
  std::map<std::string, int> base_names_ GUARDED_BY(mu_);  // durable at construction
  std::vector<std::string> base_files_ GUARDED_BY(mu_);
  std::vector<Op> log_ GUARDED_BY(mu_);
  std::function<bool(const Op&)> fail_ GUARDED_BY(mu_);
};

}  // namespace mpnfs::test
