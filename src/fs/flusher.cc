#include "fs/flusher.h"

#include <algorithm>
#include <future>
#include <map>
#include <set>

#include "common/log.h"
#include "fs/whole_write.h"

namespace mpnfs::fs {
namespace {

// Data in flight per round: small for age-based flushing, so that the
// application's calls are not queued behind it on a slow path; larger above
// the high watermark, when the cache must make room; largest on request.
constexpr uint64_t kAgeRound = 1 << 20;
constexpr uint64_t kBackgroundRound = 8 << 20;
constexpr uint64_t kUrgentRound = 32 << 20;
constexpr int kMaxFruitlessRounds = 10;

// One WRITE of the round: neighbouring runs of one file and writer.
struct Call {
  std::string fh;
  uint64_t off = 0;
  engine::Cred cred;
  size_t len = 0;
  std::vector<size_t> runs;  // indexes into the round's runs
  nfs::Buffer buf;
  // The verifiers of its parts answered UNSTABLE (a short WRITE is
  // continued: fs/whole_write.h); none: all FILE_SYNC.
  std::vector<uint64_t> verfs;
  bool ok = false;
  std::optional<Error> err;
  bool resent = false;  // written again FILE_SYNC after the COMMIT
};

}  // namespace

struct Flusher::RoundState {
  Mutex mu;
  CondVar cv;
  std::vector<Call> calls;  // guarded by mu once sent
  size_t left GUARDED_BY(mu) = 0;  // calls not answered yet
  std::map<std::string, Result<nfs::CommitReply>> commits;
  std::map<std::string, GoneCheck::Outcome> gone;  // files answered ESTALE: asked
};

Flusher::Flusher(nfs::Client& nfs, std::shared_ptr<cache::BlockCache> cache, uint32_t wsize,
                 nfs::Fh root, WriteHook before_write)
    : nfs_(nfs),
      cache_(std::move(cache)),
      wsize_(std::max<uint32_t>(wsize, 4096)),
      before_write_(std::move(before_write)),
      gone_(nfs, std::move(root)) {
  thread_ = std::thread([this] { Main(); });
}

Flusher::~Flusher() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  thread_.join();
  // Requests never served (stopped first): say so.
  for (auto& r : requests_) r.done(Error::Errno(EIO, "the flusher stopped"));
}

void Flusher::Flush(const std::string& fh, std::function<void(Result<Ok>)> done) {
  {
    MutexLock lock(mu_);
    if (!stop_) {
      requests_.push_back(Request{fh, std::move(done)});
      cv_.SignalAll();
      return;
    }
  }
  done(Error::Errno(EIO, "the flusher stopped"));
}

void Flusher::Interrupt() {
  std::shared_ptr<RoundState> r;
  {
    MutexLock lock(send_mu_);
    interrupted_ = true;
    r = std::move(round_);
  }
  gone_.Cancel();  // (nor any question about a file's writes)
  if (r) {
    MutexLock lock(r->mu);
    r->cv.SignalAll();
  }
}

Result<Ok> Flusher::FlushAll() {
  std::promise<Result<Ok>> p;
  auto f = p.get_future();
  Flush("", [&p](Result<Ok> r) { p.set_value(std::move(r)); });
  return f.get();
}

