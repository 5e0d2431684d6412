#include "fs/filesystem.h"

#include <fcntl.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include "fs/cache_version.h"
#include "fs/gather.h"
#include "fs/split.h"

namespace mpnfs::fs {
namespace {

mode_t TypeBits(nfs::Ftype t) {
  switch (t) {
    case nfs::Ftype::kReg: return S_IFREG;
    case nfs::Ftype::kDir: return S_IFDIR;
    case nfs::Ftype::kBlk: return S_IFBLK;
    case nfs::Ftype::kChr: return S_IFCHR;
    case nfs::Ftype::kLnk: return S_IFLNK;
    case nfs::Ftype::kSock: return S_IFSOCK;
    case nfs::Ftype::kFifo: return S_IFIFO;
    default: return 0;
  }
}

Error Stale() { return Error::Errno(ESTALE, "unknown inode"); }

// A mode-only SETATTR (what the kernel sends to clear setuid/setgid).
bool IsKillPriv(const nfs::SetAttr& sa) {
  return sa.mode && !sa.uid && !sa.gid && !sa.size &&
         sa.atime_how == nfs::SetAttr::TimeHow::kDontChange &&
         sa.mtime_how == nfs::SetAttr::TimeHow::kDontChange;
}

uint64_t RandomVerifier() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng();
}

}  // namespace

struct stat ToStat(const nfs::Attr& a, uint32_t blksize) {
  struct stat st {};
  st.st_ino = a.fileid;
  st.st_mode = TypeBits(a.type) | a.mode;
  st.st_nlink = a.nlink;
  st.st_uid = a.uid;
  st.st_gid = a.gid;
  st.st_size = static_cast<off_t>(a.size);
  st.st_blocks = static_cast<blkcnt_t>((a.used + 511) / 512);
  st.st_blksize = blksize;
  st.st_rdev = makedev(a.rdev_major, a.rdev_minor);
  st.st_atim = {static_cast<time_t>(a.atime.sec), static_cast<long>(a.atime.nsec)};
  st.st_mtim = {static_cast<time_t>(a.mtime.sec), static_cast<long>(a.mtime.nsec)};
  st.st_ctim = {static_cast<time_t>(a.ctime.sec), static_cast<long>(a.ctime.nsec)};
  return st;
}

Result<Filesystem::InodeP> Filesystem::Parent(uint64_t parent, const std::string& name) {
  auto dir = inodes_.Get(parent);
  if (!dir) return Stale();
  if (name.size() > opts_.name_max) return Error::Errno(ENAMETOOLONG, "name too long");
  return dir;
}

Filesystem::Filesystem(nfs::Client& nfs, nfs::Fh root, FsOptions opts,
                       std::shared_ptr<cache::BlockCache> cache)
    : nfs_(nfs),
      opts_(opts),
      cache_(cache),
      inodes_(root),
      gone_(nfs, root),
      mount_id_(static_cast<uint32_t>(RandomVerifier())),
      log_(Log("fs")) {
  if (cache && cache->mode() == cache::CacheMode::kWriteBack) {
    flusher_.store(std::make_shared<Flusher>(
        nfs_, cache, opts_.wsize, root, [this](const std::string& fh, uint64_t off, uint64_t len) {
          auto inode = inodes_.Find(fh);
          if (!inode) return true;  // not known here: no write of it is out, nothing kept
          MutexLock lock(inode->writes.mu);
          return inode->writes.Foreign(off, len);
        }));
  }
}

Filesystem::~Filesystem() {
  // The flusher's thread first: its hook uses the inode table, a member
  // destroyed before the flusher otherwise would be.
  flusher_.store(nullptr);
  std::vector<std::thread> reapers;
  {
    MutexLock lock(reaper_mu_);
    reapers.swap(reapers_);
  }
  for (auto& t : reapers) t.join();
}

Result<Ok> Filesystem::FlushCache() {
  auto fl = flusher_.load();
  if (!fl) return Ok{};
  return fl->FlushAll();
}

void Filesystem::InterruptFlush() {
  if (auto fl = flusher_.load()) fl->Interrupt();
}

void Filesystem::FlushFile(const InodeP& inode, std::function<void(Result<Ok>)> done) {
  auto fl = flusher_.load();
  if (!fl) {
    // (A write-back cache still attached without its flusher: the mount is
    // being torn down. Nothing can be flushed.)
    auto cache = cache_.load();
    if (cache && cache->mode() == cache::CacheMode::kWriteBack) {
      return done(Error::Errno(EIO, "the SSD cache's flusher has stopped"));
    }
    return done(Ok{});
  }
  fl->Flush(inode->fh(), std::move(done));
}

Result<Ok> Filesystem::DetachCache() {
  std::shared_ptr<cache::BlockCache> cur = cache_.load();
  if (!cur) return Error::Errno(ENOENT, "this mount has no SSD cache");
  if (auto fl = flusher_.load()) {
    // No new dirty data from here on (writes go to the server), then
    // everything dirty to the server, and only then the swap: reads keep
    // seeing unflushed writes until they are on the server.
    cur->StopWriteBack();
    if (auto r = fl->FlushAll(); !r) {
      cur->ResumeWriteBack();
      return Error::Errno(r.error().err, "flushing before the detach failed: " + r.error().what +
                                             " (the cache stays attached)");
    }
  }
  cur.reset();
  std::shared_ptr<cache::BlockCache> old = cache_.exchange(nullptr);
  if (!old) return Error::Errno(ENOENT, "this mount has no SSD cache");
  flusher_.store(nullptr);
  // Operations that began with the cache keep it alive; let them finish so
  // that closing it (a sync of its files) happens here, not on an event loop.
  for (int i = 0; i < 500 && old.use_count() > 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (old.use_count() > 1) {
    // Some still hold it (calls a server does not answer): the last of them
    // would close it on an engine event loop. A thread of its own waits for
    // them and closes it (nothing takes a new reference: it is gone from
    // cache_ and the flusher). Joined by ~Filesystem.
    log_->warn("SSD cache detached; operations still using it finish first, then it is closed");
    MutexLock lock(reaper_mu_);
    reapers_.emplace_back([old = std::move(old)]() mutable {
      while (old.use_count() > 1) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      old.reset();
    });
    return Ok{};
  }
  old.reset();
  log_->warn("SSD cache detached; running uncached");
  return Ok{};
}

void Filesystem::Observe(const InodeP& inode, const nfs::Attr& a) {
  if (a.type != nfs::Ftype::kReg) return;
  if (auto cache = cache_.load()) cache->Observe(inode->fh(), Version(a));
}

double Filesystem::AttrTimeout(const InodeP& inode, const nfs::Attr& a) {
  const bool dir = a.type == nfs::Ftype::kDir;
  const double lo = dir ? opts_.acdirmin : opts_.acregmin;
  const double hi = dir ? opts_.acdirmax : opts_.acregmax;
  MutexLock lock(inode->mu);
  if (inode->ac_timeout <= 0 || !(a.ctime == inode->ac_last_ctime)) {
    inode->ac_timeout = lo;
  } else {
    inode->ac_timeout = std::min(hi, std::max(lo, inode->ac_timeout * 2));
  }
  inode->ac_last_ctime = a.ctime;
  return inode->ac_timeout;
}

void Filesystem::NoteDirAttr(uint64_t ino, const std::optional<nfs::Attr>& a) {
  if (!a || a->type != nfs::Ftype::kDir) return;
  const auto now = std::chrono::steady_clock::now();
  MutexLock lock(postop_mu_);
  auto it = dir_postop_.find(ino);
  if (it != dir_postop_.end()) {
    // Replies may arrive out of order: the newest state wins. Two states
    // with the same ctime (the server's clock ticks coarsely) cannot be
    // ordered: then neither is served from here.
    const nfs::Attr& old = it->second.attr;
    if (a->ctime < old.ctime) return;
    if (a->ctime == old.ctime &&
        (a->mode != old.mode || a->uid != old.uid || a->gid != old.gid ||
         a->nlink != old.nlink || a->size != old.size || !(a->mtime == old.mtime))) {
      dir_postop_.erase(it);
      return;
    }
    it->second = PostOp{*a, now};
    return;
  }
  if (dir_postop_.size() >= 4096) {
    // Bounded: what is older than the trust window is useless anyway.
    std::erase_if(dir_postop_, [&](const auto& kv) {
      return now - kv.second.at > std::chrono::duration<double>(kDirPostOpTrust);
    });
    if (dir_postop_.size() >= 4096) dir_postop_.clear();
  }
  dir_postop_.emplace(ino, PostOp{*a, now});
}

void Filesystem::ForgetAllDirAttrs() {
  MutexLock lock(postop_mu_);
  dir_postop_.clear();
}

void Filesystem::ForgetDirAttr(uint64_t ino) {
  MutexLock lock(postop_mu_);
  dir_postop_.erase(ino);
}

std::optional<std::pair<nfs::Attr, double>> Filesystem::FreshDirAttr(uint64_t ino) {
  const double trust = std::min(kDirPostOpTrust, opts_.acdirmin);
  if (trust <= 0) return std::nullopt;
  MutexLock lock(postop_mu_);
  auto it = dir_postop_.find(ino);
  if (it == dir_postop_.end()) return std::nullopt;
  const double age =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - it->second.at).count();
  if (age >= trust) {
    dir_postop_.erase(it);
    return std::nullopt;
  }
  return std::make_pair(it->second.attr, age);
}

