#include "fs/locks.h"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include "common/log.h"

namespace mpnfs::fs {
namespace {

namespace n4 = proto::nlm4;

Error StatError(n4::Stat s, const char* op) {
  return Error::Errno(n4::ErrnoOf(s), std::string(op) + ": " + n4::StatName(s));
}

nfs::LockRange RangeOf(const Locks::Request& r) {
  return nfs::LockRange{r.type == F_WRLCK, r.start, r.length};
}

}  // namespace

Locks::Locks(nfs::LockClient& nlm, std::array<char, 8> instance, std::function<Result<Ok>(bool)> may_hold,
             std::chrono::milliseconds check_every)
    : nlm_(nlm), instance_(instance), may_hold_(std::move(may_hold)), check_every_(check_every) {}

nfs::LockOwner Locks::OwnerOf(uint64_t owner) const {
  std::string oh(instance_.data(), instance_.size());
  for (int s = 56; s >= 0; s -= 8) oh.push_back(static_cast<char>(owner >> s));
  // svid: 31 bits of the owner id mixed with this mount's bytes (a server
  // that tells owners apart by svid alone, as Linux's lockd does, then
  // takes two mounts' owners for one only if those bits collide).
  uint64_t h = owner;
  for (char c : instance_) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  h ^= h >> 31;
  return nfs::LockOwner{std::move(oh), static_cast<int32_t>(h & 0x7fffffff)};
}

void Locks::Get(const nfs::Fh& fh, const Request& r, const nfs::Cred& c, nfs::Cb<std::optional<Conflict>> cb) {
  nlm_.Test(fh, OwnerOf(r.owner), RangeOf(r), c, [this, fh, r, c, cb = std::move(cb)](Result<n4::TestRes> t) {
    if (!t) return cb(t.error());
    if (t->stat == n4::Stat::kGranted) return cb(std::optional<Conflict>());
    if (t->stat == n4::Stat::kDeniedGracePeriod) {
      return timer_.After(kGracePoll, [this, fh, r, c, cb] { Get(fh, r, c, cb); });
    }
    if (t->stat != n4::Stat::kDenied) return cb(StatError(t->stat, "NLM4_TEST"));
    const n4::Holder& h = t->holder;
    Conflict k{h.exclusive ? F_WRLCK : F_RDLCK, h.offset, h.length, h.svid};
    if (h.oh.size() == 16 && std::equal(instance_.begin(), instance_.end(), h.oh.begin())) {
      uint64_t owner = 0;
      for (size_t i = 8; i < 16; ++i) owner = owner << 8 | static_cast<unsigned char>(h.oh[i]);
      MutexLock lock(mu_);
      if (auto p = pids_.find(owner); p != pids_.end()) k.pid = static_cast<int32_t>(p->second);
    }
    cb(std::optional<Conflict>(k));
  });
}

void Locks::Set(const nfs::Fh& fh, const void* file, const Request& r, bool wait,
                std::function<bool()> interrupted, const nfs::Cred& c, nfs::Cb<Ok> cb) {
  if (stopping_) return cb(Error::Errno(ESHUTDOWN, "the mount is ending"));
  // (Copies made only when the request must wait.)
  auto later = [&] { Later([this, fh, file, r, wait, interrupted, c, cb] { Set(fh, file, r, wait, interrupted, c, cb); }); };
  if (r.type == F_UNLCK) {
    {
      MutexLock lock(mu_);
      if (ReassertingLocked(fh)) {
        lock.Unlock();
        return later();
      }
      if (auto it = held_.find({fh, r.owner}); it != held_.end()) {
        it->second.ranges.Apply(r.start, LockRanges::EndOf(r.start, r.length), false, true);
        ++it->second.gen;
      }
    }
    return UnlockRange(fh, r.owner, r.start, r.length, c, std::move(cb));
  }
  bool busy = false;
  {
    MutexLock hold(hold_mu_);
    if (!marked_ && may_hold_) {
      if (auto ok = may_hold_(true); !ok) return cb(Error::Errno(ENOLCK, ok.error().what));
    }
    marked_ = true;
    MutexLock lock(mu_);
    busy = ReassertingLocked(fh);
    if (!busy) {
      Held& h = held_[{fh, r.owner}];
      h.files.insert(file);
      h.cred = c;
      ++h.pending;
      pids_[r.owner] = r.pid;
    }
  }
  if (busy) return later();
  Attempt(fh, file, r, wait, std::move(interrupted), c, std::move(cb), kFirstPoll);
}

void Locks::Attempt(const nfs::Fh& fh, const void* file, const Request& r, bool wait,
                    std::function<bool()> interrupted, const nfs::Cred& c, nfs::Cb<Ok> cb,
                    std::chrono::milliseconds next) {
  if (stopping_) {
    Answered({fh, r.owner}, file, Outcome::kRefused, r, c);
    return cb(Error::Errno(ESHUTDOWN, "the mount is ending"));
  }
  {
    // (A retry, too, waits while the file's locks are asked for again.)
    MutexLock lock(mu_);
    if (ReassertingLocked(fh)) {
      lock.Unlock();
      return Later([this, fh, file, r, wait, interrupted = std::move(interrupted), c, cb = std::move(cb),
                    next]() mutable { Attempt(fh, file, r, wait, std::move(interrupted), c, std::move(cb), next); });
    }
    ++held_[{fh, r.owner}].sending;
  }
  nlm_.Lock(fh, OwnerOf(r.owner), RangeOf(r), false, c,
            [this, fh, file, r, wait, interrupted = std::move(interrupted), c, cb = std::move(cb),
             next](Result<n4::Stat> s) mutable {
              const Key k{fh, r.owner};
              {
                MutexLock lock(mu_);
                if (auto it = held_.find(k); it != held_.end() && it->second.sending > 0) --it->second.sending;
              }
              if (!s) {
                // No answer: the server may have granted it (kept as held).
                Answered(k, file, Outcome::kUnknown, r, c);
                return cb(s.error());
              }
              std::chrono::milliseconds delay;
              if (*s == n4::Stat::kGranted) {
                Answered(k, file, Outcome::kGranted, r, c);
                if (stopping_) {
                  // Granted while the mount ends (after ReleaseAll took the
                  // list): given back at once.
                  nlm_.Unlock(fh, OwnerOf(r.owner), r.start, r.length, c, [](Result<n4::Stat>) {});
                  return cb(Error::Errno(ESHUTDOWN, "the mount is ending"));
                }
                return cb(Ok{});
              }
              if (*s == n4::Stat::kDeniedGracePeriod) {
                delay = kGracePoll;
              } else if (*s == n4::Stat::kDenied && wait) {
                delay = next;
                next = std::min(next * 2, kMaxPoll);
              } else {
                Answered(k, file, Outcome::kRefused, r, c);
                return cb(StatError(*s, "NLM4_LOCK"));
              }
              if ((interrupted && interrupted()) || stopping_) {
                Answered(k, file, Outcome::kRefused, r, c);
                return cb(Error::Errno(stopping_ ? ESHUTDOWN : EINTR,
                                       stopping_ ? "the mount is ending" : "lock wait interrupted"));
              }
              timer_.After(delay, [this, fh, file, r, wait, interrupted = std::move(interrupted), c,
                                   cb = std::move(cb), next]() mutable {
                Attempt(fh, file, r, wait, std::move(interrupted), c, std::move(cb), next);
              });
            });
}

void Locks::UnlockRange(const nfs::Fh& fh, uint64_t owner, uint64_t start, uint64_t length, const nfs::Cred& c,
                        nfs::Cb<Ok> cb) {
  nlm_.Unlock(fh, OwnerOf(owner), start, length, c,
              [this, fh, owner, start, length, c, cb = std::move(cb)](Result<n4::Stat> s) mutable {
                if (!s) return cb(s.error());
                if (*s == n4::Stat::kDeniedGracePeriod && !stopping_) {
                  // (A server in its grace period may refuse unlocks too.)
                  return timer_.After(kGracePoll, [this, fh, owner, start, length, c, cb = std::move(cb)]() mutable {
                    UnlockRange(fh, owner, start, length, c, std::move(cb));
                  });
                }
                if (*s != n4::Stat::kGranted) return cb(StatError(*s, "NLM4_UNLOCK"));
                cb(Ok{});
              });
}

void Locks::Answered(const Key& k, const void* file, Outcome o, const Request& r, const nfs::Cred& c) {
  {
    MutexLock lock(mu_);
    Held& h = held_[k];  // (a release may have taken it out meanwhile)
    if (h.pending > 0) --h.pending;
    if (o != Outcome::kRefused) {
      h.files.insert(file);
      h.cred = c;
      h.granted = true;  // (or may be: an unanswered request)
      if (o == Outcome::kGranted) {
        // (One left unanswered is not kept: its caller was told it failed.)
        h.ranges.Apply(r.start, LockRanges::EndOf(r.start, r.length), r.type == F_WRLCK, false);
        ++h.gen;
        ScheduleCheckLocked();
      }
      return;
    }
    // Forgotten if nothing of the owner's on the file was granted and no
    // other request for it is on its way.
    if (h.granted || h.pending > 0 || h.sending > 0) return;
    held_.erase(k);
    ForgetPidLocked(k.second);
  }
  MaybeNothingHeld();
}

void Locks::ForgetPidLocked(uint64_t owner) {
  for (const auto& [k, h] : held_) {
    if (k.second == owner) return;
  }
  pids_.erase(owner);
}

void Locks::Shutdown() { stopping_ = true; }

void Locks::MaybeNothingHeld() {
  {
    MutexLock lock(mu_);
    if (!held_.empty() || !may_hold_) return;
  }
  timer_.After(std::chrono::milliseconds(0), [this] {
    MutexLock hold(hold_mu_);
    {
      MutexLock lock(mu_);
      if (!held_.empty() || !marked_) return;
    }
    // (A failure leaves it marked: the worst is a restart told for nothing.)
    if (may_hold_(false)) marked_ = false;
  });
}

void Locks::ReleaseOwner(const nfs::Fh& fh, uint64_t owner, const nfs::Cred& c, nfs::Cb<Ok> cb) {
  {
    MutexLock lock(mu_);
    if (ReassertingLocked(fh)) {
      lock.Unlock();
      return Later([this, fh, owner, c, cb] { ReleaseOwner(fh, owner, c, cb); });
    }
    if (held_.erase({fh, owner}) == 0) return cb(Ok{});
    ForgetPidLocked(owner);
  }
  UnlockAll({{fh, owner}}, c, std::move(cb));
}

void Locks::ReleaseFile(const nfs::Fh& fh, const void* file, const nfs::Cred& c, nfs::Cb<Ok> cb) {
  std::vector<Key> gone;
  {
    MutexLock lock(mu_);
    if (ReassertingLocked(fh)) {
      lock.Unlock();
      return Later([this, fh, file, c, cb] { ReleaseFile(fh, file, c, cb); });
    }
    for (auto it = held_.lower_bound({fh, 0}); it != held_.end() && it->first.first == fh;) {
      if (it->second.files.erase(file) > 0 && it->second.files.empty() && it->second.pending == 0) {
        gone.push_back(it->first);
        it = held_.erase(it);
      } else {
        ++it;
      }
    }
    for (const auto& k : gone) ForgetPidLocked(k.second);
  }
  UnlockAll(std::move(gone), c, std::move(cb));
}

void Locks::ReleaseAll(const nfs::Cred& c, nfs::Cb<Ok> cb) {
  std::vector<Key> all;
  {
    MutexLock lock(mu_);
    if (reasserts_ > 0) {
      // (Shutdown came first: no reassert starts now, and one running
      // gives back what it is granted; its LOCKs land before these UNLOCKs.)
      lock.Unlock();
      return Later([this, c, cb] { ReleaseAll(c, cb); });
    }
    for (const auto& [k, h] : held_) all.push_back(k);
    held_.clear();
    pids_.clear();
  }
  UnlockAll(std::move(all), c, std::move(cb));
}

bool Locks::MayHold() const {
  MutexLock lock(mu_);
  return !held_.empty();
}

bool Locks::MayHold(const nfs::Fh& fh, uint64_t owner) const {
  MutexLock lock(mu_);
  return held_.count({fh, owner}) > 0;
}

bool Locks::MayHoldThrough(const nfs::Fh& fh, const void* file) const {
  MutexLock lock(mu_);
  for (auto it = held_.lower_bound({fh, 0}); it != held_.end() && it->first.first == fh; ++it) {
    if (it->second.files.count(file) > 0) return true;
  }
  return false;
}

bool Locks::ReassertingLocked(const nfs::Fh& fh) const {
  if (stopping_) return false;
  for (auto it = held_.lower_bound({fh, 0}); it != held_.end() && it->first.first == fh; ++it) {
    if (it->second.reasserting) return true;
  }
  return false;
}

void Locks::Later(std::function<void()> fn) { timer_.After(kFirstPoll, std::move(fn)); }

void Locks::ScheduleCheckLocked() {
  if (checking_ || stopping_ || check_every_.count() <= 0) return;
  checking_ = true;
  timer_.After(check_every_, [this] { Check(); });
}

void Locks::NextCheck() {
  MutexLock lock(mu_);
  checking_ = false;
  ScheduleCheckLocked();
}

void Locks::Check() {
  struct Probe {
    Key k;
    LockRanges::Range r;
    nfs::Cred cred;
    uint64_t gen = 0;
  };
  std::optional<Probe> p;
  {
    MutexLock lock(mu_);
    // The owners take turns (a file whose TEST keeps failing does not hide
    // a restart); an exclusive range says more than a shared one, which
    // another host may share.
    auto it = last_probed_ ? held_.upper_bound(*last_probed_) : held_.begin();
    for (size_t n = 0; n < held_.size() && !stopping_; ++n, ++it) {
      if (it == held_.end()) it = held_.begin();
      if (it->second.ranges.empty() || it->second.reasserting) continue;
      const auto all = it->second.ranges.All();
      auto x = std::find_if(all.begin(), all.end(), [](const LockRanges::Range& r) { return r.exclusive; });
      p = Probe{it->first, x != all.end() ? *x : all.front(), it->second.cred, it->second.gen};
      last_probed_ = it->first;
      break;
    }
    if (!p) {
      checking_ = false;
      in_grace_ = false;
      return;
    }
  }
  // An owner no lock of this mount has: its TEST meets this mount's lock.
  const nfs::LockOwner nobody{std::string(instance_.data(), instance_.size()) + "check", 0};
  const nfs::LockRange whole{true, p->r.start, LockRanges::LengthOf(p->r)};
  nlm_.Test(p->k.first, nobody, whole, p->cred, [this, p = *p](Result<n4::TestRes> t) {
    if (!t) return NextCheck();  // (no answer: asked again next time)
    if (t->stat == n4::Stat::kDeniedGracePeriod) {
      // Reclaimed at each check in the grace period: a lock is asked for
      // again at no cost to the application (whose own requests wait the
      // period out anyway), and a second restart is never taken for the
      // first one.
      bool first = false;
      {
        MutexLock lock(mu_);
        first = !in_grace_;
        in_grace_ = true;
      }
      if (first) Log("locks")->info("the server is in its grace period (it restarted): reclaiming this mount's locks");
      return Reassert(true);
    }
    MutexLock lock(mu_);
    in_grace_ = false;
    bool forgotten = t->stat == n4::Stat::kGranted;
    if (t->stat == n4::Stat::kDenied) {
      // Denied for another host's lock that cannot stand beside this
      // mount's: the server lost this one. A server that names no holder
      // (Linux's lockd) denied it for this mount's if the lock it reports
      // is exactly one this mount holds on the file.
      const n4::Holder& h = t->holder;
      bool ours = h.oh.size() == 16 && std::equal(instance_.begin(), instance_.end(), h.oh.begin());
      for (auto it = held_.lower_bound({p.k.first, 0});
           h.oh.empty() && it != held_.end() && it->first.first == p.k.first; ++it) {
        for (const auto& x : it->second.ranges.All()) {
          ours = ours || (x.start == h.offset && LockRanges::LengthOf(x) == h.length && x.exclusive == h.exclusive);
        }
      }
      forgotten = !ours && (p.r.exclusive || h.exclusive);
    }
    // (Changed since: tested again next time.)
    auto it = held_.find(p.k);
    forgotten = forgotten && it != held_.end() && it->second.gen == p.gen && !it->second.reasserting;
    lock.Unlock();
    if (!forgotten) return NextCheck();
    Log("locks")->warn("the server no longer holds this mount's locks (it restarted): asking for them again");
    Reassert(false);
  });
}

void Locks::Reassert(bool reclaim) {
  std::vector<Key> keys;
  {
    MutexLock lock(mu_);
    if (stopping_) return;
    for (auto& [k, h] : held_) {
      if (h.ranges.empty() || h.reasserting) continue;
      h.reasserting = true;
      ++reasserts_;
      keys.push_back(k);
    }
  }
  auto left = std::make_shared<std::atomic<size_t>>(keys.size() + 1);
  auto done = [this, left] {
    if (--*left == 0) NextCheck();
  };
  for (const auto& k : keys) ReassertKey(k, reclaim, done);
  done();
}

void Locks::ReassertKey(const Key& k, bool reclaim, std::function<void()> done) {
  std::vector<LockRanges::Range> ranges;
  nfs::Cred cred;
  uint64_t gen = 0;
  {
    MutexLock lock(mu_);
    auto it = held_.find(k);
    if (it == held_.end() || stopping_) {
      if (it != held_.end()) it->second.reasserting = false;
      --reasserts_;
      lock.Unlock();
      return done();
    }
    ranges = it->second.ranges.All();
    cred = it->second.cred;
    gen = it->second.gen;
  }
  auto left = std::make_shared<std::atomic<size_t>>(ranges.size() + 1);
  auto piece_done = [this, k, reclaim, gen, done, left] {
    if (--*left == 0) EndReassertKey(k, reclaim, gen, done);
  };
  // A granted LOCK is given back if the mount is ending (ReleaseAll waits
  // for this); one denied is lost to another host: no longer this mount's.
  auto settle = [this, k, cred, piece_done](const LockRanges::Range& r, const nfs::LockRange& wire,
                                             Result<n4::Stat> s) {
    if (s && *s == n4::Stat::kGranted && stopping_) {
      return nlm_.Unlock(k.first, OwnerOf(k.second), wire.offset, wire.length, cred,
                         [piece_done](Result<n4::Stat>) { piece_done(); });
    }
    if (s && *s == n4::Stat::kDenied) {
      ++lost_;
      Log("locks")->error("a lock was lost to another host while the server restarted (bytes {}-{} of a file)",
                          r.start, r.end == LockRanges::kToEnd ? std::string("end") : std::to_string(r.end - 1));
      MutexLock lock(mu_);
      if (auto it = held_.find(k); it != held_.end()) it->second.ranges.Apply(r.start, r.end, false, true);
    }
    piece_done();  // (no answer: the next check finds it)
  };
  for (const auto& r : ranges) {
    const nfs::LockRange wire{r.exclusive, r.start, LockRanges::LengthOf(r)};
    nlm_.Lock(k.first, OwnerOf(k.second), wire, reclaim, cred,
              [this, k, r, wire, cred, reclaim, settle](Result<n4::Stat> s) {
                if (s && *s == n4::Stat::kDeniedGracePeriod && reclaim) {
                  // Not in its grace period after all: as a new lock (the
                  // same owner asking again for what it holds is granted).
                  return nlm_.Lock(k.first, OwnerOf(k.second), wire, false, cred,
                                   [r, wire, settle](Result<n4::Stat> s2) { settle(r, wire, s2); });
                }
                settle(r, wire, s);
              });
  }
  piece_done();
}

void Locks::EndReassertKey(const Key& k, bool reclaim, uint64_t gen, std::function<void()> done) {
  bool again = false;
  {
    MutexLock lock(mu_);
    auto it = held_.find(k);
    if (it != held_.end() && it->second.sending > 0 && !stopping_) {
      // A request's LOCK sent before this began is still unanswered: its
      // answer may come after the server took this one's.
      lock.Unlock();
      return Later([this, k, reclaim, gen, done] { EndReassertKey(k, reclaim, gen, done); });
    }
    // A request granted meanwhile (a wait, a downgrade) may have been
    // answered before a LOCK sent here for the same bytes: the owner's
    // ranges are asked for again as they are now.
    again = it != held_.end() && !stopping_ && it->second.gen != gen;
    if (!again) {
      if (it != held_.end()) it->second.reasserting = false;
      --reasserts_;
    }
  }
  if (again) return ReassertKey(k, reclaim, done);
  done();
}

void Locks::UnlockAll(std::vector<Key> keys, const nfs::Cred& c, nfs::Cb<Ok> cb) {
  if (keys.empty()) {
    MaybeNothingHeld();
    return cb(Ok{});
  }
  struct Join {
    Locks* self = nullptr;
    Mutex mu;
    size_t left GUARDED_BY(mu) = 0;
    std::optional<Error> first GUARDED_BY(mu);
    nfs::Cb<Ok> cb;
  };
  auto j = std::make_shared<Join>();
  j->self = this;
  j->cb = std::move(cb);
  {
    MutexLock lock(j->mu);
    j->left = keys.size();
  }
  for (const auto& [fh, owner] : keys) {
    UnlockRange(fh, owner, 0, 0, c, [j](Result<Ok> s) {
      std::optional<Error> err;
      if (!s) err = s.error();
      MutexLock lock(j->mu);
      if (err && !j->first) j->first = err;
      if (--j->left > 0) return;
      auto first = j->first;
      lock.Unlock();
      if (!first) j->self->MaybeNothingHeld();
      if (first) {
        Log("locks")->warn("releasing a lock: {}", first->what);
        return j->cb(*first);
      }
      j->cb(Ok{});
    });
  }
}

}  // namespace mpnfs::fs
