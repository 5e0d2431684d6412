// BlockCache, writing the index: queuing a slot's record (Persist), writing
// the record pages after the data they declare (rule 1 of block_cache.h),
// the mark, barriers, a broken index, and the write-back commit (one sync of
// the data file makes pages and records durable). Entered with mu_ held;
// the functions that write (WriteRecords, WriteMark, DiscardBrokenIndex,
// Commit) release it around the disk I/O and its callbacks. Persist is
// called by any thread that changes a slot; the writing is mostly the
// writer thread's, but also done by the opening thread (Init), the closing
// one, a truncate or an fsync caller when the writer is not running, and
// the flusher (Flushed: Barrier). The contract is in block_cache.h.
#include "cache/block_cache.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "common/log.h"

namespace mpnfs::cache {

void BlockCache::Persist(uint32_t s) {
  slots_[s].rec_seq = seq_++;
  if (index_broken_) return;
  queued_groups_.insert(journal_->GroupOf(s));
  cv_.SignalAll();
}

bool BlockCache::WriteRecords(bool sync) {
  // Rule 1: a record is written after the data it declares (every write-back
  // write was applied by this thread before it got here), and reflects
  // every page of its group as it is in memory now. The sync below covers
  // both.
  if (index_broken_) {
    queued_groups_.clear();
    wb_unsynced_ = false;  // (no record will declare it)
    return false;
  }
  const uint32_t per = journal_->per_page();
  const uint64_t batch = ++batches_;
  // The groups queued now, in chunks: a chunk's records are built once the
  // CRCs of its slots are held in RAM by a pass that did not release the
  // lock (reading them back from the cache disk releases it: crc_store.h).
  // A group queued again while the lock is released is written again later
  // in this call if its chunk comes later, else by the next call: either
  // way with what memory holds then, as any change made while a write is
  // under way. (Only this thread applies write-back writes, so no record
  // written here can declare data not yet written: rule 1.)
  // (A chunk is the groups whose slots' CRCs lie in at most kChunkFrames
  // frames, or one group: what it holds in RAM beyond the budget is small.)
  constexpr size_t kChunkFrames = 4;
  const std::vector<uint32_t> todo(queued_groups_.begin(), queued_groups_.end());
  bool ok = true;
  bool crc_failed = false;
  int err = 0;
  for (size_t at = 0; at < todo.size() && ok;) {
    CrcStore::Holds holds(*crcs_);  // (released before the lock)
    std::vector<uint32_t> chunk, need;
    size_t next = at;
    for (;;) {
      chunk.clear();
      need.clear();
      std::vector<uint32_t> frames;
      for (next = at; next < todo.size(); ++next) {
        const uint32_t g = todo[next];
        if (!queued_groups_.count(g)) continue;
        std::vector<uint32_t> more;
        for (uint32_t s = g * per; s < (g + 1) * per && s < nslots_; ++s) {
          if (slots_[s].file == kNoFile) continue;
          more.push_back(s);
          const uint32_t fr = crcs_->FrameOf(s);
          if (std::find(frames.begin(), frames.end(), fr) == frames.end()) frames.push_back(fr);
        }
        if (!chunk.empty() && frames.size() > kChunkFrames) break;
        chunk.push_back(g);
        need.insert(need.end(), more.begin(), more.end());
      }
      const auto got = HoldCrcs(need, holds);
      if (got == CrcStore::Got::kFailed) {
        ok = false;
        crc_failed = true;
        err = errno;
      }
      if (got != CrcStore::Got::kRelocked) break;
    }
    if (!ok) break;
    at = next;
    std::vector<std::pair<uint32_t, std::vector<Record>>> out;
    out.reserve(chunk.size());
    for (uint32_t g : chunk) {
      queued_groups_.erase(g);
      group_batch_[g] = batch;
      std::vector<Record> recs;
      for (uint32_t s = g * per; s < (g + 1) * per && s < nslots_; ++s) {
        const Slot& slot = slots_[s];
        Record r;
        r.seq = slot.rec_seq;
        if (slot.file != kNoFile) {
          r.fh = Fh(slot);
          r.block = slot.block;
          r.valid = Valid(slot);
          // A page being cleaned is still dirty on disk until this write.
          r.dirty = DirtyBits(slot);
          r.version = VersionOf(slot);
          if (auto it = wb_.find(s); it != wb_.end()) {
            for (size_t i = 0; i < it->second.claimed.size(); ++i) it->second.claimed[i] |= r.dirty[i];
          }
          const WbSlot& wb = WbOf(s);
          r.fsize = wb.fsize;
          r.uid = wb.uid;
          r.groups = wb.groups;
          r.gid = wb.gid;
          r.crc.assign(PageCrcs(slot), PageCrcs(slot) + pages());
        } else if (auto t = tombs_.find(s); t != tombs_.end()) {
          // A tombstone (rule 2a): the block's name, nothing valid.
          r.fh = t->second.fh;
          r.block = t->second.block;
        }
        recs.push_back(std::move(r));
      }
      out.emplace_back(g, std::move(recs));
    }
    holds.Release();
    mu_.Unlock();
    for (const auto& [g, recs] : out) {
      if (!journal_->WriteGroup(g, recs)) {
        ok = false;
        err = errno;
        break;
      }
    }
    mu_.Lock();
  }
  if (ok && sync) {
    mu_.Unlock();
    ok = journal_->Sync();
    err = errno;
    mu_.Lock();
  }
  if (ok && sync) {
    wb_unsynced_ = false;
    last_sync_ = std::chrono::steady_clock::now();
    synced_batch_ = std::max(synced_batch_, batch);
    std::erase_if(unsettled_frees_, [this](const auto& e) REQUIRES(mu_) { return e.second <= synced_batch_; });
    SettleTombs();
  }
  if (!ok && !index_broken_) {
    // The index may now claim pages that are gone (or miss newer ones): the
    // next mount must not trust it. It is emptied once it records no
    // unflushed writes (the flusher drains a cache that is out of service).
    // A failed sync: acknowledged writes whose data may not be on the disk
    // are in records no later load trusts without checking them (index.h);
    // the cache goes out of service, Durable() answers false from now on
    // (fsync goes to the server) and the flusher takes their pages to the
    // server from the data file (checked by their CRCs).
    IndexFailed(crc_failed ? "reading the page checksums for the cache index"
                : sync     ? "writing or syncing the cache index and data"
                           : "writing the cache index",
                err);
  }
  return ok;
}

void BlockCache::WriteMark() {
  last_mark_ = std::chrono::steady_clock::now();
  mu_.Unlock();
  const bool ok = journal_->Mark();
  const int err = errno;
  mu_.Lock();
  if (!ok) IndexFailed("writing or syncing the cache index's mark", err);
}

void BlockCache::IndexFailed(const char* what, int err) {
  if (index_broken_) return;
  DeviceError(what, err);
  health_ = Health::kOut;
  index_broken_ = true;
  // What its records may declare unflushed from now on, whatever is
  // flushed: every file with dirty pages (or an old claim of a moved block).
  for (uint32_t s : dirty_set_) broken_claims_.insert(Fh(slots_[s]));
  for (const auto& [fh, need] : unsettled_frees_) {
    if (need > synced_batch_) broken_claims_.insert(fh);
  }
  for (const Retire& r : wb_retire_) {
    if (slots_[r.slot].gen == r.gen && slots_[r.slot].file != kNoFile) broken_claims_.insert(Fh(slots_[r.slot]));
  }
  queued_groups_.clear();
  wb_unsynced_ = false;
}

void BlockCache::Barrier() {
  if (!writer_.joinable() || stop_ || writer_.get_id() == std::this_thread::get_id()) {
    Commit();
    return;
  }
  bool done = false;
  CondVar done_cv;
  Job job{};
  job.barrier = [this, &done, &done_cv] {
    MutexLock l(mu_);
    done = true;
    done_cv.SignalAll();
  };
  jobs_.push_back(std::move(job));
  cv_.SignalAll();
  while (!done) done_cv.Wait(mu_);
}

void BlockCache::DiscardBrokenIndex() {
  if (!index_broken_ || index_discarded_ || dirty_slots_ != 0) return;
  mu_.Unlock();
  const bool ok = journal_->Discard();
  const int err = errno;
  mu_.Lock();
  if (ok) {
    index_discarded_ = true;
    broken_claims_.clear();
    unsettled_frees_.clear();
    // (An empty index holds no older claims: held slots go back.)
    for (const auto& [t, tomb] : tombs_) policy_->Unpin(t);
    tombs_.clear();
    older_frees_.clear();
  } else if (!discard_warned_) {
    discard_warned_ = true;
    Log("cache")->warn("could not empty the cache index after a disk error ({}); trying again later",
                       std::strerror(err));
  }
}

bool BlockCache::Commit() {
  // Old slots whose block's newest copy is gone already (a truncate or a
  // drop freed it) are freed in this commit's records, not after them: a
  // crash must not keep the old claim alone once the commit has answered
  // (rule 2a).
  std::erase_if(wb_retire_, [this](const Retire& r) REQUIRES(mu_) {
    if (slots_[r.slot].gen != r.gen || Lookup(slots_[r.slot].file, slots_[r.slot].block) != kNoSlot) return false;
    RetireFree(r.slot);
    policy_->Unpin(r.slot);
    return true;
  });
  for (uint32_t s : wb_persist_) Persist(s);
  wb_persist_.clear();
  // One sync of the data file: the write-back data and the records that
  // declare it. (WriteRecords fails, writing nothing, once the index is
  // broken.)
  bool ok = WriteRecords(/*sync=*/true);
  bool newest_gone = false;
  for (const Retire& r : wb_retire_) {
    // After the new records are durable: a crash keeps one or both claims,
    // and the newer wins. (If they are not, the index is broken and will
    // be emptied; the old slot must not be flushed after the new one.)
    if (slots_[r.slot].gen == r.gen) {
      // The block's newest claim already gone (a truncate freed it): the
      // old claim would come back alone; its free is synced now (rule 2a).
      newest_gone = newest_gone || Lookup(slots_[r.slot].file, slots_[r.slot].block) == kNoSlot;
      RetireFree(r.slot);
      // The freed slot still holds, in the data file, what the block's
      // new slot held when copied, but its delta: it is the new slot's
      // partner (ok only after a successful commit: else the old slot's
      // claim may be the one a crash keeps, and it must not be written).
      if (ok && slots_[r.to].gen == r.to_gen) {
        if (auto it = wb_.find(r.to); it != wb_.end()) {
          it->second.partner = r.slot;
          it->second.partner_gen = slots_[r.slot].gen;
        }
      }
    }
    policy_->Unpin(r.slot);
  }
  wb_retire_.clear();
  if (newest_gone) ok = WriteRecords(/*sync=*/true) && ok;
  commit_asked_ = false;
  commits_++;
  auto waiters = std::move(durable_waiters_);
  durable_waiters_.clear();
  idle_cv_.SignalAll();
  if (!waiters.empty()) {
    mu_.Unlock();
    for (auto& w : waiters) w(ok);
    mu_.Lock();
  }
  return ok;
}

}  // namespace mpnfs::cache
