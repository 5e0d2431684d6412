// Filesystem: the data write path (write, write-behind, COMMIT and resends,
// fsync, close) and its error reporting. See "Writes" in filesystem.h.
#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>

#include "fs/cache_version.h"
#include "fs/filesystem.h"
#include "fs/gather.h"
#include "fs/split.h"
#include "fs/whole_write.h"

namespace mpnfs::fs {

void Filesystem::EndPlace(const InodeP& inode, WriteOrder::Seq seq, const std::function<void()>& then) {
  std::vector<std::function<void()>> run;
  {
    MutexLock lock(inode->writes.mu);
    run = inode->writes.Finish(seq);
  }
  if (then) then();
  for (auto& fn : run) fn();
}

void Filesystem::SendWrite(const InodeP& inode, const Cred& c, WriteOrder::Seq seq, uint64_t off,
                           nfs::Buffer data, size_t buf_off, size_t len, bool stable,
                           std::function<void(Result<Ok>)> done, bool admit) {
  SendWriteCall(inode, c, seq, off, std::move(data), buf_off, len, stable,
                [inode, seq, done = std::move(done)](Result<Ok> res) {
                  EndPlace(inode, seq, [&] { done(std::move(res)); });
                },
                admit);
}

void Filesystem::SendWriteCall(const InodeP& inode, const Cred& c, WriteOrder::Seq seq, uint64_t off,
                               nfs::Buffer data, size_t buf_off, size_t len, bool stable,
                               std::function<void(Result<Ok>)> done, bool admit) {
  WholeWrite w;
  w.fh = inode->fh();
  w.off = off;
  w.data = data;
  w.buf_off = buf_off;
  w.len = len;
  w.stable = stable;
  w.cred = c;
  w.cache = cache_.load();
  w.admit = admit;
  // Each answered part: kept for COMMIT (UNSTABLE) or recorded as newer
  // durable data, and the attributes it brings.
  auto answered = [this, inode, c, seq, off, data = std::move(data), buf_off](const nfs::WriteReply& r,
                                                                           uint64_t poff, size_t n) {
    bool mode_changed = false;
    {
      MutexLock lock(inode->mu);
      {
        MutexLock wl(inode->writes.mu);
        inode->writes.Wrote(poff + n);
        if (!r.stable) {
          inode->writes.Keep(
              std::make_shared<Buffered>(Buffered{poff, data, buf_off + (poff - off), n, r.verf, seq, c}));
        } else {
          inode->writes.Durable(seq, poff, n);
        }
      }
      if (r.wcc.after) {
        // The server cleared setuid/setgid (a write by a user without
        // CAP_FSETID): the kernel holds the old mode, and stat(1) asking
        // for the mode alone would be answered from it.
        mode_changed = r.wcc.after->mode != inode->mode;
        inode->mode = r.wcc.after->mode;
      }
      // Our own write moved mtime: keep close-to-open from dropping our cache.
      if (r.wcc.before && r.wcc.after && inode->have_open_attr && r.wcc.before->mtime == inode->open_mtime) {
        inode->open_mtime = r.wcc.after->mtime;
        inode->open_size = r.wcc.after->size;
      }
    }
    if (mode_changed && invalidate_attrs_) invalidate_attrs_(inode->ino());
  };
  SendWholeWrite(nfs_, std::move(w), std::move(answered), std::move(done));
}

void Filesystem::WhenDrained(const InodeP& inode, std::function<void()> fn) {
  {
    MutexLock lock(inode->writes.mu);
    if (inode->writes.WhenDrained(fn)) return;
  }
  fn();
}

std::optional<Error> Filesystem::TakeError(OpenFile* f) {
  MutexLock lock(f->inode->writes.mu);
  return f->inode->writes.TakeError(&f->err_seen);
}

bool Filesystem::CacheAdmits(const InodeP& inode, uint64_t off, size_t size) {
  // (Write-back mounts decided in Write() already.)
  auto cache = cache_.load();
  if (!cache || cache->mode() == cache::CacheMode::kWriteBack) return false;
  const bool admit = !cache->Sequential(inode->fh(), off, size, /*write=*/true);
  if (!admit) cache->NoteBypass(true);
  return admit;
}

void Filesystem::AdmitWrite(const InodeP& inode, const Cred& c, uint64_t off, nfs::Buffer data,
                            bool behind, bool stable, bool cache_admit, Cb<size_t> cb,
                            std::vector<std::function<void()>>* run) {
  const size_t size = data->size();
  auto pieces = SplitRange(off, size, StripePiece(size, nfs_.Parallelism(), opts_.wsize));
  auto op = std::make_shared<Gather>(pieces.size());
  inode->writes.WriteStarted();
  auto piece_done = [this, op, inode, c, size, behind, cb](Result<Ok> r) {
    if (!op->Done(r)) return;
    std::vector<std::function<void()>> next;
    {
      MutexLock lock(inode->writes.mu);
      if (behind && op->error()) {
        // Acknowledged data the server refused: every open file of the
        // inode learns it once (errseq).
        inode->writes.RecordError(*op->error());
        log_->warn("write-behind failed ({}); reported at the next fsync or close",
                   op->error()->what);
      }
      inode->writes.WriteEnded(NextSeq(), behind ? size : 0, opts_.write_behind, &next);
    }
    if (!behind) {
      if (op->error()) {
        cb(*op->error());
      } else {
        cb(size);
      }
    }
    for (auto& fn : next) fn();
    MaybeBackgroundCommit(inode);
  };
  for (const auto& p : pieces) {
    auto start = [this, inode, c, p, data, stable, cache_admit, piece_done](WriteOrder::Seq seq) {
      SendWrite(inode, c, seq, p.off, data, p.buf_off, p.len, stable, piece_done, cache_admit);
    };
    WriteOrder::Seq seq = 0;
    if (inode->writes.Admit(p.off, p.len, start, &seq)) {
      run->push_back([start, seq] { start(seq); });
    }
  }
}

void Filesystem::Write(const Cred& c, OpenFile* f, nfs::Buffer data, uint64_t off, int wflags,
                       Cb<size_t> cb) {
  InodeP inode = f->inode;
  const size_t size = data->size();
  if (size == 0) return cb(size_t{0});
  std::optional<uint64_t> at;
  if (AppendsHere(wflags) && !(wflags & O_DIRECT)) at = AppendOffset(inode, size);
  if (at) {
    // At the end as this gateway knows it (filesystem.h, "Appends"). When
    // that is not where the kernel put it, the kernel's size and pages are
    // stale: dropped once the write is answered, and at the next open. A
    // refused append gives its place back if no other took the end since.
    const bool moved = *at != off;
    if (moved) {
      MutexLock lock(inode->writes.mu);
      inode->writes.Doubt();
    }
    cb = [this, inode, at = *at, size, moved, cb = std::move(cb)](Result<size_t> r) {
      {
        MutexLock lock(inode->mu);
        --inode->appends_in_flight;
        if (!r && inode->append_end == at + size) inode->append_end = at;
      }
      cb(std::move(r));
      if (moved && invalidate_data_later_) invalidate_data_later_(inode->ino());
    };
    off = *at;
  } else {
    MutexLock lock(inode->mu);
    inode->append_end = std::max(inode->append_end, off + size);
  }
  // The kernel sends no FSYNC after a write on a direct-I/O open (nor after
  // an asynchronous direct write): the write's own O_DSYNC (RWF_DSYNC) is
  // all that says it must be durable when answered.
  const int flags = f->flags | (wflags & (O_DSYNC | O_SYNC | O_DIRECT));
  // An uncached write is counted when it starts and when it ends, so that
  // an open made while it was in flight does not use up the change; a
  // refused write when it ends, on every path (the kernel keeps the pages
  // of a refused mmap writeback as they are; only a write(2)'s are
  // dropped). The next open drops the kernel's pages (Open, filesystem.cc).
  const bool uncached = opts_.direct_io || (flags & O_DIRECT);
  if (uncached) {
    MutexLock lock(inode->writes.mu);
    inode->writes.Doubt();
  }
  cb = [inode, uncached, cb = std::move(cb)](Result<size_t> r) {
    if (uncached || !r) {
      MutexLock lock(inode->writes.mu);
      inode->writes.Doubt();
    }
    cb(std::move(r));
  };
  if (auto cache = cache_.load(); cache && cache->mode() == cache::CacheMode::kWriteBack) {
    uint32_t mode;
    {
      MutexLock lock(inode->mu);
      mode = inode->mode;
    }
    if (c.uid != 0 && (mode & (S_ISUID | S_ISGID))) {
      // Someone other than root writes a setuid or setgid file: the write
      // goes to the server now, which clears those bits by its rules, as a
      // local filesystem does when it takes the write (through the cache
      // the server would see it only when flushed).
      return WriteAround(c, f, std::move(data), off, flags, std::move(cb));
    }
    // A scan's writes bypass the cache, unless they overlap unflushed
    // writes (which must not land on the server after them).
    const bool seq = cache->Sequential(inode->fh(), off, size, /*write=*/true);
    if (!seq || cache->HasDirty(inode->fh(), off, size)) {
      // Write-behind of this file still on its way to the server lands
      // first: the flusher could otherwise send this write before it.
      return WhenDrained(inode, [this, c, f, data = std::move(data), off, flags,
                                 cb = std::move(cb)]() mutable {
        WriteBack(c, f, std::move(data), off, flags, {}, std::move(cb), 0);
      });
    }
    cache->NoteBypass(true);
  }
  WriteToServer(c, f, std::move(data), off, flags, std::move(cb));
}

void Filesystem::WriteBack(const Cred& c, OpenFile* f, nfs::Buffer data, uint64_t off, int flags,
                           std::map<uint64_t, std::string> base, Cb<size_t> cb, int attempt) {
  InodeP inode = f->inode;
  auto cache = cache_.load();
  if (!cache) return WriteToServer(c, f, std::move(data), off, flags, std::move(cb));
  cache::WbWrite w;
  w.fh = inode->fh();
  w.off = off;
  w.data = data->data();
  w.len = data->size();
  w.keep = data;
  w.uid = c.uid;
  w.groups = c.groups;
  w.gid = c.gid;
  w.base = std::move(base);
  // Runs on the cache's writer thread.
  auto done = [this, c, f, inode, data, off, flags, cb = std::move(cb), attempt,
               base = w.base](cache::WbOutcome o) mutable {
    switch (o.kind) {
      case cache::WbOutcome::kStored: {
        // O_SYNC includes O_DSYNC's bit; -o sync makes every write so.
        const bool sync = opts_.sync || (flags & O_DSYNC);
        if (!sync) return cb(data->size());  // durable at fsync
        const size_t n = data->size();
        auto cache = cache_.load();
        if (cache && !cache->options().fsync_server) {
          // Durable in the cache before it returns (or on the server, if
          // the cache cannot make it so).
          return cache->Durable(inode->fh(), [this, inode, cb = std::move(cb), n](bool ok) mutable {
            if (ok) return cb(n);
            FlushFileForSync(inode, [cb = std::move(cb), n](Result<Ok> r) {
              if (!r) return cb(r.error());
              cb(n);
            });
          });
        }
        // wb_fsync=server: an O_SYNC write is on the server when it returns.
        return FlushFileForSync(inode, [cb = std::move(cb), n](Result<Ok> r) {
          if (!r) return cb(r.error());
          cb(n);
        });
      }
      case cache::WbOutcome::kNeedPages: {
        if (attempt >= 8) break;  // keeps racing: go around the cache
        // Partial pages the cache does not hold: fetch the server's copies.
        auto got = std::make_shared<std::map<uint64_t, std::string>>(std::move(base));
        auto mu = std::make_shared<Mutex>();
        auto op = std::make_shared<Gather>(o.need.size());
        for (uint64_t page : o.need) {
          nfs_.Read(inode->fh(), page, 4096, c,
                    [this, c, f, data, off, flags, cb, attempt, got, mu, op, page](Result<nfs::ReadReply> r) mutable {
                      if (r) {
                        MutexLock lock(*mu);
                        (*got)[page] = std::string(r->data, std::min<size_t>(r->len, 4096));
                      }
                      if (!op->Done(r)) return;
                      if (op->error()) return cb(*op->error());
                      WriteBack(c, f, std::move(data), off, flags, std::move(*got), std::move(cb), attempt + 1);
                    });
        }
        return;
      }
      case cache::WbOutcome::kRetry:
        if (attempt >= 8) break;
        return WriteBack(c, f, std::move(data), off, flags, std::move(base), std::move(cb), attempt + 1);
      case cache::WbOutcome::kUnavailable:
        break;
    }
    WriteAround(c, f, std::move(data), off, flags, std::move(cb));
  };
  cache->WriteBack(std::move(w), std::move(done));
}

void Filesystem::WriteAround(const Cred& c, OpenFile* f, nfs::Buffer data, uint64_t off, int flags,
                             Cb<size_t> cb) {
  // Around the cache, to the server: after the file's unflushed writes
  // that this one overlaps, so that they cannot land after it.
  InodeP inode = f->inode;
  auto cache = cache_.load();
  if (cache && cache->HasDirty(inode->fh(), off, data->size())) {
    return FlushFile(inode, [this, c, f, data, off, flags, cb = std::move(cb)](Result<Ok> r) mutable {
      if (!r) return cb(r.error());
      WriteToServer(c, f, std::move(data), off, flags, std::move(cb));
    });
  }
  WriteToServer(c, f, std::move(data), off, flags, std::move(cb));
}

void Filesystem::WriteToServer(const Cred& c, OpenFile* f, nfs::Buffer data, uint64_t off, int flags,
                               Cb<size_t> cb) {
  InodeP inode = f->inode;
  const size_t size = data->size();
  // O_SYNC and O_DSYNC writes are FILE_SYNC: the kernel sends no FSYNC
  // after a direct write, so they must be durable when answered. (On Linux
  // O_SYNC includes O_DSYNC's bit.)
  bool stable = opts_.sync || (flags & O_DSYNC);
  bool behind = opts_.write_behind > 0 && !stable && !opts_.direct_io && !(flags & O_DIRECT);
  {
    // A small new file's first write goes FILE_SYNC (filesystem.h, "Small
    // new files"): its close then needs no COMMIT.
    // (Through f->inode, the same inode: OpenFile::fresh is guarded by it.)
    MutexLock lock(f->inode->mu);
    MutexLock wl(f->inode->writes.mu);
    // After a write-behind failure the file's writes wait for the server,
    // each returning its own error (FileWrites::Refused).
    if (f->inode->writes.Refused()) behind = false;
    // A write that makes the server clear setuid (or setgid on a
    // group-executable file: the server's rule) by a user other than root
    // waits for its reply, which tells the kernel the new mode
    // (SendWrite) before write() returns, as a local filesystem clears the
    // bits when it takes the write.
    const uint32_t mode = f->inode->mode;
    if (c.uid != 0 && ((mode & S_ISUID) || ((mode & S_ISGID) && (mode & S_IXGRP)))) behind = false;
    if (f->fresh) {
      f->fresh = false;
      if (off == 0 && size <= kSmallFileSync && f->inode->writes.Untouched()) stable = true;
    }
  }
  const bool cache_admit = CacheAdmits(inode, off, size);
  std::vector<std::function<void()>> run;
  if (!behind) {
    {
      MutexLock lock(inode->writes.mu);
      if (inode->writes.HasParked()) {
        // Acknowledged writes still wait for room in the window: this one
        // takes its place in the write order after them.
        lock.Unlock();
        return WhenDrained(inode, [this, c, f, data = std::move(data), off, flags, cb = std::move(cb)]() mutable {
          WriteToServer(c, f, std::move(data), off, flags, std::move(cb));
        });
      }
      AdmitWrite(inode, c, off, std::move(data), false, stable, cache_admit, std::move(cb), &run);
    }
    for (auto& fn : run) fn();
    return;
  }
  // Write-behind (page-cache opens only, as the kernel NFS client does): the
  // write is acknowledged once admitted; its data stays in memory until a
  // COMMIT covers it, and a failure is reported (once to each open file) by
  // the next fsync or close (never by a write: the kernel would turn it into
  // a short count of a split write and lose it). At most `write_behind`
  // bytes per file are outstanding; writes past that wait, in order.
  {
    MutexLock lock(inode->writes.mu);
    if (inode->writes.MustPark(size, opts_.write_behind)) {
      inode->writes.Park(size, [this, inode, c, off, data, cache_admit, cb](std::vector<std::function<void()>>* r)
                                   REQUIRES(inode->writes.mu) {
        // Runs under inode->writes.mu, from the completion that made room.
        inode->writes.Wrote(off + data->size());
        AdmitWrite(inode, c, off, data, true, false, cache_admit, nullptr, r);
        r->push_back([cb, n = data->size()] { cb(n); });
      });
      return;
    }
    inode->writes.Behind(size);
    // Acknowledged now: the size the application sees must include it.
    inode->writes.Wrote(off + size);
    AdmitWrite(inode, c, off, std::move(data), true, stable, cache_admit, nullptr, &run);
  }
  cb(size);
  for (auto& fn : run) fn();
}

void Filesystem::BeforeSetattr(const InodeP& inode, const nfs::SetAttr& sa,
                               std::function<void(Result<Ok>)> done) {
  using How = nfs::SetAttr::TimeHow;
  const bool attrs = sa.atime_how != How::kDontChange || sa.mtime_how != How::kDontChange ||
                     sa.mode || sa.uid || sa.gid;
  if (!attrs && !sa.size) return done(Ok{});
  // Write-behind and the write-back cache's unflushed writes land first; a
  // SETATTR of times, mode or owner also waits for a COMMIT of the kept
  // writes (as the kernel NFS client syncs a file before any SETATTR). Any
  // of them reaching the server later would undo it: a WRITE stamps the
  // server's mtime over times set by tar, cp -p or rsync, and clears a
  // setuid bit just set, and so does a resend after a server restart. (A
  // truncate's own ordering against writes and resends is the write
  // order's: SetattrNow.)
  auto after_flush = [this, inode, attrs, done](Result<Ok> r) mutable {
    if (!r) return done(r.error());
    WhenDrained(inode, [this, inode, attrs, done = std::move(done)]() mutable {
      if (!attrs) return done(Ok{});
      // Writes still on their way that were not written behind (O_DIRECT,
      // O_SYNC, another user's, resends) land first too: a place in the
      // write order after all of them, let go as soon as it is reached.
      auto reached = [this, inode, done](WriteOrder::Seq s) mutable {
        EndPlace(inode, s);
        Commit(inode, [inode, done = std::move(done)](Result<Ok> c) {
          if (c) return done(Ok{});
          // Data still kept (a COMMIT that failed, retried later) could be
          // resent after the SETATTR and undo it: the SETATTR fails
          // instead. Data a failed resend lost is reported at fsync or
          // close; the SETATTR goes on.
          bool kept;
          {
            MutexLock lock(inode->writes.mu);
            kept = inode->writes.HasKept();
          }
          if (kept) return done(c.error());
          done(Ok{});
        });
      };
      WriteOrder::Seq seq = 0;
      bool now;
      {
        MutexLock lock(inode->writes.mu);
        now = inode->writes.AdmitTail(0, reached, &seq);
      }
      if (now) reached(seq);
    });
  };
  if (auto cache = cache_.load(); cache && cache->SizeFloor(inode->fh()) > 0) {
    return FlushFile(inode, std::move(after_flush));
  }
  after_flush(Ok{});
}

void Filesystem::MaybeBackgroundCommit(const InodeP& inode) {
  {
    MutexLock lock(inode->writes.mu);
    if (!inode->writes.CommitDue(opts_.commit_threshold)) return;
  }
  Commit(inode, [this](Result<Ok> r) {
    if (!r) log_->warn("background COMMIT failed: {} (data is kept and retried)", r.error().what);
  });
}

void Filesystem::EndCommit(const InodeP& inode, Result<Ok> r, std::function<void(Result<Ok>)> cb) {
  std::vector<std::function<void(Result<Ok>)>> waiters;
  {
    MutexLock lock(inode->writes.mu);
    waiters = inode->writes.EndCommit();
  }
  cb(std::move(r));
  if (waiters.empty()) return;
  // Those who came during the round get a round of their own (it covers
  // every write answered before it starts).
  Commit(inode, [waiters = std::move(waiters)](Result<Ok> r2) {
    for (auto& w : waiters) w(r2);
  });
}

void Filesystem::Commit(const InodeP& inode, std::function<void(Result<Ok>)> cb) {
  std::vector<FileWrites::BufferedP> kept;
  {
    MutexLock lock(inode->writes.mu);
    switch (inode->writes.BeginCommit(&cb, &kept)) {
      case FileWrites::Begin::kQueued:
        return;
      case FileWrites::Begin::kNothingKept:
        lock.Unlock();
        return cb(Ok{});
      case FileWrites::Begin::kStarted:
        break;
    }
  }
  // COMMIT as a user who wrote the data (a reader's fsync must not need
  // write permission, nor commit with its own identity).
  const Cred writer = kept.back()->cred;
  nfs_.Commit(inode->fh(), writer, [this, inode, kept, cb = std::move(cb)](
                                       Result<nfs::CommitReply> r) mutable {
    if (!r) {
      {
        MutexLock lock(inode->writes.mu);
        inode->writes.CommitFailed(kept);
      }
      return EndCommit(inode, r.error(), std::move(cb));
    }
    log_->debug("COMMIT of {} kept writes: verifier {:#x}", kept.size(), r->verf);
    std::vector<FileWrites::BufferedP> lost = FileWrites::Lost(kept, *r);
    if (lost.empty()) return EndCommit(inode, Ok{}, std::move(cb));
    Resend(inode, kept, std::move(lost), std::move(cb));
  });
}

void Filesystem::Resend(const InodeP& inode, const std::vector<FileWrites::BufferedP>& kept,
                        std::vector<FileWrites::BufferedP> lost,
                        std::function<void(Result<Ok>)> cb) {
  // The server's write verifier changed: it restarted and may have lost
  // UNSTABLE data. Each lost write is sent again, FILE_SYNC, oldest first.
  // Each takes its place in the write order now, over its whole range: it
  // goes once every earlier overlapping write was answered, and what it
  // sends is decided then (FileWrites::ResendPieces: not what newer writes
  // that succeeded hold, nor what later truncates cut). Newer writes
  // admitted after it wait for it.
  auto round = std::make_shared<const std::vector<FileWrites::BufferedP>>(kept);
  auto rs = std::make_shared<Gather>(lost.size() + 1);  // +1: held until every resend is admitted
  auto one_done = [this, inode, rs, cb](Result<Ok> w) {
    if (!rs->Done(w)) return;
    if (rs->error()) {
      // The data is gone from the server: every open file learns it.
      MutexLock lock(inode->writes.mu);
      inode->writes.RecordError(*rs->error());
    }
    EndCommit(inode, rs->error() ? Result<Ok>(*rs->error()) : Result<Ok>(Ok{}), cb);
  };
  std::vector<std::function<void()>> run;
  uint64_t bytes = 0;
  {
    MutexLock lock(inode->writes.mu);
    for (const auto& b : lost) {
      bytes += b->len;
      auto start = [this, inode, round, b, one_done](WriteOrder::Seq seq) {
        ResendOne(inode, *round, b, seq, one_done);
      };
      WriteOrder::Seq seq = 0;
      if (inode->writes.Admit(b->off, b->len, start, &seq)) run.push_back([start, seq] { start(seq); });
    }
  }
  log_->warn("server write verifier changed (server restart?): resending {} writes ({} bytes at most)",
             lost.size(), bytes);
  for (auto& fn : run) fn();
  one_done(Ok{});
}

void Filesystem::ResendOne(const InodeP& inode, const std::vector<FileWrites::BufferedP>& kept,
                           const FileWrites::BufferedP& b, WriteOrder::Seq seq,
                           std::function<void(Result<Ok>)> done) {
  std::vector<FileWrites::Piece> pieces;
  {
    MutexLock lock(inode->writes.mu);
    pieces = inode->writes.ResendPieces(kept, b);
  }
  auto finish = [inode, seq, done = std::move(done)](Result<Ok> r) {
    EndPlace(inode, seq, [&] { done(std::move(r)); });
  };
  if (pieces.empty()) return finish(Ok{});
  auto g = std::make_shared<Gather>(pieces.size());
  for (const auto& p : pieces) {
    SendWriteCall(inode, b->cred, seq, p.off, b->buf, b->buf_off + (p.off - b->off), p.len, /*stable=*/true,
                  [g, finish](Result<Ok> r) {
                    if (!g->Done(r)) return;
                    finish(g->error() ? Result<Ok>(*g->error()) : Result<Ok>(Ok{}));
                  });
  }
}

void Filesystem::Fsync(const Cred& /*c*/, OpenFile* f, Cb<Ok> cb) {
  InodeP inode = f->inode;
  auto cache = cache_.load();
  if (cache && cache->mode() == cache::CacheMode::kWriteBack) {
    auto to_server = [this, f, inode](Cb<Ok> cb) {
      // The file's cached writes go to the server first.
      FlushFileForSync(inode, [this, f, cb = std::move(cb)](Result<Ok> r) mutable {
        if (!r) return cb(r.error());
        CommitAfterDrain(f, std::move(cb));
      });
    };
    if (cache->options().fsync_server) return to_server(std::move(cb));  // wb_fsync=server
    // Write-back writes answered so far become durable in the cache (a
    // commit); if the cache cannot make them so, they go to the server.
    return cache->Durable(inode->fh(), [this, f, to_server, cb = std::move(cb)](bool ok) mutable {
      if (!ok) return to_server(std::move(cb));
      CommitAfterDrain(f, std::move(cb));
    });
  }
  CommitAfterDrain(f, std::move(cb));
}

void Filesystem::ToServer(OpenFile* f, Cb<Ok> cb) {
  InodeP inode = f->inode;
  // (A write-back cache's data stays there: its mount is the export's only
  // one, so no other host reads the file before this mount flushes it.)
  WhenDrained(inode, [this, inode, cb = std::move(cb)]() mutable { Commit(inode, std::move(cb)); });
}

void Filesystem::FlushFileForSync(const InodeP& inode, std::function<void(Result<Ok>)> done) {
  FlushFile(inode, [this, inode, done = std::move(done)](Result<Ok> r) {
    if (!r) return done(std::move(r));
    // (Pages the cache disk lost, or could not read back to send.)
    if (auto cache = cache_.load(); cache && cache->TakeLost(inode->fh())) {
      {
        // (The kernel's pages hold what neither has: the next open drops them.)
        MutexLock lock(inode->writes.mu);
        inode->writes.Doubt();
      }
      return done(Error::Errno(EIO, "unflushed writes lost by the cache disk"));
    }
    done(Ok{});
  });
}

void Filesystem::CommitAfterDrain(OpenFile* f, Cb<Ok> cb) {
  InodeP inode = f->inode;
  WhenDrained(inode, [this, f, inode, cb = std::move(cb)]() mutable {
    if (auto e = TakeError(f)) return cb(*e);
    Commit(inode, [f, inode, cb = std::move(cb)](Result<Ok> r) {
      std::optional<Error> late;
      {
        MutexLock lock(f->inode->writes.mu);
        // An error this open file has not reported: a write-behind failure,
        // or data a failed resend lost (a round this one waited for, when
        // the round that then ran for this one had nothing left to commit).
        // It is told rather than a COMMIT failure whose data is kept and
        // retried; after it, this open need not hear of it again.
        late = f->inode->writes.TakeError(&f->err_seen);
        // Everything written before is on the server's disk and no failure
        // is unheard of here: write-behind may resume.
        if (r && !late) f->inode->writes.Resume();
      }
      if (late) return cb(*late);
      cb(std::move(r));
    });
  });
}

void Filesystem::Flush(const Cred& /*c*/, OpenFile* f, Cb<Ok> cb) {
  {
    // A close of a hidden file: its RELEASE, which removes the hidden name
    // if it is the last, may follow (fs/hidden_names.h). (Every close: the
    // RELEASE of another descriptor may not have come yet.)
    MutexLock lock(f->inode->mu);
    if (f->inode->silly) hidden_.Closing(f->inode->silly->dir, f->inode->ino());
  }
  // A read-only open has written nothing: its close neither commits other
  // users' data nor reports their errors (as the Linux client's flush).
  if ((f->flags & O_ACCMODE) == O_RDONLY) return cb(Ok{});
  // Close: what went to the server is committed (close-to-open); cached
  // write-back data stays in the cache (mpnfs(8), "Write-back").
  if (opts_.cto) return CommitAfterDrain(f, std::move(cb));
  // nocto: no commit on close, but write-behind errors are still reported.
  InodeP inode = f->inode;
  WhenDrained(inode, [this, f, cb = std::move(cb)] {
    if (auto e = TakeError(f)) return cb(*e);
    cb(Ok{});
  });
}

}  // namespace mpnfs::fs
