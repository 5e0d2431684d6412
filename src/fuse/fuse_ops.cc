#include "fuse/fuse_ops.h"

#include <fcntl.h>
#include <sys/file.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/log.h"
#include "fuse/proc_groups.h"

namespace mpnfs::fuse {
namespace {

FuseContext* Ctx(fuse_req_t req) { return static_cast<FuseContext*>(fuse_req_userdata(req)); }
fs::Filesystem& Fs(fuse_req_t req) { return *Ctx(req)->fs; }
engine::Cred CredOf(fuse_req_t req) { return Ctx(req)->creds.For(req); }

void ReplyError(fuse_req_t req, const Error& e) {
  static const auto log = Log("fuse");
  log->debug("reply {} ({})", strerror(e.err), e.what);
  fuse_reply_err(req, e.err > 0 ? e.err : EIO);
}

fuse_entry_param ToParam(const fs::EntryOut& e) {
  fuse_entry_param p{};
  p.ino = e.ino;
  p.generation = 1;
  p.attr = e.st;
  p.attr_timeout = e.attr_timeout;
  p.entry_timeout = e.entry_timeout;
  return p;
}

auto EntryReply(fuse_req_t req) {
  return [req](Result<fs::EntryOut> r) {
    if (!r) return ReplyError(req, r.error());
    fuse_entry_param p = ToParam(*r);
    fs::Filesystem& fs = Fs(req);  // a reply frees `req`
    if (fuse_reply_entry(req, &p) != 0 && p.ino != 0) {
      // The kernel did not take the reference (request interrupted): undo it.
      fs.Forget(p.ino, 1);
    }
  };
}

auto ErrnoReply(fuse_req_t req) {
  return [req](Result<Ok> r) {
    if (!r) return ReplyError(req, r.error());
    fuse_reply_err(req, 0);
  };
}

auto AttrReply(fuse_req_t req) {
  return [req](Result<fs::AttrOut> r) {
    if (!r) return ReplyError(req, r.error());
    fuse_reply_attr(req, &r->st, r->timeout);
  };
}

fs::OpenFile* File(fuse_file_info* fi) { return reinterpret_cast<fs::OpenFile*>(fi->fh); }
fs::DirHandle* Dir(fuse_file_info* fi) { return reinterpret_cast<fs::DirHandle*>(fi->fh); }

void Init(void* userdata, fuse_conn_info* conn) {
  auto* ctx = static_cast<FuseContext*>(userdata);
  conn->max_write = ctx->opts.max_write;  // libfuse asks the kernel for max_pages to match
  conn->max_readahead = ctx->opts.max_readahead;
  conn->max_background = ctx->opts.max_background;
  conn->congestion_threshold = ctx->opts.max_background * 3 / 4;
  conn->time_gran = 1;  // NFSv3 carries nanoseconds
  auto want = [conn](unsigned cap) {
    if (conn->capable & cap) conn->want |= cap;
  };
  want(FUSE_CAP_ASYNC_READ);
  want(FUSE_CAP_ASYNC_DIO);
  want(FUSE_CAP_PARALLEL_DIROPS);
  if (ctx->opts.kernel_cache && (conn->capable & FUSE_CAP_EXPLICIT_INVAL_DATA)) {
    // The data changes only through this mount (kernel_cache): a new mtime
    // is this client's own write, whose pages the kernel already holds.
    conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
    want(FUSE_CAP_EXPLICIT_INVAL_DATA);
  } else {
    want(FUSE_CAP_AUTO_INVAL_DATA);  // mtime changes seen by getattr drop stale pages
    if (ctx->opts.kernel_cache) {
      Log("fuse")->warn("kernel_cache: this kernel cannot keep cached pages when a file's mtime changes");
    }
  }
  want(FUSE_CAP_ATOMIC_O_TRUNC);   // open(O_TRUNC) truncates in Filesystem::Open
  // The NFS server clears setuid/setgid when a non-owner writes (it writes
  // with the caller's identity). Kernels may still send a mode SETATTR first;
  // Filesystem::Setattr tolerates the server's refusal of it.
  want(FUSE_CAP_HANDLE_KILLPRIV);
  Log("fuse")->debug("kernel capabilities {:#x}, wanted {:#x}", conn->capable, conn->want);
  if (ctx->opts.readdirplus) {
    want(FUSE_CAP_READDIRPLUS);
    want(FUSE_CAP_READDIRPLUS_AUTO);
  } else {
    conn->want &= ~(FUSE_CAP_READDIRPLUS | FUSE_CAP_READDIRPLUS_AUTO);
  }
  // Never: the kernel would acknowledge writes the server has not seen.
  conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;
  // Locks for the server's lock manager come here; without these the
  // kernel keeps them in its own tables (local_lock=).
  if (ctx->posix_locks_to_server) {
    want(FUSE_CAP_POSIX_LOCKS);
  } else {
    conn->want &= ~FUSE_CAP_POSIX_LOCKS;
  }
  if (ctx->flocks_to_server) {
    want(FUSE_CAP_FLOCK_LOCKS);
  } else {
    conn->want &= ~FUSE_CAP_FLOCK_LOCKS;
  }
}

void Lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Fs(req).Lookup(CredOf(req), parent, name, EntryReply(req));
}

void Forget(fuse_req_t req, fuse_ino_t ino, uint64_t n) {
  Fs(req).Forget(ino, n);
  fuse_reply_none(req);
}

void ForgetMulti(fuse_req_t req, size_t count, fuse_forget_data* list) {
  for (size_t i = 0; i < count; ++i) Fs(req).Forget(list[i].ino, list[i].nlookup);
  fuse_reply_none(req);
}

void Getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  Fs(req).Getattr(CredOf(req), ino, AttrReply(req));
}

void Setattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info*) {
  static const auto log = Log("fuse");
  log->debug("setattr ino {} to_set {:#x} mode {:o}", ino, to_set, attr->st_mode);
  nfs::SetAttr sa;
  if (to_set & FUSE_SET_ATTR_MODE) sa.mode = attr->st_mode & 07777;
  if (to_set & FUSE_SET_ATTR_UID) sa.uid = attr->st_uid;
  if (to_set & FUSE_SET_ATTR_GID) sa.gid = attr->st_gid;
  if (to_set & FUSE_SET_ATTR_SIZE) sa.size = static_cast<uint64_t>(attr->st_size);
  using How = nfs::SetAttr::TimeHow;
  if (to_set & FUSE_SET_ATTR_ATIME_NOW) {
    sa.atime_how = How::kServer;
  } else if (to_set & FUSE_SET_ATTR_ATIME) {
    sa.atime_how = How::kClient;
    sa.atime = {static_cast<uint32_t>(attr->st_atim.tv_sec), static_cast<uint32_t>(attr->st_atim.tv_nsec)};
  }
  if (to_set & FUSE_SET_ATTR_MTIME_NOW) {
    sa.mtime_how = How::kServer;
  } else if (to_set & FUSE_SET_ATTR_MTIME) {
    sa.mtime_how = How::kClient;
    sa.mtime = {static_cast<uint32_t>(attr->st_mtim.tv_sec), static_cast<uint32_t>(attr->st_mtim.tv_nsec)};
  }
  // NFSv3 times are unsigned 32-bit seconds: refuse what it cannot store.
  auto out_of_range = [](const timespec& t) { return t.tv_sec < 0 || t.tv_sec > 0xffffffffLL; };
  if ((sa.atime_how == How::kClient && out_of_range(attr->st_atim)) ||
      (sa.mtime_how == How::kClient && out_of_range(attr->st_mtim))) {
    return (void)fuse_reply_err(req, EOVERFLOW);
  }
  Fs(req).Setattr(CredOf(req), ino, sa, AttrReply(req));
}

void Readlink(fuse_req_t req, fuse_ino_t ino) {
  Fs(req).Readlink(CredOf(req), ino, [req](Result<std::string> r) {
    if (!r) return ReplyError(req, r.error());
    fuse_reply_readlink(req, r->c_str());
  });
}

void Mknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t rdev) {
  Fs(req).Mknod(CredOf(req), parent, name, mode, rdev, EntryReply(req));
}

void Mkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  Fs(req).Mkdir(CredOf(req), parent, name, mode, EntryReply(req));
}

void Unlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Fs(req).Unlink(CredOf(req), parent, name, ErrnoReply(req));
}

void Rmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Fs(req).Rmdir(CredOf(req), parent, name, ErrnoReply(req));
}

void Symlink(fuse_req_t req, const char* link, fuse_ino_t parent, const char* name) {
  Fs(req).Symlink(CredOf(req), link, parent, name, EntryReply(req));
}

void Rename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t newparent,
            const char* newname, unsigned int flags) {
  Fs(req).Rename(CredOf(req), parent, name, newparent, newname, flags, ErrnoReply(req));
}

void Link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char* newname) {
  Fs(req).Link(CredOf(req), ino, newparent, newname, EntryReply(req));
}

void Open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  int flags = fi->flags;
  Fs(req).Open(CredOf(req), ino, flags, [req, fi_copy = *fi](Result<fs::OpenOut> r) mutable {
    if (!r) return ReplyError(req, r.error());
    fi_copy.fh = reinterpret_cast<uint64_t>(r->file);
    fi_copy.direct_io = r->direct_io;
    fi_copy.keep_cache = r->keep_cache;
    fs::Filesystem& fs = Fs(req);  // a reply frees `req`
    if (fuse_reply_open(req, &fi_copy) != 0) fs.Release(r->file);
  });
}

void Create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, fuse_file_info* fi) {
  Fs(req).Create(CredOf(req), parent, name, mode, fi->flags,
                 [req, fi_copy = *fi](Result<std::pair<fs::EntryOut, fs::OpenOut>> r) mutable {
                   if (!r) return ReplyError(req, r.error());
                   fuse_entry_param p = ToParam(r->first);
                   fi_copy.fh = reinterpret_cast<uint64_t>(r->second.file);
                   fi_copy.direct_io = r->second.direct_io;
                   fi_copy.keep_cache = r->second.keep_cache;
                   fs::Filesystem& fs = Fs(req);  // a reply frees `req`
                   if (fuse_reply_create(req, &p, &fi_copy) != 0) {
                     fs.Release(r->second.file);
                     fs.Forget(p.ino, 1);
                   }
                 });
}

void Read(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info* fi) {
  Fs(req).Read(CredOf(req), File(fi), size, static_cast<uint64_t>(off),
               [req](Result<std::string_view> r) {
                 if (!r) return ReplyError(req, r.error());
                 fuse_reply_buf(req, r->data(), r->size());
               });
}

// The request's data is copied once, into the buffer that mpnfs sends from
// and keeps until COMMIT (libfuse reuses its own buffer for the next request).
void WriteBuf(fuse_req_t req, fuse_ino_t, fuse_bufvec* in, off_t off, fuse_file_info* fi) {
  const size_t size = fuse_buf_size(in);
  auto data = std::make_shared<nfs::Bytes>(size);
  fuse_bufvec dst = FUSE_BUFVEC_INIT(size);
  dst.buf[0].mem = data->data();
  ssize_t got = fuse_buf_copy(&dst, in, FUSE_BUF_SPLICE_NONBLOCK);
  if (got < 0 || static_cast<size_t>(got) != size) {
    return (void)fuse_reply_err(req, got < 0 ? static_cast<int>(-got) : EIO);
  }
  // fi->flags: the write's own flags (RWF_DSYNC shows as O_DSYNC); a
  // page-cache writeback's (writepage) say nothing about the write.
  const int wflags = fi->writepage ? 0 : fi->flags;
  Fs(req).Write(CredOf(req), File(fi), std::move(data), static_cast<uint64_t>(off), wflags,
                [req](Result<size_t> r) {
                  if (!r) return ReplyError(req, r.error());
                  fuse_reply_write(req, *r);
                });
}

fs::Locks* LocksOf(fuse_req_t req) { return Ctx(req)->locks; }

const Error kNoLockManager = Error::Errno(ENOLCK, "the server has no lock manager");

fs::Locks::Request LockRequest(const fuse_file_info* fi, const struct flock* l) {
  return fs::Locks::Request{fi->lock_owner, static_cast<uint32_t>(l->l_pid), l->l_type,
                            static_cast<uint64_t>(l->l_start), static_cast<uint64_t>(l->l_len)};
}

