#include "fs/gone_check.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <deque>
#include <utility>

#include "common/mutex.h"
#include "common/thread_annotations.h"

namespace mpnfs::fs {

struct GoneCheck::State {
  struct Asked {
    nfs::Fh fh;
    std::vector<nfs::Cred> writers;
    std::function<void(Answer)> done;
    std::atomic<size_t> left{0};      // file GETATTRs not answered yet
    std::atomic<bool> live{false};    // one of them was not ESTALE
  };
  using AskedP = std::shared_ptr<Asked>;

  State(nfs::Client& n, nfs::Fh r, size_t m) : nfs(n), root(std::move(r)), max_in_flight(m) {}

  nfs::Client& nfs;
  const nfs::Fh root;
  const size_t max_in_flight;
  std::atomic<bool> cancelled{false};
  Mutex mu;
  std::deque<AskedP> queue GUARDED_BY(mu);
  size_t in_flight GUARDED_BY(mu) = 0;
};

// The steps of one ask, and the hand-over to the next queued one. A client
// that answers on the calling thread would nest one ask inside the last one's
// answer; the asks started from an answer on this thread are run one after
// another by the outermost instead (no recursion as deep as the queue).
class GoneCheckSteps {
 public:
  using Answer = GoneCheck::Answer;
  using StateP = std::shared_ptr<GoneCheck::State>;
  using AskedP = GoneCheck::State::AskedP;

  static void Launch(const StateP& st, AskedP a) {
    if (running_) {
      running_->emplace_back(st, std::move(a));
      return;
    }
    std::deque<std::pair<StateP, AskedP>> later;
    running_ = &later;
    Run(st, std::move(a));
    while (!later.empty()) {
      auto [s, next] = std::move(later.front());
      later.pop_front();
      Run(s, std::move(next));
    }
    running_ = nullptr;
  }

 private:
  static void Run(const StateP& st, const AskedP& a) {
    if (st->cancelled) return Finish(st, a, Answer::kLive);
    st->nfs.Getattr(st->root, a->writers[0], [st, a](Result<nfs::Attr> r) {
      if (!r) return Finish(st, a, Answer::kNoExport);
      if (st->cancelled) return Finish(st, a, Answer::kLive);
      a->left = a->writers.size();
      for (const auto& w : a->writers) {
        st->nfs.Getattr(a->fh, w, [st, a](Result<nfs::Attr> f) {
          if (f || f.error().err != ESTALE) a->live = true;
          if (--a->left > 0) return;
          if (a->live || st->cancelled) return Finish(st, a, Answer::kLive);
          st->nfs.Getattr(st->root, a->writers[0], [st, a](Result<nfs::Attr> after) {
            if (st->cancelled) return Finish(st, a, Answer::kLive);
            Finish(st, a, after ? Answer::kGone : Answer::kNoExport);
          });
        });
      }
    });
  }

  static void Finish(const StateP& st, const AskedP& a, Answer answer) {
    auto done = std::move(a->done);
    done(answer);
    AskedP next;
    {
      MutexLock lock(st->mu);
      if (st->queue.empty()) {
        --st->in_flight;
        return;
      }
      next = std::move(st->queue.front());
      st->queue.pop_front();
    }
    Launch(st, std::move(next));
  }

  static thread_local std::deque<std::pair<StateP, AskedP>>* running_;
};

thread_local std::deque<std::pair<GoneCheckSteps::StateP, GoneCheckSteps::AskedP>>*
    GoneCheckSteps::running_ = nullptr;

GoneCheck::GoneCheck(nfs::Client& nfs, nfs::Fh root, size_t max_in_flight)
    : st_(std::make_shared<State>(nfs, std::move(root), std::max<size_t>(max_in_flight, 1))) {}

void GoneCheck::Ask(const nfs::Fh& fh, std::vector<nfs::Cred> writers, std::function<void(Answer)> done) {
  if (writers.empty()) return done(Answer::kLive);  // (nothing waits: nothing to drop)
  auto a = std::make_shared<State::Asked>();
  a->fh = fh;
  a->writers = std::move(writers);
  a->done = std::move(done);
  {
    MutexLock lock(st_->mu);
    if (st_->in_flight >= st_->max_in_flight) {
      st_->queue.push_back(std::move(a));
      return;
    }
    ++st_->in_flight;
  }
  GoneCheckSteps::Launch(st_, std::move(a));
}

void GoneCheck::Cancel() { st_->cancelled = true; }

bool GoneCheck::AskToDrop(const std::shared_ptr<cache::BlockCache>& cache, const nfs::Fh& fh,
                          std::function<bool()> may_drop, std::function<void(Outcome)> done) {
  uint64_t stamp = 0;
  auto creds = AsCreds(cache->DirtyWriters(fh, &stamp));
  if (creds.empty()) return false;
  Ask(fh, std::move(creds),
      [fh, stamp, weak = std::weak_ptr<cache::BlockCache>(cache), may_drop = std::move(may_drop),
       done = std::move(done)](Answer a) {
        Outcome o{a};
        if (a == Answer::kGone && (!may_drop || may_drop())) {
          if (auto c = weak.lock()) o.dropped = c->DropAsOf(fh, stamp);
        }
        done(o);
      });
  return true;
}

std::vector<nfs::Cred> AsCreds(std::vector<cache::BlockCache::Writer> writers) {
  std::vector<nfs::Cred> out;
  for (auto& w : writers) out.push_back(nfs::Cred{w.uid, w.gid, std::move(w.groups)});
  return out;
}

}  // namespace mpnfs::fs