AttrOut Filesystem::MakeAttr(const InodeP& inode, const nfs::Attr& a, std::optional<double> timeout) {
  AttrOut out;
  out.st = ToStat(a, opts_.wsize);
  {
    MutexLock lock(inode->mu);
    inode->mode = a.mode;
    if (inode->kernel_attr_known && (a.size != inode->kernel_size || !(a.mtime == inode->kernel_mtime))) {
      inode->kernel_attr_uncertain = true;
    }
    inode->kernel_size = a.size;
    inode->kernel_mtime = a.mtime;
    inode->kernel_attr_known = true;
    {
      MutexLock wl(inode->writes.mu);
      const uint64_t hwm = inode->writes.size_hwm();
      if (hwm > static_cast<uint64_t>(out.st.st_size)) out.st.st_size = static_cast<off_t>(hwm);
    }
    // Removed while open: the hidden name is not a link the user made.
    if (inode->silly && out.st.st_nlink > 0) out.st.st_nlink--;
  }
  if (auto cache = cache_.load(); cache && a.type == nfs::Ftype::kReg) {
    // Write-back: the size includes writes not yet on the server.
    const uint64_t floor = cache->SizeFloor(inode->fh());
    if (floor > static_cast<uint64_t>(out.st.st_size)) out.st.st_size = static_cast<off_t>(floor);
  }
  out.timeout = timeout ? *timeout : AttrTimeout(inode, a);
  return out;
}

EntryOut Filesystem::MakeEntry(const InodeP& inode, const nfs::Attr& a) {
  AttrOut at = MakeAttr(inode, a);
  EntryOut e;
  e.ino = inode->ino();
  e.st = at.st;
  e.attr_timeout = at.timeout;
  e.entry_timeout = opts_.lookupcache == FsOptions::LookupCache::kNone ? 0 : opts_.acdirmin;
  return e;
}

void Filesystem::EntryFromFh(const Cred& c, const nfs::Fh& fh, std::optional<nfs::Attr> attr,
                             Cb<EntryOut> cb) {
  if (attr) {
    auto inode = inodes_.Intern(fh);
    return cb(MakeEntry(inode, *attr));
  }
  nfs_.Getattr(fh, c, [this, fh, cb = std::move(cb)](Result<nfs::Attr> r) {
    if (!r) return cb(r.error());
    auto inode = inodes_.Intern(fh);
    cb(MakeEntry(inode, *r));
  });
}

void Filesystem::Lookup(const Cred& c, uint64_t parent, const std::string& name,
                        Cb<EntryOut> cb) {
  auto dir = Parent(parent, name);
  if (!dir) return cb(dir.error());
  nfs_.Lookup((*dir)->fh(), name, c, [this, c, parent, cb = std::move(cb)](Result<nfs::LookupReply> r) {
    if (r) NoteDirAttr(parent, r->dir);
    if (!r) {
      if (r.error().err == ENOENT) {
        EntryOut neg;  // a negative entry, cached with lookupcache=all only
        neg.entry_timeout = opts_.lookupcache == FsOptions::LookupCache::kAll ? opts_.acdirmin : 0;
        return cb(neg);
      }
      return cb(r.error());
    }
    EntryFromFh(c, r->fh, std::move(r->attr), cb);
  });
}

void Filesystem::Getattr(const Cred& c, uint64_t ino, Cb<AttrOut> cb) {
  auto inode = inodes_.Get(ino);
  if (!inode) return cb(Stale());
  if (auto fresh = FreshDirAttr(ino)) {
    // A change made here answered with the directory's attributes just now
    // (filesystem.h, "Directory attributes").
    // Not a sign that the attributes are stable (the kernel would keep
    // them longer each time): at most what remains of acdirmin.
    AttrOut out = MakeAttr(inode, fresh->first, std::max(0.0, opts_.acdirmin - fresh->second));
    return cb(out);
  }
  {
    // Like the Linux client, let this client's write-behind land first, so
    // that size, mtime and ctime include what was acknowledged.
    MutexLock lock(inode->writes.mu);
    if (inode->writes.BehindPending()) {
      lock.Unlock();
      return WhenDrained(inode, [this, c, ino, cb = std::move(cb)]() mutable {
        Getattr(c, ino, std::move(cb));
      });
    }
  }
  const uint64_t seq = NextSeq();
  nfs_.Getattr(inode->fh(), c, [this, inode, seq, cb = std::move(cb)](Result<nfs::Attr> r) {
    if (!r) return cb(r.error());
    Observe(inode, *r);  // attribute-cache expiry: the SSD cache revalidates too
    NoteDirAttr(inode->ino(), *r);
    {
      // A GETATTR sent after every write of ours completed is authoritative.
      MutexLock lock(inode->writes.mu);
      inode->writes.Settled(seq);
    }
    cb(MakeAttr(inode, *r));
  });
}

void Filesystem::Setattr(const Cred& c, uint64_t ino, const nfs::SetAttr& sa, Cb<AttrOut> cb) {
  auto inode = inodes_.Get(ino);
  if (!inode) return cb(Stale());
  // The file's earlier writes land first (write.cc, BeforeSetattr).
  BeforeSetattr(inode, sa, [this, c, ino, sa, cb = std::move(cb)](Result<Ok> r) mutable {
    if (!r) return cb(r.error());
    SetattrNow(c, ino, sa, std::move(cb));
  });
}