void Getlk(fuse_req_t req, fuse_ino_t, fuse_file_info* fi, struct flock* lock) {
  fs::Locks* locks = LocksOf(req);
  if (locks == nullptr) return ReplyError(req, kNoLockManager);
  struct flock l = *lock;
  locks->Get(File(fi)->inode->fh(), LockRequest(fi, &l), CredOf(req),
             [req, l](Result<std::optional<fs::Locks::Conflict>> r) mutable {
               if (!r) return ReplyError(req, r.error());
               if (!*r) {
                 l.l_type = F_UNLCK;
               } else {
                 l.l_type = static_cast<short>((*r)->type);
                 l.l_whence = SEEK_SET;
                 l.l_start = static_cast<off_t>((*r)->start);
                 l.l_len = static_cast<off_t>((*r)->length);
                 l.l_pid = (*r)->pid;
               }
               fuse_reply_lock(req, &l);
             });
}

// A lock request (fs/locks.h, "Data"): an unlock once the file's writes
// are on the server; a granted lock drops what the kernel cached of the
// file (and the SSD cache revalidates, by the GETATTR).
void SetLock(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi, const fs::Locks::Request& r, bool wait) {
  fs::Locks* locks = LocksOf(req);
  if (locks == nullptr) return ReplyError(req, kNoLockManager);
  fs::OpenFile* f = File(fi);
  const engine::Cred c = CredOf(req);
  if (r.type == F_UNLCK) {
    // (A write error stays for the file's fsync or close to report.)
    return Fs(req).ToServer(f, [req, locks, f, r, c](Result<Ok>) {
      locks->Set(f->inode->fh(), f, r, false, {}, c, ErrnoReply(req));
    });
  }
  locks->Set(f->inode->fh(), f, r, wait, [req] { return fuse_req_interrupted(req) != 0; }, c,
             [req, ino, c](Result<Ok> granted) {
               if (!granted) return ReplyError(req, granted.error());
               Fs(req).Getattr(c, ino, [req, ino](Result<fs::AttrOut> a) {
                 if (a) Fs(req).LockedAt(ino, static_cast<uint64_t>(a->st.st_size));
                 auto& drop = Ctx(req)->invalidate_data;
                 if (!drop) return (void)fuse_reply_err(req, 0);
                 drop(ino, [req] { fuse_reply_err(req, 0); });
               });
             });
}

void Setlk(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi, struct flock* lock, int sleep) {
  SetLock(req, ino, fi, LockRequest(fi, lock), sleep != 0);
}

// flock(2): a lock of the whole file, owned by the open file (as the Linux
// NFS client takes it).
void Flock(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi, int op) {
  const int kind = op & ~LOCK_NB;
  const int type = kind == LOCK_UN ? F_UNLCK : kind == LOCK_EX ? F_WRLCK : F_RDLCK;
  SetLock(req, ino, fi, fs::Locks::Request{fi->lock_owner, 0, type, 0, 0}, (op & LOCK_NB) == 0);
}

void Flush(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  // A close by the owner releases its fcntl locks on the file (POSIX),
  // before the close returns, once the file's writes are on the server.
  fs::Locks* locks = LocksOf(req);
  fs::OpenFile* f = File(fi);
  if (locks == nullptr || !Ctx(req)->posix_locks_to_server || !locks->MayHold(f->inode->fh(), fi->lock_owner)) {
    return Fs(req).Flush(CredOf(req), f, ErrnoReply(req));
  }
  const engine::Cred c = CredOf(req);
  const uint64_t owner = fi->lock_owner;
  Fs(req).ToServer(f, [req, locks, f, c, owner](Result<Ok>) {
    // (The close then reports a write error as any close does.)
    locks->ReleaseOwner(f->inode->fh(), owner, c, [req, f, c](Result<Ok>) { Fs(req).Flush(c, f, ErrnoReply(req)); });
  });
}

void Fsync(fuse_req_t req, fuse_ino_t, int, fuse_file_info* fi) {
  Fs(req).Fsync(CredOf(req), File(fi), ErrnoReply(req));
}

