// Filesystem: POSIX filesystem semantics over NFSv3, independent of FUSE.
//
// The FUSE front end (src/fuse/) decodes a kernel request, calls one method
// here, and turns the callback's Result into a reply. Everything NFS-specific
// lives here or below: the inode table, close-to-open consistency, attribute
// timeouts, splitting of large reads and writes into rsize/wsize calls, and
// the UNSTABLE-write + COMMIT protocol with write-verifier checking.
//
// Callbacks run exactly once, on an engine loop thread (or inline on the
// calling thread for errors found before any RPC); they must not block.
//
// Writes. A file's write state and the rules on it are its FileWrites
// (fs/file_writes.h); the sending is here (fs/write.cc). A write is copied
// once into a shared buffer that the NFS calls send from and that is kept
// until a COMMIT returns the same write verifier as the WRITE did. If the verifier changed (the server restarted and lost
// unstable data) the kept data is sent again with FILE_SYNC. fsync and close
// (flush, close-to-open) return only after that. Each file's kept data is
// bounded: past `commit_threshold` a COMMIT starts in the background.
// With a write-back SSD cache a write goes to the cache instead, except a
// write by someone other than root to a file whose last known mode has
// setuid or setgid: that one goes to the server at once, which clears
// the bits (by its rules, as a local filesystem does when it takes the
// write); the attributes the kernel fetches next show it.
//
// Small new files. The first write through the open that created the file
// (this mount's Create), if it starts at offset 0, is at most
// kSmallFileSync bytes and the file has no other write out or kept, is
// sent FILE_SYNC: a small file written once and closed then needs no
// COMMIT at close (one round trip less), and its data is as durable when
// close returns. It is still write-behind (acknowledged at once, waited
// for at close).
//
// Directory attributes. The kernel drops a directory's attributes after
// every change made in it (create, remove, rename, ...) and, for its
// permission checks, asks for them again before the next lookup there. The
// server's reply to the change carries them (post-operation attributes): a
// GETATTR of a directory is answered from the newest such attributes (by
// ctime) for up to kDirPostOpTrust seconds after they arrived (never past
// acdirmin), with the attribute timeout shortened by their age, as the
// kernel NFS client's attribute cache takes them.
//
// Sizes. Servers have coarse ctime (NFS-Ganesha: 4 ms ticks), so two replies
// can carry the same ctime and arrive in any order. The size reported for a
// file is never below the end of this client's last completed write unless a
// GETATTR sent after every write completed says otherwise (FileWrites::size_hwm).
//
// Thread safety: all methods are thread safe.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cache/block_cache.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "fs/flusher.h"
#include "fs/gone_check.h"
#include "fs/hidden_names.h"
#include "fs/inode_table.h"
#include "fs/options.h"
#include "fs/write_order.h"
#include "mpnfs/result.h"
#include "nfs/client.h"

namespace mpnfs::fs {

using engine::Cred;
template <class T>
using Cb = std::function<void(Result<T>)>;

struct EntryOut {
  uint64_t ino = 0;  // 0: negative entry (the name does not exist)
  struct stat st {};
  double attr_timeout = 0;
  double entry_timeout = 0;
};

struct AttrOut {
  struct stat st {};
  double timeout = 0;
};

struct OpenFile {
  std::shared_ptr<Inode> inode;
  int flags = 0;
  Cred opener;  // who opened it
  // FileWrites::err_seq when this open last reported (or began): errseq.
  uint64_t err_seen GUARDED_BY(inode->writes.mu) = 0;
  // Opened by the Create that made the file, and nothing written through
  // it yet (see "Small new files" above).
  bool fresh GUARDED_BY(inode->writes.mu) = false;
};

struct OpenOut {
  OpenFile* file = nullptr;  // owned by the caller until Release()
  bool direct_io = false;
  bool keep_cache = false;
};

struct DirHandle {
  std::shared_ptr<Inode> dir;
  Mutex mu;
  bool loaded GUARDED_BY(mu) = false;
  bool plus GUARDED_BY(mu) = false;
  std::vector<nfs::DirEntry> entries GUARDED_BY(mu);  // the listing taken at offset 0
};

// The stat the kernel sees for NFS attributes (st_ino is the NFS fileid).
struct stat ToStat(const nfs::Attr& a, uint32_t blksize);

class Filesystem {
 public:
  static constexpr size_t kSmallFileSync = 64 * 1024;
  static constexpr double kDirPostOpTrust = 1.0;  // seconds