Result<uint64_t> Flusher::Round(const std::string& fh, uint64_t max_bytes,
                                std::chrono::steady_clock::time_point older_than, bool* pending,
                                const std::set<std::string>& skip, Kept* kept,
                                std::set<std::string>* files_sent, bool* deferred) {
  if (interrupted_) return Error::Errno(EINTR, "flushing interrupted");
  bool failed = false;
  std::vector<cache::DirtyRun> runs = cache_->CollectDirty(max_bytes, fh, older_than, &skip, &failed);
  if (files_sent) {
    for (const auto& r : runs) files_sent->insert(r.fh);
  }
  *pending = !runs.empty();
  if (runs.empty()) {
    // Unflushed pages left that could not be read back: not "all flushed".
    if (failed) return Error::Errno(EIO, "reading unflushed data back from the cache disk failed");
    return uint64_t{0};
  }
  // Join neighbours (runs come in file order) into calls of up to wsize.
  std::vector<Call> calls;
  for (size_t i = 0; i < runs.size(); ++i) {
    const auto& r = runs[i];
    Call* last = calls.empty() ? nullptr : &calls.back();
    if (last && last->fh == r.fh && last->cred.uid == r.uid && last->cred.gid == r.gid &&
        last->cred.groups == r.groups && last->off + last->len == r.off &&
        last->len + r.data.size() <= wsize_) {
      last->runs.push_back(i);
      last->len += r.data.size();
      continue;
    }
    Call c;
    c.fh = r.fh;
    c.off = r.off;
    c.cred.uid = r.uid;
    c.cred.groups = r.groups;
    c.cred.gid = r.gid;
    c.runs.push_back(i);
    c.len = r.data.size();
    calls.push_back(std::move(c));
  }
  // Send every WRITE, then wait for all. The calls' state lives as long as
  // they do: an interrupted round stops waiting for them.
  auto st = std::make_shared<RoundState>();
  st->calls = std::move(calls);
  auto send = [this, &st](auto&& fn) -> bool {
    MutexLock lock(send_mu_);
    if (interrupted_) return false;
    round_ = st;
    fn();
    return true;
  };
  auto wait = [this, &st] {
    MutexLock lock(st->mu);
    while (!(st->left == 0 || interrupted_)) st->cv.Wait(st->mu);
    return st->left == 0;
  };
  // Sends call `i` (under send_mu_, with st->left counting it).
  auto send_call = [this, &st, deferred](size_t i, bool stable) {
    Call& c = st->calls[i];
    if (before_write_ && !before_write_(c.fh, c.off, c.len)) {
      // Held back (see WriteHook): neither clean nor failed this round.
      if (deferred) *deferred = true;
      MutexLock lock(st->mu);
      if (--st->left == 0) st->cv.SignalAll();
      return;
    }
    WholeWrite w;
    w.fh = c.fh;
    w.off = c.off;
    w.data = c.buf;
    w.len = c.len;
    w.stable = stable;
    w.cred = c.cred;
    w.cache = cache_;
    w.invalidate = false;  // (it carries what the cache holds)
    SendWholeWrite(
        nfs_, std::move(w),
        [st, i](const nfs::WriteReply& r, uint64_t, size_t) {
          if (r.stable) return;
          MutexLock lock(st->mu);
          st->calls[i].verfs.push_back(r.verf);
        },
        [st, i](Result<Ok> r) {
          MutexLock lock(st->mu);
          Call& c = st->calls[i];
          if (r) {
            c.ok = true;
          } else {
            c.err = r.error();
          }
          if (--st->left == 0) st->cv.SignalAll();
        });
  };
  for (Call& c : st->calls) {
    auto bytes = std::make_shared<nfs::Bytes>(c.len);
    size_t at = 0;
    for (size_t k : c.runs) {
      std::copy(runs[k].data.begin(), runs[k].data.end(), bytes->data() + at);
      at += runs[k].data.size();
    }
    c.buf = bytes;
  }
  const bool sent = send([&] {
    {
      MutexLock lock(st->mu);  // (no call is out yet)
      st->left = st->calls.size();
    }
    for (size_t i = 0; i < st->calls.size(); ++i) send_call(i, /*stable=*/false);
  });
  if (!sent || !wait()) return Error::Errno(EINTR, "flushing interrupted");
  // COMMIT each file that took UNSTABLE writes.
  std::map<std::string, engine::Cred> files;
  for (const auto& c : st->calls) {
    if (c.ok && !c.verfs.empty()) files.emplace(c.fh, c.cred);
  }
  const bool committing = send([&] {
    {
      MutexLock lock(st->mu);  // (no call is out yet)
      st->left = files.size();
    }
    for (const auto& [f, cred] : files) {
      nfs_.Commit(f, cred, [st, f = f](Result<nfs::CommitReply> r) {
        MutexLock lock(st->mu);
        st->commits.emplace(f, std::move(r));
        if (--st->left == 0) st->cv.SignalAll();
      });
    }
  });
  if (!committing || !wait()) return Error::Errno(EINTR, "flushing interrupted");
  auto& commits = st->commits;
  // Data the COMMIT does not cover (the server restarted and may have lost
  // it) is written again at once, FILE_SYNC (nfs::CommitCovers).
  std::vector<size_t> again;
  for (size_t i = 0; i < st->calls.size(); ++i) {
    Call& c = st->calls[i];
    if (!c.ok || c.verfs.empty()) continue;
    auto& commit = commits.at(c.fh);
    if (commit && !std::all_of(c.verfs.begin(), c.verfs.end(),
                               [&](uint64_t v) { return nfs::CommitCovers(v, *commit); })) {
      c.ok = false;
      c.verfs.clear();
      c.resent = true;
      again.push_back(i);
    }
  }
  if (!again.empty()) {
    Log("flush")->warn("the server's write verifier changed while flushing (a restart?): writing {} "
                       "call(s) again, FILE_SYNC", again.size());
    const bool resent = send([&] {
      {
        MutexLock lock(st->mu);  // (no call is out yet)
        st->left = again.size();
      }
      for (size_t i : again) send_call(i, /*stable=*/true);
    });
    if (!resent || !wait()) return Error::Errno(EINTR, "flushing interrupted");
  }
  auto& calls_done = st->calls;
  std::vector<cache::DirtyRun> clean;
  std::optional<Error> first_err;
  std::map<std::string, uint64_t> stale;  // file -> bytes of its calls answered ESTALE
  uint64_t bytes = 0;
  for (auto& c : calls_done) {
    bool ok = c.ok;
    if (ok && !c.verfs.empty()) {
      // Answered UNSTABLE: clean only if the COMMIT covers it (a resend
      // answered UNSTABLE again, by a server that breaks FILE_SYNC, is
      // covered by no COMMIT of this round: dirty, for the next).
      auto it = commits.find(c.fh);
      if (it == commits.end() || c.resent) {
        ok = false;
      } else if (!it->second) {
        ok = false;
        c.err = it->second.error();
      } else if (!std::all_of(c.verfs.begin(), c.verfs.end(),
                              [&](uint64_t v) { return nfs::CommitCovers(v, *it->second); })) {
        ok = false;
      }
    }
    if (c.err && c.err->err == ESTALE) {
      stale[c.fh] += c.len;  // (asked below)
      continue;
    }
    if (c.err && !first_err) first_err = c.err;
    if (!ok) continue;
    for (size_t k : c.runs) {
      bytes += runs[k].data.size();
      clean.push_back(std::move(runs[k]));
    }
  }
  cache_->Flushed(clean);
  if (!stale.empty()) {
    // Is each really gone? (Asked after the clean runs are marked: the
    // writers asked as are those whose writes still wait.) If so, its
    // writes are dropped (GoneCheck::AskToDrop).
    const bool asking = send([&] {
      {
        MutexLock lock(st->mu);  // (no call is out yet)
        st->left = stale.size();
      }
      for (const auto& [f, n] : stale) {
        const bool asked = gone_.AskToDrop(cache_, f, nullptr, [st, f = f](GoneCheck::Outcome o) {
          MutexLock lock(st->mu);
          st->gone.emplace(f, o);
          if (--st->left == 0) st->cv.SignalAll();
        });
        if (!asked) {
          bytes += n;  // (nothing of it waits any more)
          MutexLock lock(st->mu);
          if (--st->left == 0) st->cv.SignalAll();
        }
      }
    });
    if (!asking || !wait()) return Error::Errno(EINTR, "flushing interrupted");
    for (const auto& [f, o] : st->gone) {
      using Drop = cache::BlockCache::DropResult;
      switch (o.answer) {
        case GoneCheck::Answer::kGone:
          switch (o.dropped) {
            case Drop::kDropped:
              Log("flush")->warn("a file with unflushed writes is gone from the server (ESTALE); "
                                 "its cached writes are dropped");
              break;
            case Drop::kPartial:
              Log("flush")->warn("a file with unflushed writes is gone from the server (ESTALE); "
                                 "its cached writes are dropped, but those made while the server was "
                                 "asked (asked about at its next flush)");
              break;
            case Drop::kNothing:
              break;  // (dropped or flushed meanwhile)
          }
          bytes += stale[f];  // (progress)
          break;
        case GoneCheck::Answer::kLive:
          cache_->NoteFlushError();
          kept->emplace(f, Error::Errno(EIO, "the server answered a flush with ESTALE, but the file "
                                             "itself still answers: its cached writes are kept"));
          break;
        case GoneCheck::Answer::kNoExport:
          // The server cannot tell about any file now: the round fails
          // (retried as a whole, not file by file).
          if (!first_err) {
            first_err = Error::Errno(EIO, "the server answered a flush with ESTALE, and its export's root "
                                          "does not answer either (exports not loaded, a failover?): "
                                          "cached writes are kept");
          }
          break;
      }
    }
  }
  if (first_err) {
    cache_->NoteFlushError();
    return *first_err;
  }
  return bytes;
}

