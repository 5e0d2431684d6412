// InodeTable: FUSE inode numbers <-> NFS file handles, with lookup counts.
//
// FUSE gives each inode a lookup count: every successful reply that names an
// inode (lookup, create, mkdir, readdirplus entry, ...) adds one, and forget
// subtracts. The table keeps an Inode while its count is above zero; the root
// (ino 1) is pinned. Numbers are never reused within a mount for another
// file, so a late request for a forgotten inode gets ESTALE, never another
// file.
//
// A forgotten inode that is still in use (its writes on their way, a COMMIT
// or a hidden name's removal pending: whatever holds a reference to it) is
// remembered by handle until the last reference goes. Find() still finds
// it, and Intern() of its handle brings it back, number and state: a file
// has one write order, however often the kernel forgets it (and keeps what
// its writes' state says, such as a refusal of write-behind after an
// error, until that state's own rule clears it).
//
// Lock order: InodeTable::mu_ before Inode::mu (the program's whole order:
// common/mutex.h). Forget re-checks the count under mu_, so a concurrent
// Intern() cannot resurrect a dying inode.
//
// Thread safety: all methods are thread safe.
#pragma once

#include <atomic>
#include <list>
#include <functional>
#include <optional>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "engine/cred.h"
#include "fs/file_writes.h"
#include "mpnfs/result.h"
#include "nfs/types.h"

namespace mpnfs::fs {

class Inode {
 public:
  Inode(uint64_t ino, nfs::Fh fh) : ino_(ino), fh_(std::move(fh)) {}
  Inode(const Inode&) = delete;
  Inode& operator=(const Inode&) = delete;

  uint64_t ino() const { return ino_; }
  const nfs::Fh& fh() const { return fh_; }

  Mutex mu;
  // Close-to-open: attributes seen at the last open (or write) by this client.
  nfs::Time open_mtime GUARDED_BY(mu);
  uint64_t open_size GUARDED_BY(mu) = 0;
  bool have_open_attr GUARDED_BY(mu) = false;
  // Permission bits (07777) in the attributes the server last reported
  // (replies to GETATTR, SETATTR, LOOKUP, ..., and WRITE's post-op).
  uint32_t mode GUARDED_BY(mu) = 0;
  // Adaptive attribute timeout (acregmin..acregmax / acdirmin..acdirmax).
  double ac_timeout GUARDED_BY(mu) = 0;
  nfs::Time ac_last_ctime GUARDED_BY(mu);
  // The file's writes to the server: their order, kept data, COMMIT rounds,
  // write-behind window and error state (fs/file_writes.h; its own lock,
  // taken after `mu`).
  FileWrites writes;
  // The server's size and mtime in the attributes last given to the kernel
  // (MakeAttr: lookups, GETATTR, SETATTR, READDIRPLUS entries, creates).
  // An open that finds others asks the kernel to fetch them again. Replies
  // built in one order may reach the kernel in another (which keeps the
  // first applied), so once two differing ones were given, which the kernel
  // holds is uncertain until an open has asked it to fetch them again.
  uint64_t kernel_size GUARDED_BY(mu) = 0;
  nfs::Time kernel_mtime GUARDED_BY(mu);
  // Where the next O_APPEND write goes (with cto): the file's end as this
  // gateway knows it, that is the server's size at the last open (close-
  // to-open) grown by every write through this gateway since, or the size
  // a truncate through it set (Filesystem::AppendOffset).
  uint64_t append_end GUARDED_BY(mu) = 0;
  bool append_known GUARDED_BY(mu) = false;  // an O_APPEND open set it from the server's size
  int appends_in_flight GUARDED_BY(mu) = 0;   // placed by AppendOffset, not yet answered
  bool kernel_attr_known GUARDED_BY(mu) = false;
  bool kernel_attr_uncertain GUARDED_BY(mu) = false;
  // Open files of this mount, and the hidden name a removal while open left
  // the file under (as the kernel client's "silly rename"): the directory and
  // the name to REMOVE at the last close.
  int opens GUARDED_BY(mu) = 0;
  struct Silly {
    nfs::Fh dir;
    std::string name;
    engine::Cred cred;  // who removed the file: the hidden name goes as that user
  };
  std::optional<Silly> silly GUARDED_BY(mu);
  // Hidden for a rename over it that is still in flight: a last close
  // meanwhile leaves the hidden name to the rename's end (removed if it
  // succeeded, the file's way back to its name if it failed).
  bool renaming_over GUARDED_BY(mu) = false;
  bool closed_while_renaming GUARDED_BY(mu) = false;

 private:
  friend class InodeTable;
  const uint64_t ino_;
  const nfs::Fh fh_;
  uint64_t nlookup_ = 0;  // guarded by InodeTable::mu_
};

class InodeTable {
 public:
  static constexpr uint64_t kRootIno = 1;

  explicit InodeTable(nfs::Fh root_fh);

  // The inode for `fh`, created if new; its lookup count grows by one.
  std::shared_ptr<Inode> Intern(const nfs::Fh& fh);
  // nullptr when `ino` is unknown (forgotten or never issued).
  std::shared_ptr<Inode> Get(uint64_t ino) const;
  // The inode for `fh` if this mount knows it, or forgot it while it is
  // still in use (no lookup count taken); else null.
  std::shared_ptr<Inode> Find(const nfs::Fh& fh) const;
  // Whether the kernel holds an inode for `fh` (a lookup count above zero).
  bool Known(const nfs::Fh& fh) const;
  // Drops `n` lookups; removes the inode at zero (never the root) and
  // returns it then (else null).
  std::shared_ptr<Inode> Forget(uint64_t ino, uint64_t n);

  size_t size() const;
  uint64_t LookupCount(uint64_t ino) const;  // for tests
  size_t ForgottenEntries() const;           // for tests: remembered forgotten handles

 private:
  mutable Mutex mu_;
  std::unordered_map<uint64_t, std::shared_ptr<Inode>> by_ino_ GUARDED_BY(mu_);
  std::unordered_map<std::string, uint64_t> by_fh_ GUARDED_BY(mu_);
  // Forgotten inodes, by handle, while something still holds them; expired
  // entries are swept when the map reaches sweep_at_.
  std::unordered_map<std::string, std::weak_ptr<Inode>> forgotten_ GUARDED_BY(mu_);
  size_t sweep_at_ GUARDED_BY(mu_) = 64;
  uint64_t next_ino_ GUARDED_BY(mu_) = kRootIno + 1;
};

}  // namespace mpnfs::fs