  // `cache` (optional, may be null) is the SSD cache tier (cache/block_cache.h).
  Filesystem(nfs::Client& nfs, nfs::Fh root, FsOptions opts,
             std::shared_ptr<cache::BlockCache> cache = nullptr);
  ~Filesystem();

  // Tells the kernel to forget a file's attributes (so that it fetches them
  // again): the FUSE front end's fuse_lowlevel_notify_inval_inode with no
  // data range, which waits for no page and no request. Set once, before
  // the session runs; Open() calls it, on an engine loop thread, before it
  // replies, when the server's size or mtime are not those the kernel was
  // last given (another client changed the file).
  void SetAttrInvalidator(std::function<void(uint64_t ino)> fn) { invalidate_attrs_ = std::move(fn); }
  // Drops the kernel's cached pages and attributes of an inode, later, from
  // a thread of its own (the kernel may still hold the pages of the request
  // that asked, so it must not be waited for). For an append the gateway
  // put elsewhere than the kernel did ("Appends" below).
  void SetDataInvalidator(std::function<void(uint64_t ino)> fn) { invalidate_data_later_ = std::move(fn); }

  // The SSD cache in use, or null. Each operation works on the cache it
  // found when it began, so DetachCache() never pulls it from under one.
  std::shared_ptr<cache::BlockCache> cache() const { return cache_.load(); }
  // Stops using the SSD cache (online detach). A write-back cache takes no
  // new dirty data and is flushed first (an error leaves it attached).
  // Returns once the operations still holding it have finished and it has
  // been closed; after 5 s of them (calls a server does not answer), at
  // once, leaving it to a thread of its own that waits for them and closes
  // it (never the last of them: an engine event loop).
  Result<Ok> DetachCache();
  // Write-back: every dirty page to the server now (waits); Ok without one.
  Result<Ok> FlushCache();
  // Write-back: gives up flushing for good (the process is told to end):
  // a FlushCache() waiting returns EINTR, the dirty pages stay in the cache
  // (Flusher::Interrupt). Any thread.
  void InterruptFlush();

  const FsOptions& options() const { return opts_; }
  InodeTable& inodes() { return inodes_; }

  void Lookup(const Cred& c, uint64_t parent, const std::string& name, Cb<EntryOut> cb);
  // The kernel drops n lookups of `ino`; at none left the inode is
  // forgotten, and a file gone from the server loses its unflushed cached
  // writes (DropCacheIfGone).
  void Forget(uint64_t ino, uint64_t n);
  void Getattr(const Cred& c, uint64_t ino, Cb<AttrOut> cb);
  void Setattr(const Cred& c, uint64_t ino, const nfs::SetAttr& sa, Cb<AttrOut> cb);
  void Readlink(const Cred& c, uint64_t ino, Cb<std::string> cb);
  void Mknod(const Cred& c, uint64_t parent, const std::string& name, mode_t mode, dev_t rdev,
             Cb<EntryOut> cb);
  void Mkdir(const Cred& c, uint64_t parent, const std::string& name, mode_t mode,
             Cb<EntryOut> cb);
  void Symlink(const Cred& c, const std::string& target, uint64_t parent, const std::string& name,
               Cb<EntryOut> cb);
  void Unlink(const Cred& c, uint64_t parent, const std::string& name, Cb<Ok> cb);
  // Rmdir and Readdir (a listing from its start) first wait, on the calling
  // thread, for the hidden names of files whose last close may have come to
  // be removed (fs/hidden_names.h).
  void Rmdir(const Cred& c, uint64_t parent, const std::string& name, Cb<Ok> cb);
  void Rename(const Cred& c, uint64_t parent, const std::string& name, uint64_t newparent,
              const std::string& newname, unsigned flags, Cb<Ok> cb);
  void Link(const Cred& c, uint64_t ino, uint64_t newparent, const std::string& newname,
            Cb<EntryOut> cb);
  void Access(const Cred& c, uint64_t ino, int mask, Cb<Ok> cb);
  void Statfs(const Cred& c, uint64_t ino, Cb<struct statvfs> cb);