Result<Ok> Flusher::Drain(const std::string& fh) {
  int fruitless = 0;
  auto hold = std::chrono::milliseconds(10);  // the wait after a round held WRITEs back
  Kept kept;  // files whose writes had to be kept: left out of the next rounds
  std::set<std::string> skip;
  while (true) {
    {
      MutexLock lock(mu_);
      if (stop_) return Error::Errno(EIO, "the flusher stopped");
    }
    bool pending = false, deferred = false;
    const size_t kept_before = kept.size();
    auto r = Round(fh, kUrgentRound, std::chrono::steady_clock::now(), &pending, skip, &kept, nullptr,
                   &deferred);
    if (!r) return r.error();
    for (const auto& [f, e] : kept) skip.insert(f);
    if (!pending) break;
    if (deferred) {
      // Writes of the filesystem's own are on their way over some pages:
      // those go once they are answered, however long that takes (as any
      // write on a hard mount). Not a round without progress; the wait
      // doubles, up to 1 s, while it lasts (each round reads the dirty
      // pages back from the cache disk).
      if (*r == 0) {
        std::this_thread::sleep_for(hold);
        hold = std::min<std::chrono::milliseconds>(hold * 2, std::chrono::seconds(1));
      } else {
        hold = std::chrono::milliseconds(10);
      }
      continue;
    }
    if (*r == 0 && kept.size() == kept_before && ++fruitless >= kMaxFruitlessRounds) {
      return Error::Errno(EIO, "flushing makes no progress (the server keeps losing unstable writes)");
    }
  }
  cache_->EmptyBrokenIndex();
  if (cache_->StaleClaims(fh)) {
    // The cache disk's index broke before it could say these pages are
    // clean, and a restart would send them again: nothing may be written
    // over them until it is emptied, which takes every file flushed.
    if (!fh.empty()) {
      auto all = Drain("");
      if (!all) return all.error();
      cache_->EmptyBrokenIndex();
    }
    if (cache_->StaleClaims(fh)) {
      return Error::Errno(EIO, "the cache disk's index broke and cannot be emptied: it may still declare "
                               "flushed writes unflushed, which a restart would send again over newer data");
    }
  }
  if (!kept.empty()) {
    // (The caller logs it.)
    const Error& e = kept.begin()->second;
    if (kept.size() == 1) return e;
    return Error::Errno(e.err, std::to_string(kept.size()) + " files' cached writes kept (" + e.what + ")");
  }
  return Ok{};
}