void Release(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  // The last close of an open file: its OFD and flock locks go (those of
  // owners that locked only through it), once its writes are on the server.
  fs::Locks* locks = LocksOf(req);
  fs::OpenFile* f = File(fi);
  fs::Filesystem& fs = Fs(req);
  if (locks == nullptr || !locks->MayHoldThrough(f->inode->fh(), f)) {
    fs.Release(f);
    return (void)fuse_reply_err(req, 0);
  }
  const engine::Cred c = CredOf(req);
  fuse_reply_err(req, 0);  // (the kernel does not wait for a release)
  fs.ToServer(f, [&fs, locks, f, c](Result<Ok>) {
    locks->ReleaseFile(f->inode->fh(), f, c, [&fs, f](Result<Ok>) { fs.Release(f); });
  });
}

void Opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Fs(req).Opendir(CredOf(req), ino, [req, fi_copy = *fi](Result<fs::DirHandle*> r) mutable {
    if (!r) return ReplyError(req, r.error());
    fi_copy.fh = reinterpret_cast<uint64_t>(*r);
    fi_copy.cache_readdir = 0;
    fs::Filesystem& fs = Fs(req);  // a reply frees `req`
    if (fuse_reply_open(req, &fi_copy) != 0) fs.Releasedir(*r);
  });
}

bool IsDot(const std::string& n) { return n == "." || n == ".."; }

// Fills `buf` with the entries after `off`; for READDIRPLUS counts a lookup for
// each entry that fits (and only those: the kernel drops what does not fit),
// and lists those inodes in `*interned`.
size_t FillDir(fuse_req_t req, fs::DirHandle* d, std::vector<char>& buf, off_t off, bool plus,
               std::vector<uint64_t>* interned) {
  size_t used = 0;
  MutexLock lock(d->mu);
  for (size_t i = static_cast<size_t>(off); i < d->entries.size(); ++i) {
    const nfs::DirEntry& e = d->entries[i];
    const off_t next = static_cast<off_t>(i + 1);
    struct stat st {};
    st.st_ino = e.fileid;
    if (e.attr) st = fs::ToStat(*e.attr, 0);
    const size_t room = buf.size() - used;
    size_t need;
    if (plus) {
      fuse_entry_param p{};
      p.attr = st;
      need = fuse_add_direntry_plus(req, nullptr, 0, e.name.c_str(), &p, next);
      if (need > room) break;
      if (!IsDot(e.name) && e.fh && e.attr) {
        p = ToParam(Fs(req).InternEntry(e));
        interned->push_back(p.ino);
      }
      fuse_add_direntry_plus(req, buf.data() + used, room, e.name.c_str(), &p, next);
    } else {
      need = fuse_add_direntry(req, nullptr, 0, e.name.c_str(), &st, next);
      if (need > room) break;
      fuse_add_direntry(req, buf.data() + used, room, e.name.c_str(), &st, next);
    }
    used += need;
  }
  return used;
}

void DoReaddir(fuse_req_t req, size_t size, off_t off, fuse_file_info* fi, bool plus) {
  Fs(req).Readdir(CredOf(req), Dir(fi), static_cast<uint64_t>(off), plus,
                  [req, size, off, plus](Result<fs::DirHandle*> r) {
                    if (!r) return ReplyError(req, r.error());
                    std::vector<char> buf(size);
                    std::vector<uint64_t> interned;
                    const size_t used = FillDir(req, *r, buf, off, plus, &interned);
                    // After the reply the kernel may release the handle at once:
                    // the handle's lock must be free and the handle untouched by then.
                    fs::Filesystem& fs = Fs(req);  // a reply frees `req`
                    if (fuse_reply_buf(req, buf.data(), used) != 0) {
                      // The kernel did not take the entries (request interrupted):
                      // the lookups they counted are undone.
                      for (uint64_t ino : interned) fs.Forget(ino, 1);
                    }
                  });
}

void Readdir(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info* fi) {
  DoReaddir(req, size, off, fi, false);
}

void Readdirplus(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info* fi) {
  DoReaddir(req, size, off, fi, true);
}

void Releasedir(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  Fs(req).Releasedir(Dir(fi));
  fuse_reply_err(req, 0);
}