  void Open(const Cred& c, uint64_t ino, int flags, Cb<OpenOut> cb);
  void Create(const Cred& c, uint64_t parent, const std::string& name, mode_t mode, int flags,
              Cb<std::pair<EntryOut, OpenOut>> cb);
  // The string_view is valid only during the callback (it may point into the
  // RPC receive buffer).
  void Read(const Cred& c, OpenFile* f, size_t size, uint64_t off,
            std::function<void(Result<std::string_view>)> cb);
  // `data` is the write's only copy inside mpnfs: it is sent from and kept
  // until a COMMIT covers it. `flags`: the write's own flags as the kernel
  // sends them (the file's flags now, with O_DSYNC or O_SYNC for a
  // pwritev2 RWF_DSYNC or RWF_SYNC write, O_DIRECT after fcntl F_SETFL);
  // O_DSYNC, O_SYNC and O_DIRECT there count as if the file was opened so.
  void Write(const Cred& c, OpenFile* f, nfs::Buffer data, uint64_t off, int flags,
             Cb<size_t> cb);
  void Flush(const Cred& c, OpenFile* f, Cb<Ok> cb);
  void Fsync(const Cred& c, OpenFile* f, Cb<Ok> cb);
  // The file's writes on the server (write-behind landed, a COMMIT), as
  // before a lock is released: what was written under it is there for the
  // next holder on another host. A write-back cache keeps its data: its
  // mount is the only one of the export (the ownership record), so no other
  // host reads the file before it is flushed. Unlike Fsync, an error is not
  // taken from the open file (its fsync or close still reports it).
  void ToServer(OpenFile* f, Cb<Ok> cb);
  // A lock of the file was granted and `server_size` fetched after it: an
  // end an O_APPEND open found is now this one (appends another host made
  // while this one waited for the lock come before it; "Appends" below).
  void LockedAt(uint64_t ino, uint64_t server_size);
  void Release(OpenFile* f);

  void Opendir(const Cred& c, uint64_t ino, Cb<DirHandle*> cb);
  // Loads the listing when `off` is 0 (or the handle has none), then calls
  // back with the handle; entries[off..] are what follows offset `off`.
  void Readdir(const Cred& c, DirHandle* d, uint64_t off, bool plus, Cb<DirHandle*> cb);
  // For a READDIRPLUS entry the kernel accepted: counts a lookup.
  EntryOut InternEntry(const nfs::DirEntry& e);
  void Releasedir(DirHandle* d) { delete d; }