void Filesystem::SetattrNow(const Cred& c, uint64_t ino, const nfs::SetAttr& sa, Cb<AttrOut> cb) {
  auto inode = inodes_.Get(ino);
  if (!inode) return cb(Stale());
  if (sa.size) {
    // A truncate takes its place in the write order: writes (and resends)
    // past the new size that came before it land first, later ones after.
    WriteOrder::Seq seq = 0;
    bool now;
    auto send = [this, c, inode, sa, cb](WriteOrder::Seq s) mutable {
      SendSetattr(c, inode, sa, s, std::move(cb));
    };
    {
      MutexLock lock(inode->writes.mu);
      now = inode->writes.AdmitTail(*sa.size, send, &seq);
    }
    if (now) send(seq);
    return;
  }
  SendSetattr(c, inode, sa, 0, std::move(cb));
}

void Filesystem::SendSetattr(const Cred& c, const InodeP& inode, const nfs::SetAttr& sa,
                             WriteOrder::Seq tseq, Cb<AttrOut> cb) {
  // The truncate's place in the order ends once it is answered, whatever
  // the answer.
  auto answered = [inode, tseq](Cb<AttrOut> cb) -> Cb<AttrOut> {
    if (!tseq) return cb;
    return [inode, tseq, cb = std::move(cb)](Result<AttrOut> r) {
      EndPlace(inode, tseq, [&] { cb(std::move(r)); });
    };
  };
  // A truncate: the SSD cache forgets the file's data past the new size
  // first (after the writes the truncate waited for: their data there must
  // not stay in the cache), and the SETATTR leaves once that is durable (a
  // crash must not bring the cut data back).
  if (auto cache = cache_.load(); cache && sa.size) {
    // Flushes the file, then tries again from a new place in the order. The
    // place goes first: no place in the write order waits for the flusher,
    // whose WRITEs wait for places over their bytes (FileWrites::Foreign).
    auto again = [this, c, inode, sa, tseq](Cb<AttrOut> cb) {
      if (tseq) EndPlace(inode, tseq);
      FlushFile(inode, [this, c, inode, sa, cb = std::move(cb)](Result<Ok> r) mutable {
        if (!r) return cb(r.error());
        SetattrNow(c, inode->ino(), sa, std::move(cb));
      });
    };
    auto send = [this, c, inode, sa, tseq, cache, again, answered, cb]() mutable {
      if (cache->StaleClaims(inode->fh())) {
        // The cache disk's index broke before forgetting the file was
        // durable: a restart could bring the cut data back. The flush
        // empties the index or fails.
        cache->TruncateDone(inode->fh());
        return again(std::move(cb));
      }
      // (The reference moves on: a barrier job of the cache's own queue must
      // not keep the cache alive once it ran.)
      SendSetattrCall(c, inode, sa, tseq,
                      [inode, cache = std::move(cache), cb = answered(std::move(cb))](Result<AttrOut> r) mutable {
                        cache->TruncateDone(inode->fh());  // (fills of the file resume)
                        cb(std::move(r));
                      });
    };
    // False: write-back writes acknowledged since the flush before the
    // truncate (they reach the server first), or stale claims.
    if (!cache->Truncating(inode->fh(), std::move(send))) again(std::move(cb));
    return;
  }
  SendSetattrCall(c, inode, sa, tseq, answered(std::move(cb)));
}

void Filesystem::SendSetattrCall(const Cred& c, const InodeP& inode, const nfs::SetAttr& sa,
                                 WriteOrder::Seq tseq, Cb<AttrOut> cb) {
  ForgetDirAttr(inode->ino());  // (its reply, if any, brings the new ones)
  nfs_.Setattr(inode->fh(), sa, c, [this, inode, c, sa, tseq, cb = std::move(cb)](Result<nfs::Wcc> r) {
    if (!r && r.error().err == EPERM && IsKillPriv(sa)) {
      // The kernel asks to drop setuid/setgid before a non-owner's write; the
      // server refuses the SETATTR to a non-owner but clears the bits itself
      // when that user writes. Report the attributes as they are.
      return nfs_.Getattr(inode->fh(), c, [this, inode, sa, cb](Result<nfs::Attr> a) {
        if (!a) return cb(a.error());
        constexpr uint32_t kPriv = S_ISUID | S_ISGID;
        if ((a->mode & ~kPriv) != (*sa.mode & ~kPriv) || (*sa.mode & ~a->mode) != 0) {
          return cb(Error::Errno(EPERM, "SETATTR: not permitted"));
        }
        cb(MakeAttr(inode, *a));
      });
    }
    if (!r) return cb(r.error());
    if (sa.size) {
      MutexLock lock(inode->mu);
      inode->have_open_attr = false;
      inode->append_end = *sa.size;
      MutexLock wl(inode->writes.mu);
      inode->writes.Truncated(tseq, *sa.size);
    }
    if (auto cache = cache_.load(); cache && r->before && r->after) {
      // Our own change of attributes: the cached data stays valid.
      cache->OwnChange(inode->fh(), Version(*r->before), Version(*r->after));
    }
    if (r->after) {
      NoteDirAttr(inode->ino(), r->after);
      return cb(MakeAttr(inode, *r->after));
    }
    nfs_.Getattr(inode->fh(), c, [this, inode, cb](Result<nfs::Attr> a) {
      if (!a) return cb(a.error());
      NoteDirAttr(inode->ino(), *a);
      cb(MakeAttr(inode, *a));
    });
  });
}

void Filesystem::Readlink(const Cred& c, uint64_t ino, Cb<std::string> cb) {
  auto inode = inodes_.Get(ino);
  if (!inode) return cb(Stale());
  nfs_.Readlink(inode->fh(), c, std::move(cb));
}

void Filesystem::FinishNewObject(const Cred& c, uint64_t parent, const std::string& name,
                                 Result<nfs::NewObject> r, Cb<EntryOut> cb) {
  if (!r) return cb(r.error());
  NoteDirAttr(parent, r->dir.after);
  if (r->fh) return EntryFromFh(c, *r->fh, std::move(r->attr), std::move(cb));
  // The server may omit the handle; look the name up.
  Lookup(c, parent, name, [cb = std::move(cb)](Result<EntryOut> e) {
    if (e && e->ino == 0) return cb(Error::Errno(EIO, "created object vanished"));
    cb(std::move(e));
  });
}

void Filesystem::Mknod(const Cred& c, uint64_t parent, const std::string& name, mode_t mode,
                       dev_t rdev, Cb<EntryOut> cb) {
  auto dir = Parent(parent, name);
  if (!dir) return cb(dir.error());
  nfs::SetAttr sa;
  sa.mode = mode & 07777;
  nfs::Ftype t;
  switch (mode & S_IFMT) {
    case S_IFREG: t = nfs::Ftype::kReg; break;
    case S_IFCHR: t = nfs::Ftype::kChr; break;
    case S_IFBLK: t = nfs::Ftype::kBlk; break;
    case S_IFSOCK: t = nfs::Ftype::kSock; break;
    case S_IFIFO: t = nfs::Ftype::kFifo; break;
    default: return cb(Error::Errno(EINVAL, "unsupported file type"));
  }
  auto done = [this, c, parent, name, cb = std::move(cb)](Result<nfs::NewObject> r) mutable {
    FinishNewObject(c, parent, name, std::move(r), std::move(cb));
  };
  if (t == nfs::Ftype::kReg) {
    return nfs_.Create((*dir)->fh(), name, nfs::CreateMode::kGuarded, sa, 0, c, std::move(done));
  }
  nfs_.Mknod((*dir)->fh(), name, t, sa, major(rdev), minor(rdev), c, std::move(done));
}