void Fsyncdir(fuse_req_t req, fuse_ino_t, int, fuse_file_info*) {
  // NFSv3 directory operations are synchronous on the server already.
  fuse_reply_err(req, 0);
}

void Statfs(fuse_req_t req, fuse_ino_t ino) {
  Fs(req).Statfs(CredOf(req), ino, [req](Result<struct statvfs> r) {
    if (!r) return ReplyError(req, r.error());
    fuse_reply_statfs(req, &*r);
  });
}

void Access(fuse_req_t req, fuse_ino_t ino, int mask) {
  Fs(req).Access(CredOf(req), ino, mask, ErrnoReply(req));
}

// NFSv3 has no extended attributes (and mpnfs does not speak NFSACL).
// ENOSYS: the kernel answers EOPNOTSUPP itself from then on, instead of
// asking (it asks for security.capability before every write).
void Setxattr(fuse_req_t req, fuse_ino_t, const char*, const char*, size_t, int) {
  fuse_reply_err(req, ENOSYS);
}
void Getxattr(fuse_req_t req, fuse_ino_t, const char*, size_t) { fuse_reply_err(req, ENOSYS); }
void Listxattr(fuse_req_t req, fuse_ino_t, size_t) { fuse_reply_err(req, ENOSYS); }
void Removexattr(fuse_req_t req, fuse_ino_t, const char*) { fuse_reply_err(req, ENOSYS); }
void Fallocate(fuse_req_t req, fuse_ino_t, int, off_t, off_t, fuse_file_info*) {
  fuse_reply_err(req, EOPNOTSUPP);  // NFSv3 has no ALLOCATE; glibc falls back to writing
}

fuse_lowlevel_ops MakeOps() {
  fuse_lowlevel_ops o{};
  o.init = Init;
  o.lookup = Lookup;
  o.forget = Forget;
  o.forget_multi = ForgetMulti;
  o.getattr = Getattr;
  o.setattr = Setattr;
  o.readlink = Readlink;
  o.mknod = Mknod;
  o.mkdir = Mkdir;
  o.unlink = Unlink;
  o.rmdir = Rmdir;
  o.symlink = Symlink;
  o.rename = Rename;
  o.link = Link;
  o.open = Open;
  o.create = Create;
  o.read = Read;
  o.write_buf = WriteBuf;
  o.flush = Flush;
  o.getlk = Getlk;
  o.setlk = Setlk;
  o.flock = Flock;
  o.fsync = Fsync;
  o.release = Release;
  o.opendir = Opendir;
  o.readdir = Readdir;
  o.readdirplus = Readdirplus;
  o.releasedir = Releasedir;
  o.fsyncdir = Fsyncdir;
  o.statfs = Statfs;
  o.access = Access;
  o.setxattr = Setxattr;
  o.getxattr = Getxattr;
  o.listxattr = Listxattr;
  o.removexattr = Removexattr;
  o.fallocate = Fallocate;
  return o;
}

}  // namespace

engine::Cred CredCache::For(fuse_req_t req) {
  const fuse_ctx* c = fuse_req_ctx(req);
  const auto now = std::chrono::steady_clock::now();
  {
    MutexLock lock(mu_);
    auto it = by_pid_.find(c->pid);
    if (it != by_pid_.end() && it->second.expires > now && it->second.cred.uid == c->uid &&
        it->second.cred.gid == c->gid) {
      return it->second.cred;
    }
  }
  engine::Cred cred;
  cred.uid = c->uid;
  cred.gid = c->gid;
  std::vector<gid_t> groups;
  if (c->pid > 0 && ReadGroups(c->pid, &groups)) {  // not fuse_req_getgroups: proc_groups.h
    for (gid_t g : groups) {
      if (g == c->gid) continue;
      if (cred.groups.size() == engine::Cred::kMaxGroups) break;
      cred.groups.push_back(g);
    }
  }
  MutexLock lock(mu_);
  if (by_pid_.size() > 4096) by_pid_.clear();
  by_pid_[c->pid] = Entry{cred, now + std::chrono::seconds(1)};
  return cred;
}

const fuse_lowlevel_ops* Operations() {
  static const fuse_lowlevel_ops ops = MakeOps();
  return &ops;
}

}  // namespace mpnfs::fuse
