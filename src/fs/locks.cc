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

Locks::Locks(nfs::LockClient& nlm, std::array<char, 8> instance, std::function<Result<Ok>(bool)> may_hold)
    : nlm_(nlm), instance_(instance), may_hold_(std::move(may_hold)) {}

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
  if (r.type == F_UNLCK) return UnlockRange(fh, r.owner, r.start, r.length, c, std::move(cb));
  {
    MutexLock hold(hold_mu_);
    if (!marked_ && may_hold_) {
      if (auto ok = may_hold_(true); !ok) return cb(Error::Errno(ENOLCK, ok.error().what));
    }
    marked_ = true;
    MutexLock lock(mu_);
    Held& h = held_[{fh, r.owner}];
    h.files.insert(file);
    ++h.pending;
    pids_[r.owner] = r.pid;
  }
  Attempt(fh, file, r, wait, std::move(interrupted), c, std::move(cb), kFirstPoll);
}

void Locks::Attempt(const nfs::Fh& fh, const void* file, const Request& r, bool wait,
                    std::function<bool()> interrupted, const nfs::Cred& c, nfs::Cb<Ok> cb,
                    std::chrono::milliseconds next) {
  if (stopping_) {
    Answered({fh, r.owner}, file, Outcome::kRefused);
    return cb(Error::Errno(ESHUTDOWN, "the mount is ending"));
  }
  nlm_.Lock(fh, OwnerOf(r.owner), RangeOf(r), false, c,
            [this, fh, file, r, wait, interrupted = std::move(interrupted), c, cb = std::move(cb),
             next](Result<n4::Stat> s) mutable {
              const Key k{fh, r.owner};
              if (!s) {
                // No answer: the server may have granted it (kept as held).
                Answered(k, file, Outcome::kUnknown);
                return cb(s.error());
              }
              std::chrono::milliseconds delay;
              if (*s == n4::Stat::kGranted) {
                Answered(k, file, Outcome::kGranted);
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
                Answered(k, file, Outcome::kRefused);
                return cb(StatError(*s, "NLM4_LOCK"));
              }
              if ((interrupted && interrupted()) || stopping_) {
                Answered(k, file, Outcome::kRefused);
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

void Locks::Answered(const Key& k, const void* file, Outcome o) {
  {
    MutexLock lock(mu_);
    Held& h = held_[k];  // (a release may have taken it out meanwhile)
    if (h.pending > 0) --h.pending;
    if (o != Outcome::kRefused) {
      h.files.insert(file);
      h.granted = true;  // (or may be: an unanswered request)
      return;
    }
    // Forgotten if nothing of the owner's on the file was granted and no
    // other request for it is on its way.
    if (h.granted || h.pending > 0) return;
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
    if (held_.erase({fh, owner}) == 0) return cb(Ok{});
    ForgetPidLocked(owner);
  }
  UnlockAll({{fh, owner}}, c, std::move(cb));
}

void Locks::ReleaseFile(const nfs::Fh& fh, const void* file, const nfs::Cred& c, nfs::Cb<Ok> cb) {
  std::vector<Key> gone;
  {
    MutexLock lock(mu_);
    for (auto it = held_.lower_bound({fh, 0}); it != held_.end() && it->first.first == fh;) {
      if (it->second.files.erase(file) > 0 && it->second.files.empty() && it->second.pending == 0) {
        gone.push_back(it->first);
        it = held_.erase(it);
      } else {
        ++it;
      }
    }
  }
  {
    MutexLock lock(mu_);
    for (const auto& k : gone) ForgetPidLocked(k.second);
  }
  UnlockAll(std::move(gone), c, std::move(cb));
}

void Locks::ReleaseAll(const nfs::Cred& c, nfs::Cb<Ok> cb) {
  std::vector<Key> all;
  {
    MutexLock lock(mu_);
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