void Flusher::Main() {
  auto log = Log("flush");
  const auto& o = cache_->options();
  bool above_low = false;
  auto retry_at = std::chrono::steady_clock::now();
  bool busy = false;  // the last background round left more to do
  auto last_background = std::chrono::steady_clock::now();
  MutexLock lock(mu_);
  while (!stop_) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(busy ? 0 : 200);
    while (!(stop_ || !requests_.empty()) && cv_.WaitUntil(mu_, until)) {
    }
    if (stop_) break;
    if (!requests_.empty()) {
      Request req = std::move(requests_.front());
      requests_.pop_front();
      lock.Unlock();
      auto r = Drain(req.fh);
      if (!r) log->warn("flush failed: {}", r.error().what);
      req.done(std::move(r));
      lock.Lock();
      if (stop_) break;
      // Requests that keep coming must not starve the watermark and age
      // rounds: one goes between them at the idle cadence (not after every
      // request, which would queue each behind a round).
      if (std::chrono::steady_clock::now() - last_background < std::chrono::milliseconds(200)) continue;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now < retry_at || interrupted_) {
      busy = false;  // (no spinning while interrupted)
      continue;
    }
    last_background = now;
    lock.Unlock();
    // Background: watermarks, then age.
    const auto level = cache_->Dirty();
    const uint64_t pct = level.slots ? level.blocks * 100 / level.slots : 0;
    if (pct >= o.dirty_high || (level.urgent && level.blocks > 0)) above_low = true;
    if (pct < o.dirty_low && !level.urgent) above_low = false;
    if (level.blocks == 0) above_low = false;
    const auto age = std::chrono::seconds(o.dirty_age_s);
    Result<uint64_t> r = uint64_t{0};
    bool pending = false;
    std::set<std::string> skip;
    for (const auto& [f, b] : backoff_) {
      if (b.until > now) skip.insert(f);
    }
    Kept kept;
    std::set<std::string> sent;
    if (above_low) {
      r = Round("", kBackgroundRound, now, &pending, skip, &kept, &sent);
    } else if (level.blocks > 0 && level.oldest >= age) {
      r = Round("", kAgeRound, now - age, &pending, skip, &kept, &sent);
    }
    // Files sent again and not kept this time start afresh (as do files
    // with nothing left to flush).
    for (auto it = backoff_.begin(); it != backoff_.end();) {
      const bool done = it->second.until <= now && !kept.count(it->first) &&
                        (sent.count(it->first) || cache_->DirtyWriters(it->first).empty());
      it = done ? backoff_.erase(it) : std::next(it);
    }
    for (const auto& [f, e] : kept) {
      Backoff& b = backoff_[f];
      const auto wait = std::chrono::seconds(1) * (1 << std::min(b.tries, 5));
      b.until = std::chrono::steady_clock::now() + std::min<std::chrono::steady_clock::duration>(wait, std::chrono::seconds(30));
      b.tries++;
      log->warn("{} (retrying in {} s)", e.what,
                std::chrono::duration_cast<std::chrono::seconds>(b.until - std::chrono::steady_clock::now()).count() + 1);
    }
    if (!r) {
      log->warn("background flush failed: {} (dirty data kept; retrying in 1 s)", r.error().what);
      retry_at = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    } else if (pending && *r == 0 && kept.empty()) {
      // Nothing became clean (the server keeps losing the unstable writes
      // before their COMMIT): going round again at once would spin.
      log->warn("background flush made no progress (dirty data kept; retrying in 1 s)");
      retry_at = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    }
    lock.Lock();
    last_background = std::chrono::steady_clock::now();  // (from its end: a long round counts whole)
    busy = r && pending && *r > 0;  // more may be due: go round again at once
  }
}

}  // namespace mpnfs::fs