void Filesystem::Mkdir(const Cred& c, uint64_t parent, const std::string& name, mode_t mode,
                       Cb<EntryOut> cb) {
  auto dir = Parent(parent, name);
  if (!dir) return cb(dir.error());
  nfs::SetAttr sa;
  sa.mode = mode & 07777;
  nfs_.Mkdir((*dir)->fh(), name, sa, c,
             [this, c, parent, name, cb = std::move(cb)](Result<nfs::NewObject> r) mutable {
               FinishNewObject(c, parent, name, std::move(r), std::move(cb));
             });
}

void Filesystem::Symlink(const Cred& c, const std::string& target, uint64_t parent,
                         const std::string& name, Cb<EntryOut> cb) {
  auto dir = Parent(parent, name);
  if (!dir) return cb(dir.error());
  nfs::SetAttr sa;
  sa.mode = 0777;
  nfs_.Symlink((*dir)->fh(), name, target, sa, c,
               [this, c, parent, name, cb = std::move(cb)](Result<nfs::NewObject> r) mutable {
                 FinishNewObject(c, parent, name, std::move(r), std::move(cb));
               });
}

void Filesystem::HideIfOpen(const Cred& c, const InodeP& dir, const std::string& name, bool for_rename,
                            std::function<void(Result<InodeP>)> done) {
  if (open_files_.load() == 0) return done(InodeP{});
  nfs_.Lookup(dir->fh(), name, c,
              [this, dir, name, c, for_rename, done = std::move(done)](Result<nfs::LookupReply> r) mutable {
                auto inode = r ? inodes_.Find(r->fh) : nullptr;
                if (!inode) return done(InodeP{});
                bool open;
                {
                  MutexLock lock(inode->mu);
                  open = inode->opens > 0 && !inode->silly;
                }
                if (!open) return done(InodeP{});
                // Unique among mounts of the export too (the mount's random id).
                const std::string hidden =
                    fmt::format(".mpnfs{:08x}{:x}-{:x}", mount_id_, inode->ino(), NextSeq());
                nfs_.Rename(dir->fh(), name, dir->fh(), hidden, c,
                            [this, c, inode, dir, hidden, for_rename,
                             done = std::move(done)](Result<nfs::RenameReply> rr) {
                              if (!rr) return done(rr.error());
                              NoteDirAttr(dir->ino(), rr->from.after);
                              bool closed;
                              {
                                MutexLock lock(inode->mu);
                                closed = inode->opens == 0;  // the last close came meanwhile
                                if (!closed || for_rename) inode->silly = Inode::Silly{dir->fh(), hidden, c};
                                if (for_rename) {
                                  // The rename's end decides (EndRenameOver).
                                  inode->renaming_over = true;
                                  inode->closed_while_renaming = closed;
                                  if (closed) hidden_.Removing(dir->fh(), inode->ino());
                                  closed = false;
                                }
                              }
                              if (closed) {
                                // Nobody will remove it at close: now.
                                hidden_.Removing(dir->fh(), inode->ino());
                                nfs_.Remove(dir->fh(), hidden, c, [this, dir, done, inode](Result<nfs::Wcc> rm) {
                                  hidden_.Done(dir->fh(), inode->ino());
                                  ForgetDirAttr(dir->ino());
                                  if (!rm) return done(rm.error());
                                  DropCacheIfGone(inode->fh());
                                  done(inode);
                                });
                                return;
                              }
                              done(inode);
                            });
              });
}

void Filesystem::Unlink(const Cred& c, uint64_t parent, const std::string& name, Cb<Ok> cb) {
  auto dir = inodes_.Get(parent);
  if (!dir) return cb(Stale());
  // A file still open here must stay readable: as the kernel NFS client
  // does, it is renamed to a hidden name, removed at its last close.
  HideIfOpen(c, dir, name, /*for_rename=*/false,
             [this, dir, parent, name, c, cb = std::move(cb)](Result<InodeP> h) mutable {
    if (!h) return cb(h.error());
    if (*h) return cb(Ok{});
    nfs_.Remove(dir->fh(), name, c, [this, parent, cb = std::move(cb)](Result<nfs::Wcc> r) {
      if (!r) return cb(r.error());
      NoteDirAttr(parent, r->after);
      cb(Ok{});
    });
  });
}

void Filesystem::Forget(uint64_t ino, uint64_t n) {
  // The kernel's last reference: after an unlink or a rename over the file
  // that took its last name, or under memory pressure.
  if (InodeP gone = inodes_.Forget(ino, n)) DropCacheIfGone(gone->fh());
}

void Filesystem::DropCacheIfGone(const nfs::Fh& fh) {
  auto cache = cache_.load();
  if (!cache) return;
  // A file looked up again meanwhile is someone's: kept.
  gone_.AskToDrop(
      cache, fh, [this, fh] { return !inodes_.Known(fh); },
      [](GoneCheck::Outcome o) {
        if (o.dropped != cache::BlockCache::DropResult::kNothing) {
          Log("fs")->debug("a removed file's unflushed cached writes are dropped");
        }
      });
}

void Filesystem::Rmdir(const Cred& c, uint64_t parent, const std::string& name, Cb<Ok> cb) {
  auto dir = inodes_.Get(parent);
  if (!dir) return cb(Stale());
  // (Which directory holds a hidden name is known by handle, the one to
  // remove only by name: waits for them all. They are few and short-lived.)
  hidden_.Settle("");
  nfs_.Rmdir(dir->fh(), name, c, [this, parent, cb = std::move(cb)](Result<nfs::Wcc> r) {
    if (!r) return cb(r.error());
    // The removed directory's own entry must go too (its inode is not known
    // here): it is gone, not as it was.
    ForgetAllDirAttrs();
    NoteDirAttr(parent, r->after);
    cb(Ok{});
  });
}