 private:
  using InodeP = std::shared_ptr<Inode>;
  struct ReadOp {  // a read split into several READ calls
    std::unique_ptr<char[]> buf;
    Mutex mu;
    size_t remaining = 0;
    size_t valid = 0;  // bytes valid from the start (shortened at EOF)
    std::optional<Error> err;
    std::function<void(Result<std::string_view>)> cb;
  };
  // A read assembled from `parts` READ calls into one buffer of `size`;
  // `fill` (optional) stores the result in the SSD cache.
  std::shared_ptr<ReadOp> NewReadOp(const InodeP& inode, size_t size, size_t parts, uint64_t off,
                                    uint64_t token, std::shared_ptr<cache::BlockCache> fill,
                                    std::function<void(Result<std::string_view>)> cb);
  void ReadAttempt(const Cred& c, OpenFile* f, size_t size, uint64_t off,
                   std::function<void(Result<std::string_view>)> cb, int attempt,
                   bool lookup = true);
  // open(O_TRUNC) of regular file `ino` that existed (Open and Create).
  void TruncateAtOpen(const Cred& c, uint64_t ino, Cb<AttrOut> cb);
  // Runs `done` once the file's earlier writes can no longer undo `sa`
  // (write.cc); an error if the write-back cache could not flush them.
  void BeforeSetattr(const InodeP& inode, const nfs::SetAttr& sa,
                     std::function<void(Result<Ok>)> done);
  void SetattrNow(const Cred& c, uint64_t ino, const nfs::SetAttr& sa, Cb<AttrOut> cb);
  // The SETATTR; `tseq`: the truncate's place in the write order (0:
  // none). A truncate: the SSD cache forgets the file's data past the new
  // size first (if write-back writes came since the last flush, the place
  // is given up, they are flushed, and the truncate starts again).
  void SendSetattr(const Cred& c, const InodeP& inode, const nfs::SetAttr& sa,
                   WriteOrder::Seq tseq, Cb<AttrOut> cb);
  // The SETATTR call itself (after the SSD cache forgot a truncated file).
  void SendSetattrCall(const Cred& c, const InodeP& inode, const nfs::SetAttr& sa,
                       WriteOrder::Seq tseq, Cb<AttrOut> cb);
  // `flags` below: the open's flags with the write's own (see Write).
  // cache_mode=writeback: the write goes to the SSD cache; `base` holds the
  // server's copies of partial pages the cache asked for.
  void WriteBack(const Cred& c, OpenFile* f, nfs::Buffer data, uint64_t off, int flags,
                 std::map<uint64_t, std::string> base, Cb<size_t> cb, int attempt);
  // The NFS write path (write-behind for page-cache opens, else synchronous).
  void WriteToServer(const Cred& c, OpenFile* f, nfs::Buffer data, uint64_t off, int flags,
                     Cb<size_t> cb);
  // Write-back mounts: to the server, after the file's unflushed writes it overlaps.
  void WriteAround(const Cred& c, OpenFile* f, nfs::Buffer data, uint64_t off, int flags,
                   Cb<size_t> cb);
  // The file's dirty cache pages to the server (now if there is no flusher).
  void FlushFile(const InodeP& inode, std::function<void(Result<Ok>)> done);
  // FlushFile for fsync and O_SYNC writes: EIO if the cache disk lost some
  // of the file's unflushed writes (BlockCache::TakeLost).
  void FlushFileForSync(const InodeP& inode, std::function<void(Result<Ok>)> done);
  void CommitAfterDrain(OpenFile* f, Cb<Ok> cb);
  void ReadPiece(const std::shared_ptr<ReadOp>& op, const InodeP& inode, const Cred& c,
                 uint64_t off, size_t buf_off, size_t len);