void Filesystem::Rename(const Cred& c, uint64_t parent, const std::string& name,
                        uint64_t newparent, const std::string& newname, unsigned flags,
                        Cb<Ok> cb) {
  // NFSv3 has no atomic RENAME_NOREPLACE / RENAME_EXCHANGE.
  if (flags != 0) return cb(Error::Errno(EINVAL, "rename flags not supported by NFSv3"));
  auto from = inodes_.Get(parent);
  auto to = Parent(newparent, newname);
  if (!from) return cb(Stale());
  if (!to) return cb(to.error());
  InodeP todir = *to;
  auto rename = [this, c, from, name, todir, newname, cb = std::move(cb)](InodeP hidden) mutable {
    nfs_.Rename(from->fh(), name, todir->fh(), newname, c,
                [this, c, from, todir, newname, hidden, cb = std::move(cb)](Result<nfs::RenameReply> r) {
                  if (hidden) EndRenameOver(c, hidden, static_cast<bool>(r), todir, newname);
                  if (r) {
                    // A renamed directory's own ctime (and "..") changed
                    // too, and its inode is unknown here: forget them all.
                    ForgetAllDirAttrs();
                    NoteDirAttr(from->ino(), r->from.after);
                    NoteDirAttr(todir->ino(), r->to.after);
                    return cb(Ok{});
                  }
                  cb(r.error());
                });
  };
  if (open_files_.load() == 0) return rename(nullptr);
  // Replacing a file open here: it is hidden first, as Unlink does, so that
  // it stays readable (unless it is the file being renamed).
  nfs_.Lookup(from->fh(), name, c,
              [this, c, todir, newname, rename = std::move(rename)](Result<nfs::LookupReply> src) mutable {
                if (!src) return rename(nullptr);  // the RENAME reports the error
                nfs_.Lookup(todir->fh(), newname, c,
                            [this, c, todir, newname, srcfh = src->fh,
                             rename = std::move(rename)](Result<nfs::LookupReply> dst) mutable {
                              if (!dst || dst->fh == srcfh) return rename(nullptr);
                              HideIfOpen(c, todir, newname, /*for_rename=*/true,
                                         [rename = std::move(rename)](Result<InodeP> h) mutable {
                                           rename(h ? *h : nullptr);
                                         });
                            });
              });
}

void Filesystem::Link(const Cred& c, uint64_t ino, uint64_t newparent, const std::string& newname,
                      Cb<EntryOut> cb) {
  auto inode = inodes_.Get(ino);
  auto dir = Parent(newparent, newname);
  if (!inode) return cb(Stale());
  if (!dir) return cb(dir.error());
  nfs_.Link(inode->fh(), (*dir)->fh(), newname, c,
            [this, c, inode, newparent, cb = std::move(cb)](Result<nfs::LinkReply> r) mutable {
              if (!r) return cb(r.error());
              NoteDirAttr(newparent, r->dir.after);
              // The attributes must show the new link count: fetch them if absent.
              EntryFromFh(c, inode->fh(), std::move(r->attr), std::move(cb));
            });
}

void Filesystem::Access(const Cred& c, uint64_t ino, int mask, Cb<Ok> cb) {
  auto inode = inodes_.Get(ino);
  if (!inode) return cb(Stale());
  if (mask == F_OK) mask = 0;
  uint32_t want = 0;
  if (mask & R_OK) want |= nfs::kAccessRead;
  if (mask & W_OK) want |= nfs::kAccessModify;
  if (mask & X_OK) want |= nfs::kAccessExecute | nfs::kAccessLookup;
  if (want == 0) want = nfs::kAccessRead;  // F_OK: existence only; any answer will do
  nfs_.Access(inode->fh(), want, c, [mask, cb = std::move(cb)](Result<nfs::AccessReply> r) {
    if (!r) return cb(r.error());
    const uint32_t got = r->access;
    bool ok = true;
    if ((mask & R_OK) && !(got & nfs::kAccessRead)) ok = false;
    if ((mask & W_OK) && !(got & nfs::kAccessModify)) ok = false;
    if (mask & X_OK) {
      const bool is_dir = r->attr && r->attr->type == nfs::Ftype::kDir;
      if (!(got & (is_dir ? nfs::kAccessLookup : nfs::kAccessExecute))) ok = false;
    }
    if (!ok) return cb(Error::Errno(EACCES, "access denied"));
    cb(Ok{});
  });
}

void Filesystem::Statfs(const Cred& c, uint64_t ino, Cb<struct statvfs> cb) {
  auto inode = inodes_.Get(ino);
  if (!inode) inode = inodes_.Get(InodeTable::kRootIno);
  nfs_.Fsstat(inode->fh(), c, [this, cb = std::move(cb)](Result<nfs::FsStat> r) {
    if (!r) return cb(r.error());
    struct statvfs s {};
    constexpr uint64_t kFrag = 4096;
    s.f_bsize = opts_.wsize;
    s.f_frsize = kFrag;
    s.f_blocks = r->tbytes / kFrag;
    s.f_bfree = r->fbytes / kFrag;
    s.f_bavail = r->abytes / kFrag;
    s.f_files = r->tfiles;
    s.f_ffree = r->ffiles;
    s.f_favail = r->afiles;
    s.f_namemax = opts_.name_max;
    cb(s);
  });
}

void Filesystem::Open(const Cred& c, uint64_t ino, int flags, Cb<OpenOut> cb) {
  auto inode = inodes_.Get(ino);
  if (!inode) return cb(Stale());
  const bool direct = opts_.direct_io || (flags & O_DIRECT);
  uint32_t want = 0;
  switch (flags & O_ACCMODE) {
    case O_RDONLY: want = nfs::kAccessRead; break;
    case O_WRONLY: want = nfs::kAccessModify | nfs::kAccessExtend; break;
    default: want = nfs::kAccessRead | nfs::kAccessModify | nfs::kAccessExtend; break;
  }
  // O_TRUNC (FUSE_CAP_ATOMIC_O_TRUNC: the kernel leaves it to us) needs
  // write permission whatever the access mode.
  if (flags & O_TRUNC) want |= nfs::kAccessModify;
  // One ACCESS call both checks the caller's permission (as the Linux client
  // does at open) and returns the attributes close-to-open revalidates with.
  nfs_.Access(inode->fh(), want, c,
              [this, inode, flags, want, direct, c, cb = std::move(cb)](Result<nfs::AccessReply> r) {
                if (!r) return cb(r.error());
                if ((r->access & want) != want) {
                  // MODIFY or EXTEND alone is enough to write (append-only servers differ).
                  const uint32_t w = nfs::kAccessModify | nfs::kAccessExtend;
                  const bool write_ok = !(want & w) || (r->access & w);
                  const bool read_ok = !(want & nfs::kAccessRead) || (r->access & nfs::kAccessRead);
                  if (!write_ok || !read_ok) return cb(Error::Errno(EACCES, "permission denied"));
                }
                OpenOut out;
                out.direct_io = direct;
                bool stale_attrs = false;
                const bool appends = AppendsHere(flags);
                if (r->attr) Observe(inode, *r->attr);  // close-to-open for the SSD cache
                if ((flags & O_TRUNC) && r->attr && r->attr->type == nfs::Ftype::kReg) {
                  // Truncate now, then open without it.
                  return TruncateAtOpen(c, inode->ino(), [this, c, inode, flags, cb](Result<AttrOut> t) {
                    if (!t) return cb(t.error());
                    Open(c, inode->ino(), flags & ~O_TRUNC, cb);
                  });
                }
                {
                  MutexLock lock(inode->mu);
                  if (opts_.kernel_cache) {
                    out.keep_cache = true;  // changed only through this mount
                  } else if (opts_.cto && r->attr) {
                    out.keep_cache = inode->have_open_attr && r->attr->mtime == inode->open_mtime &&
                                     r->attr->size == inode->open_size;
                    inode->open_mtime = r->attr->mtime;
                    inode->open_size = r->attr->size;
                    inode->have_open_attr = true;
                  } else {
                    out.keep_cache = !opts_.cto;
                  }
                  // A failed write-behind, a refused write or an uncached
                  // write since the last open: the pages may not be the
                  // server's data.
                  {
                    MutexLock wl(inode->writes.mu);
                    if (inode->writes.DoubtedSinceOpen()) out.keep_cache = false;
                  }
                  // Close-to-open for the size too: the kernel reads up to
                  // the size it holds, which may be older than the server's
                  // (another client wrote within the attribute timeout).
                  stale_attrs = r->attr && r->attr->type == nfs::Ftype::kReg &&
                                (!inode->kernel_attr_known || inode->kernel_attr_uncertain ||
                                 r->attr->size != inode->kernel_size ||
                                 !(r->attr->mtime == inode->kernel_mtime));
                  if (stale_attrs) {
                    // What the kernel accepts next comes from requests sent
                    // after the notification: these attributes or newer.
                    inode->kernel_size = r->attr->size;
                    inode->kernel_mtime = r->attr->mtime;
                    inode->kernel_attr_known = true;
                    inode->kernel_attr_uncertain = false;
                  }
                }
                if (stale_attrs && invalidate_attrs_) invalidate_attrs_(inode->ino());
                if (appends && r->attr) {
                  OpenedAt(inode, r->attr->size);
                } else if (appends) {
                  MutexLock lock(inode->mu);
                  inode->append_known = false;  // (the kernel's offsets, then)
                }
                out.file = NewOpenFile(inode, flags, c);
                cb(out);
              });
}