  // If `name` in `dir` is a file this mount has open, renames it to a hidden
  // name removed at its last close (the kernel client's "silly rename") and
  // passes its inode; else passes null and changes nothing. `for_rename`:
  // hidden for a rename over it, whose end (EndRenameOver) decides what
  // becomes of the hidden name if the last close comes first.
  void HideIfOpen(const Cred& c, const InodeP& dir, const std::string& name, bool for_rename,
                  std::function<void(Result<InodeP>)> done);
  // The rename over `hidden` (HideIfOpen for_rename) ended (`ok`): if it
  // failed, the file gets its name `newname` in `todir` back; if it
  // succeeded and the last close came meanwhile, the hidden name goes.
  void EndRenameOver(const Cred& c, const InodeP& hidden, bool ok, const InodeP& todir,
                     const std::string& newname);
  // After the last RELEASE (`silly`: the hidden name to remove, if any):
  // the file's writes on their way land and are committed, then the hidden
  // name goes.
  void AfterRelease(const InodeP& inode, std::optional<Inode::Silly> silly);
  // If the cache holds unflushed writes of `fh`, asks the server whether the
  // file is gone (GoneCheck: its handle stale to each user who wrote them,
  // between two answers of the export's root); if so, and the file was not
  // looked up again meanwhile, they are dropped, never sent (nobody can read
  // them). Called where this mount's last use of a file ends: the kernel
  // forgot it, or its hidden name went at its last close. In the
  // background: the caller does not wait.
  void DropCacheIfGone(const nfs::Fh& fh);
  // The directory `parent`, after checking the length of `name` in it.
  Result<InodeP> Parent(uint64_t parent, const std::string& name);
  EntryOut MakeEntry(const InodeP& inode, const nfs::Attr& a);
  // `timeout`: given, instead of the attribute cache's adaptive one.
  AttrOut MakeAttr(const InodeP& inode, const nfs::Attr& a,
                   std::optional<double> timeout = std::nullopt);
  double AttrTimeout(const InodeP& inode, const nfs::Attr& a);
  // Post-operation attributes of directory `ino` (see "Directory attributes").
  void NoteDirAttr(uint64_t ino, const std::optional<nfs::Attr>& a);
  void ForgetDirAttr(uint64_t ino);
  void ForgetAllDirAttrs();
  // The directory's post-operation attributes if young enough, with their age.
  std::optional<std::pair<nfs::Attr, double>> FreshDirAttr(uint64_t ino);
  // Completes an operation that produced a new object (CREATE, MKDIR, ...).
  void FinishNewObject(const Cred& c, uint64_t parent, const std::string& name,
                       Result<nfs::NewObject> r, Cb<EntryOut> cb);
  void EntryFromFh(const Cred& c, const nfs::Fh& fh, std::optional<nfs::Attr> attr,
                   Cb<EntryOut> cb);
  // One WRITE admitted as `seq` in the file's WriteOrder (resending the rest
  // after a short write); records the kept copy when the server answers
  // UNSTABLE, then finishes `seq` there and starts what it held back.
  // `admit`: the cache may store the data (writethrough, not a sequential stream).
  void SendWrite(const InodeP& inode, const Cred& c, WriteOrder::Seq seq, uint64_t off,
                 nfs::Buffer data, size_t buf_off, size_t len, bool stable,
                 std::function<void(Result<Ok>)> done, bool admit = false);
  // Ends `seq`'s place in the file's write order, calls `then` (if given),
  // then starts what the place held back.
  static void EndPlace(const InodeP& inode, WriteOrder::Seq seq, const std::function<void()>& then = nullptr);
  // SendWrite without finishing `seq` (the caller does, once all the
  // calls made under it are answered).
  void SendWriteCall(const InodeP& inode, const Cred& c, WriteOrder::Seq seq, uint64_t off,
                     nfs::Buffer data, size_t buf_off, size_t len, bool stable,
                     std::function<void(Result<Ok>)> done, bool admit = false);
  // The SSD cache's view of a file's attributes (regular files only).
  void Observe(const InodeP& inode, const nfs::Attr& a);
  // Whether the writethrough/readonly cache may store a write's data.
  bool CacheAdmits(const InodeP& inode, uint64_t off, size_t size);
  // Splits a write into WRITE calls and admits them to the file's write
  // order; appends to `run` what may start now (run it after unlocking).
  // `behind`: acknowledged already (write-behind accounting, errors to
  // errseq); else `cb` gets the outcome.
  void AdmitWrite(const InodeP& inode, const Cred& c, uint64_t off, nfs::Buffer data,
                  bool behind, bool stable, bool cache_admit, Cb<size_t> cb,
                  std::vector<std::function<void()>>* run) REQUIRES(inode->writes.mu);
  // Runs `fn` once no write-behind of this inode is pending (now, or from
  // the completion of the last one).
  void WhenDrained(const InodeP& inode, std::function<void()> fn);
  // A new open file of `inode` (counted: see Unlink).
  OpenFile* NewOpenFile(const InodeP& inode, int flags, const Cred& c);
  // Appends (close-to-open). An O_APPEND write goes at the kernel's idea of
  // the file's size, which the kernel does not fetch at open (it checks
  // permissions from attributes it may hold for acregmin, and FUSE's open
  // reply carries none); after another client appended it is too small
  // and the write would land over that client's data. So with cto the
  // gateway picks an append's offset: the file's end as the last O_APPEND
  // open found it on the server, grown by this gateway's writes
  // (Inode::append_end). When that is not where the kernel put the data,
  // the kernel's size is stale and its page cache holds the data at the
  // wrong offset: once the write is answered, the kernel's attributes and
  // pages of the file are dropped (invalidate_data_later_), and the next
  // open drops them again (Doubt). Not for O_DIRECT writes, whose pieces
  // the kernel sends at once (each would take the end in arrival order),
  // nor before an O_APPEND open found the size (O_APPEND set by fcntl, an
  // open answered without attributes): those go where the kernel puts them.
  // OpenedAt sets the end from the attributes an open or create got (never
  // below an append placed and not yet answered); AppendOffset takes the
  // next `size` bytes of it, or nothing when the end is not known.
  bool AppendsHere(int open_flags) const { return opts_.cto && (open_flags & O_APPEND); }
  void OpenedAt(const InodeP& inode, uint64_t server_size);
  std::optional<uint64_t> AppendOffset(const InodeP& inode, size_t size);
  // The error this open file has not yet reported, if any (and now it has).
  std::optional<Error> TakeError(OpenFile* f);
  // One COMMIT round for the file's kept writes (FileWrites::BeginCommit).
  void Commit(const InodeP& inode, std::function<void(Result<Ok>)> cb);
  void EndCommit(const InodeP& inode, Result<Ok> r, std::function<void(Result<Ok>)> cb);
  void Resend(const InodeP& inode, const std::vector<FileWrites::BufferedP>& kept,
              std::vector<FileWrites::BufferedP> lost, std::function<void(Result<Ok>)> cb);
  // One lost write's resend, its place `seq` in the order reached.
  void ResendOne(const InodeP& inode, const std::vector<FileWrites::BufferedP>& kept,
                 const FileWrites::BufferedP& b, WriteOrder::Seq seq, std::function<void(Result<Ok>)> done);
  void MaybeBackgroundCommit(const InodeP& inode);
  void LoadDir(const Cred& c, DirHandle* d, uint64_t cookie, uint64_t verf, Cb<DirHandle*> cb);
  uint64_t NextSeq() { return seq_.fetch_add(1, std::memory_order_relaxed) + 1; }