void Filesystem::Create(const Cred& c, uint64_t parent, const std::string& name, mode_t mode,
                        int flags, Cb<std::pair<EntryOut, OpenOut>> cb) {
  auto dir = Parent(parent, name);
  if (!dir) return cb(dir.error());
  const bool direct = opts_.direct_io || (flags & O_DIRECT);
  auto finish = [this, flags, direct, c, cb](Result<EntryOut> r) {
    if (!r) return cb(r.error());
    auto inode = inodes_.Get(r->ino);
    if (!inode) return cb(Stale());
    {
      MutexLock lock(inode->mu);
      inode->open_mtime = {static_cast<uint32_t>(r->st.st_mtim.tv_sec),
                           static_cast<uint32_t>(r->st.st_mtim.tv_nsec)};
      inode->open_size = static_cast<uint64_t>(r->st.st_size);
      inode->have_open_attr = true;
    }
    OpenOut o;
    o.direct_io = direct;
    o.keep_cache = false;
    // (A create of a name that exists opens that file, whatever its size.)
    if (AppendsHere(flags)) OpenedAt(inode, static_cast<uint64_t>(r->st.st_size));
    o.file = NewOpenFile(inode, flags, c);
    {
      MutexLock lock(o.file->inode->writes.mu);  // (OpenFile::fresh is guarded by it)
      o.file->fresh = true;
    }
    cb(std::make_pair(*r, o));
  };
  nfs::SetAttr sa;
  sa.mode = mode & 07777;
  if (flags & O_EXCL) {
    // O_EXCL: EXCLUSIVE create with a verifier, safe to resend; the verifier
    // occupies the times, so a SETATTR then sets mode and times (RFC 1813).
    nfs_.Create((*dir)->fh(), name, nfs::CreateMode::kExclusive, {}, RandomVerifier(), c,
                [this, c, parent, name, sa, finish](Result<nfs::NewObject> r) mutable {
                  if (!r) return finish(r.error());
                  FinishNewObject(c, parent, name, std::move(r),
                                  [this, c, sa, finish](Result<EntryOut> e) mutable {
                                    if (!e) return finish(e.error());
                                    nfs::SetAttr fix = sa;
                                    fix.atime_how = fix.mtime_how = nfs::SetAttr::TimeHow::kServer;
                                    Setattr(c, e->ino, fix,
                                            [e = *e, finish](Result<AttrOut> a) mutable {
                                              if (!a) return finish(a.error());
                                              e.st = a->st;
                                              finish(e);
                                            });
                                  });
                });
    return;
  }
  // O_TRUNC: a GUARDED CREATE tells whether the file existed (EEXIST); one
  // that did is opened as it is (UNCHECKED) and truncated as Open truncates
  // it. A new file needs nothing more.
  auto created = [this, c, parent, name, finish](bool existed, Result<nfs::NewObject> r) mutable {
    FinishNewObject(c, parent, name, std::move(r), [this, c, existed, finish](Result<EntryOut> e) mutable {
      if (!e || !existed) return finish(std::move(e));
      TruncateAtOpen(c, e->ino, [e = *e, finish](Result<AttrOut> a) mutable {
        if (!a) return finish(a.error());
        e.st = a->st;
        finish(e);
      });
    });
  };
  const nfs::Fh dirfh = (*dir)->fh();
  if (!(flags & O_TRUNC)) {
    return nfs_.Create(dirfh, name, nfs::CreateMode::kUnchecked, sa, 0, c,
                       [created](Result<nfs::NewObject> r) mutable { created(false, std::move(r)); });
  }
  nfs_.Create(dirfh, name, nfs::CreateMode::kGuarded, sa, 0, c,
              [this, dirfh, name, sa, c, created](Result<nfs::NewObject> r) mutable {
                // (A reissued CREATE answered EEXIST gives what the name holds:
                // it may have existed before, so it is truncated too.)
                if (r) return created(r->looked_up, std::move(r));
                // (EACCES, EPERM: a server may check the directory before the
                // name; an existing file the caller may write still opens.)
                const int e = r.error().err;
                if (e != EEXIST && e != EACCES && e != EPERM) return created(false, std::move(r));
                nfs_.Create(dirfh, name, nfs::CreateMode::kUnchecked, sa, 0, c,
                            [created](Result<nfs::NewObject> r2) mutable { created(true, std::move(r2)); });
              });
}

void Filesystem::TruncateAtOpen(const Cred& c, uint64_t ino, Cb<AttrOut> cb) {
  // As a local filesystem does at open(O_TRUNC) of a regular file that
  // existed: size 0, mtime and ctime updated even if it was empty. Through
  // Setattr: after this mount's writes to it still on their way (a size in
  // a CREATE could be overtaken by them), with the SSD cache's copy dropped
  // and the truncate recorded for resends.
  nfs::SetAttr sa;
  sa.size = 0;
  sa.mtime_how = nfs::SetAttr::TimeHow::kServer;
  Setattr(c, ino, sa, std::move(cb));
}

void Filesystem::Read(const Cred& c, OpenFile* f, size_t size, uint64_t off,
                      std::function<void(Result<std::string_view>)> cb) {
  ReadAttempt(c, f, size, off, std::move(cb), 0);
}