  nfs::Client& nfs_;
  const FsOptions opts_;
  std::atomic<std::shared_ptr<cache::BlockCache>> cache_;
  std::function<void(uint64_t ino)> invalidate_attrs_;
  std::function<void(uint64_t ino)> invalidate_data_later_;
  std::atomic<std::shared_ptr<Flusher>> flusher_;  // write-back only
  // Threads closing caches a detach left to operations still using them.
  Mutex reaper_mu_;
  std::vector<std::thread> reapers_ GUARDED_BY(reaper_mu_);
  InodeTable inodes_;
  GoneCheck gone_;  // (DropCacheIfGone's; the flusher has its own)
  HiddenNames hidden_;  // hidden names of files removed while open, until removed
  std::atomic<uint64_t> seq_{0};
  struct PostOp {
    nfs::Attr attr;
    std::chrono::steady_clock::time_point at;
  };
  Mutex postop_mu_;
  std::unordered_map<uint64_t, PostOp> dir_postop_ GUARDED_BY(postop_mu_);
  std::atomic<int64_t> open_files_{0};  // in this mount; 0: unlink needs no check
  const uint32_t mount_id_;             // random: hidden names differ between mounts
  std::shared_ptr<spdlog::logger> log_;
};

}  // namespace mpnfs::fs