void Filesystem::ReadAttempt(const Cred& c, OpenFile* f, size_t size, uint64_t off,
                             std::function<void(Result<std::string_view>)> cb, int attempt,
                             bool lookup) {
  const InodeP inode = f->inode;
  if (size == 0) return cb(std::string_view());
  {
    MutexLock lock(inode->writes.mu);
    if (inode->writes.BehindPending()) {
      // A read must see this client's write-behind data: wait for it to land.
      lock.Unlock();
      return WhenDrained(inode, [this, c, f, size, off, attempt, cb = std::move(cb)]() mutable {
        // (Now on an engine event loop, which must not read the cache
        // disk: the data comes from the server.)
        ReadAttempt(c, f, size, off, std::move(cb), attempt, /*lookup=*/false);
      });
    }
  }
  uint64_t token = 0;
  bool admit = false;
  std::shared_ptr<cache::BlockCache> cache = cache_.load();
  if (cache) {
    if (cache->Sequential(inode->fh(), off, size, /*write=*/false)) {
      cache->NoteBypass(false);  // a scan: neither served from nor stored in the cache
    } else {
      if (lookup) {
        if (auto hit = cache->Read(inode->fh(), off, size)) return cb(std::string_view(*hit));
      }
      admit = true;
    }
    token = cache->ReadStart(inode->fh());
    if (cache->mode() == cache::CacheMode::kWriteBack) {
      // This client's unflushed writes must show in what the server returns
      // (a scan that bypasses the cache included).
      // (On an event loop: the cache reads its disk on its own thread.)
      cb = [this, c, f, size, off, attempt, inode, token, cache,
            cb = std::move(cb)](Result<std::string_view> r) mutable {
        if (!r) return cb(r.error());
        cache::BlockCache::OverlayAsync(
            std::move(cache), inode->fh(), token, off, *r, size,
            [this, c, f, size, off, attempt, cb = std::move(cb)](cache::OverlayResult o,
                                                                std::string_view data) mutable {
              if (o.kind == cache::OverlayResult::kError) {
                return cb(Error::Errno(EIO, "an unflushed cached page could not be read back"));
              }
              if (o.kind == cache::OverlayResult::kRetry) {
                if (attempt >= 16) return cb(Error::Errno(EIO, "read keeps racing with writes"));
                return ReadAttempt(c, f, size, off, std::move(cb), attempt + 1, /*lookup=*/false);
              }
              cb(data);
            });
      };
    }
  }
  if (admit && cache->options().fill_block) {
    // fill=block: a miss reads the whole cache blocks it touches (on a
    // server that pays per operation rather than per byte, about the price
    // of the pages asked for) and fills them all; the caller gets its part.
    const uint64_t block = cache->options().block;
    const uint64_t lo = off / block * block;
    const uint64_t hi = (off + size + block - 1) / block * block;
    if (lo != off || hi != off + size) {
      const size_t want = static_cast<size_t>(hi - lo);
      auto part = [skip = off - lo, size, cb = std::move(cb)](Result<std::string_view> r) mutable {
        if (!r) return cb(r.error());
        // Short at EOF: what there is of the asked range.
        cb(r->size() <= skip ? std::string_view() : r->substr(skip, size));
      };
      auto wp = SplitRange(lo, want, StripePiece(want, nfs_.Parallelism(), opts_.rsize));
      auto op = NewReadOp(inode, want, wp.size(), lo, token, cache, std::move(part));
      for (const auto& p : wp) ReadPiece(op, inode, c, p.off, p.buf_off, p.len);
      return;
    }
  }
  auto pieces = SplitRange(off, size, StripePiece(size, nfs_.Parallelism(), opts_.rsize));
  if (pieces.size() == 1) {
    // One RPC serves the request: reply straight from the receive buffer.
    nfs_.Read(inode->fh(), off, static_cast<uint32_t>(size), c,
              [this, inode, c, off, size, token, admit, cache, cb = std::move(cb)](
                  Result<nfs::ReadReply> r) mutable {
                if (!r) return cb(r.error());
                if (r->attr) Observe(inode, *r->attr);
                const size_t n = std::min(r->len, size);
                if (n > 0 && n < size && !r->eof) {
                  // A short READ before EOF (the server may answer less than
                  // asked): a short reply would make the kernel think the
                  // file ends here. Fetch the rest into one buffer.
                  auto op = NewReadOp(inode, size, 1, off, token, admit ? cache : nullptr,
                                      std::move(cb));
                  std::memcpy(op->buf.get(), r->data, n);
                  return ReadPiece(op, inode, c, off + n, n, size - n);
                }
                if (admit) cache->Fill(inode->fh(), token, off, r->data, n);
                cb(std::string_view(r->data, n));
              });
    return;
  }
  auto op = NewReadOp(inode, size, pieces.size(), off, token, admit ? cache : nullptr,
                      std::move(cb));
  for (const auto& p : pieces) ReadPiece(op, inode, c, p.off, p.buf_off, p.len);
}

std::shared_ptr<Filesystem::ReadOp> Filesystem::NewReadOp(
    const InodeP& inode, size_t size, size_t parts, uint64_t off, uint64_t token,
    std::shared_ptr<cache::BlockCache> fill, std::function<void(Result<std::string_view>)> cb) {
  auto op = std::make_shared<ReadOp>();
  op->buf.reset(new char[size]);
  op->remaining = parts;
  op->valid = size;
  op->cb = std::move(cb);
  if (fill) {
    op->cb = [inode, off, token, fill, cb = std::move(op->cb)](Result<std::string_view> r) {
      if (r) fill->Fill(inode->fh(), token, off, r->data(), r->size());
      cb(std::move(r));
    };
  }
  return op;
}

void Filesystem::ReadPiece(const std::shared_ptr<ReadOp>& op, const InodeP& inode, const Cred& c,
                           uint64_t off, size_t buf_off, size_t len) {
  nfs_.Read(inode->fh(), off, static_cast<uint32_t>(len), c,
            [this, op, inode, c, off, buf_off, len](Result<nfs::ReadReply> r) {
              size_t rest = 0;  // short read before EOF: this many bytes still to fetch
              {
                MutexLock lock(op->mu);
                if (!r) {
                  if (!op->err) op->err = r.error();
                } else {
                  const size_t n = std::min(r->len, len);
                  std::memcpy(op->buf.get() + buf_off, r->data, n);
                  if (n < len && !r->eof && n > 0) {
                    rest = len - n;
                  } else if (n < len) {
                    op->valid = std::min(op->valid, buf_off + n);
                  }
                }
                if (rest == 0 && --op->remaining != 0) return;
              }
              // (Outside the lock: a call that fails at once calls back inline.)
              if (rest) return ReadPiece(op, inode, c, off + (len - rest), buf_off + (len - rest), rest);
              if (op->err) return op->cb(*op->err);
              op->cb(std::string_view(op->buf.get(), op->valid));
            });
}

void Filesystem::OpenedAt(const InodeP& inode, uint64_t server_size) {
  MutexLock lock(inode->mu);
  MutexLock wl(inode->writes.mu);
  // Writes of ours not yet settled on the server count (size_hwm); with a
  // write-back cache, whose dirty data the server does not see, nothing
  // but this gateway writes the export, so the end only grows.
  uint64_t end = std::max(server_size, inode->writes.size_hwm());
  // Appends placed and not answered yet are not in either.
  if (inode->appends_in_flight > 0) end = std::max(end, inode->append_end);
  if (auto cache = cache_.load(); cache && cache->mode() == cache::CacheMode::kWriteBack) {
    end = std::max(end, inode->append_end);
  }
  inode->append_end = end;
  inode->append_known = true;
}

void Filesystem::LockedAt(uint64_t ino, uint64_t server_size) {
  auto inode = inodes_.Get(ino);
  if (!inode) return;
  {
    MutexLock lock(inode->mu);
    if (!inode->append_known) return;
  }
  OpenedAt(inode, server_size);
}

std::optional<uint64_t> Filesystem::AppendOffset(const InodeP& inode, size_t size) {
  MutexLock lock(inode->mu);
  if (!inode->append_known) return std::nullopt;
  const uint64_t off = inode->append_end;
  inode->append_end = off + size;
  ++inode->appends_in_flight;
  return off;
}

OpenFile* Filesystem::NewOpenFile(const InodeP& inode, int flags, const Cred& c) {
  uint64_t seen;
  {
    MutexLock lock(inode->mu);
    inode->opens++;
    MutexLock wl(inode->writes.mu);
    seen = inode->writes.err_seq();  // errors before this open are not its to report
  }
  open_files_++;
  return new OpenFile{inode, flags, c, seen};
}

void Filesystem::Release(OpenFile* f) {
  std::optional<Inode::Silly> silly;
  bool deferred = false;  // to the end of a rename over the file (EndRenameOver)
  bool last;
  {
    MutexLock lock(f->inode->mu);
    last = --f->inode->opens == 0;
    if (last) {
      if (f->inode->silly && f->inode->renaming_over) {
        f->inode->closed_while_renaming = true;
        deferred = true;
        hidden_.Removing(f->inode->silly->dir, f->inode->ino());
      } else {
        silly.swap(f->inode->silly);
      }
    }
    if (silly) {
      hidden_.Removing(silly->dir, f->inode->ino());
    } else if (f->inode->opens == 0 && !deferred) {
      hidden_.Released(f->inode->ino());
    }
  }
  open_files_--;
  auto inode = f->inode;
  delete f;
  // (A release that is not the last commits nothing: a reader's close must
  // not make the server sync other users' data.)
  if (last && !deferred) AfterRelease(inode, std::move(silly));
}

void Filesystem::AfterRelease(const InodeP& inode, std::optional<Inode::Silly> silly) {
  // (The last close: nothing waited for writes a nocto close left, or a
  // shared mapping's pages written back after the FLUSH.)
  // The last close of a file removed while open: remove its hidden name,
  // after the data is committed (the handle dies with the last name).
  auto remove_hidden = [this, silly, fh = inode->fh(), ino = inode->ino()]() {
    if (!silly) return;
    nfs_.Remove(silly->dir, silly->name, silly->cred, [this, silly, fh, ino](Result<nfs::Wcc> r) {
      hidden_.Done(silly->dir, ino);
      if (auto dir = inodes_.Find(silly->dir)) {
        if (r) NoteDirAttr(dir->ino(), r->after); else ForgetDirAttr(dir->ino());
      }
      if (!r) return log_->warn("removing {} after its last close failed: {}", silly->name, r.error().what);
      DropCacheIfGone(fh);  // (the kernel may have forgotten the inode before this)
    });
  };
  // Writes still on their way (nocto closes commit nothing; a shared
  // mapping's pages may be written back after the last close's FLUSH) land
  // and are committed first, rather than at unmount, and before the hidden
  // name goes: with it goes the handle, and they would be answered ESTALE.
  WhenDrained(inode, [this, inode, remove_hidden] {
    Commit(inode, [this, remove_hidden](Result<Ok> r) {
      if (!r) log_->warn("COMMIT after close failed: {}", r.error().what);
      remove_hidden();
    });
  });
}

void Filesystem::EndRenameOver(const Cred& c, const InodeP& hidden, bool ok, const InodeP& todir,
                               const std::string& newname) {
  std::optional<Inode::Silly> silly;
  bool closed;
  {
    MutexLock lock(hidden->mu);
    hidden->renaming_over = false;
    closed = hidden->closed_while_renaming;
    hidden->closed_while_renaming = false;
    // Failed: the file gets its name back, open or not. Succeeded: the
    // hidden name is the file's only one; it goes now if the file is
    // closed, else at its last close (also when the last close came
    // meanwhile and a new open since: the removal it left is over).
    if (!ok || (closed && hidden->opens == 0)) {
      silly.swap(hidden->silly);
    } else if (closed && hidden->silly) {
      hidden_.Done(hidden->silly->dir, hidden->ino());
    }
  }
  if (!silly) return;
  if (ok) return AfterRelease(hidden, std::move(silly));
  // The name back, unless it is taken: a RENAME reissued after its answer
  // was lost, which did rename, is answered ENOENT, and giving the name
  // back would replace the file renamed there. Then it is as if the rename
  // succeeded.
  nfs_.Lookup(todir->fh(), newname, c,
              [this, c, hidden, todir, newname, silly, closed](Result<nfs::LookupReply> lk) {
                if (lk || lk.error().err != ENOENT) {
                  bool now_closed;
                  {
                    MutexLock lock(hidden->mu);
                    now_closed = hidden->opens == 0;
                    if (!now_closed && !hidden->silly) hidden->silly = silly;
                  }
                  if (now_closed) return AfterRelease(hidden, silly);
                  if (closed) hidden_.Done(silly->dir, hidden->ino());
                  return;
                }
                nfs_.Rename(silly->dir, silly->name, todir->fh(), newname, c,
                            [this, todir, silly, closed, ino = hidden->ino()](Result<nfs::RenameReply> r) {
                              ForgetDirAttr(todir->ino());
                              if (!r) {
                                log_->warn("giving {} its name back after a failed rename failed: {}",
                                           silly->name, r.error().what);
                              }
                              if (closed) hidden_.Done(silly->dir, ino);
                            });
              });
}

void Filesystem::Opendir(const Cred& /*c*/, uint64_t ino, Cb<DirHandle*> cb) {
  auto inode = inodes_.Get(ino);
  if (!inode) return cb(Stale());
  auto* d = new DirHandle;
  d->dir = inode;
  cb(d);
}

void Filesystem::LoadDir(const Cred& c, DirHandle* d, uint64_t cookie, uint64_t verf,
                         Cb<DirHandle*> cb) {
  auto on_page = [this, c, d, cb](Result<nfs::DirPage> r) mutable {
    if (!r) return cb(r.error());
    uint64_t last = 0;
    {
      MutexLock lock(d->mu);
      for (auto& e : r->entries) {
        last = e.cookie;
        d->entries.push_back(std::move(e));
      }
      if (r->eof || r->entries.empty()) {
        d->loaded = true;
      }
    }
    if (r->eof || r->entries.empty()) return cb(d);
    LoadDir(c, d, last, r->verf, std::move(cb));
  };
  const uint32_t count = std::max<uint32_t>(opts_.dtpref, 32768);
  bool plus;
  {
    MutexLock lock(d->mu);
    plus = d->plus;
  }
  if (plus) {
    nfs_.Readdirplus(d->dir->fh(), cookie, verf, count, count * 4, c, std::move(on_page));
  } else {
    nfs_.Readdir(d->dir->fh(), cookie, verf, count, c, std::move(on_page));
  }
}

void Filesystem::Readdir(const Cred& c, DirHandle* d, uint64_t off, bool plus,
                         Cb<DirHandle*> cb) {
  {
    MutexLock lock(d->mu);
    if (d->loaded && off != 0 && (d->plus || !plus)) {
      lock.Unlock();
      return cb(d);
    }
    lock.Unlock();
    // A listing from the start shows no hidden name whose last close came.
    hidden_.Settle(d->dir->fh());
    lock.Lock();
    d->entries.clear();
    d->loaded = false;
    d->plus = plus;
  }
  LoadDir(c, d, 0, 0, std::move(cb));
}

EntryOut Filesystem::InternEntry(const nfs::DirEntry& e) {
  auto inode = inodes_.Intern(*e.fh);
  return MakeEntry(inode, *e.attr);
}

}  // namespace mpnfs::fs
