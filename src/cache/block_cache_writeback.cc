// BlockCache, write-back: taking a write (WriteBack, applied by the writer
// thread with copy-on-write or in place), fsync (Durable), the unflushed
// pages a READ reply must show (Overlay), and what the flusher takes and
// hands back (CollectDirty, Flushed). The contract and the durability rules
// are in block_cache.h.
#include "cache/block_cache.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "common/log.h"

namespace mpnfs::cache {

void BlockCache::WriteBack(WbWrite w, std::function<void(WbOutcome)> done) {
  {
    MutexLock lock(mu_);
    if (opts_.mode == CacheMode::kWriteBack && health_ == Health::kHealthy && w.len > 0 && !stop_ &&
        !wb_stopped_) {
      Job job{};
      job.wb = std::make_shared<WbWrite>(std::move(w));
      job.done = std::move(done);
      jobs_.push_back(std::move(job));
      cv_.Signal();
      return;
    }
    stats_.wb_arounds++;
  }
  done(WbOutcome{WbOutcome::kUnavailable, {}});
}

bool BlockCache::PrepareWb(const WbWrite& w, std::vector<WbPart>& parts, WbOutcome& out,
                           const std::unordered_map<uint32_t, uint32_t>& batch_pins) {
  const uint64_t block = opts_.block;
  const uint64_t end = w.off + w.len;
  // The CRCs of the slots the blocks are in now, held in RAM before step 1
  // reads them (reading them back from the cache disk releases the lock:
  // then the slots are looked up again).
  CrcStore::Holds holds(*crcs_);  // (released before the lock: the caller holds it)
  for (std::vector<uint32_t> need;;) {
    need.clear();
    if (auto fit = files_.find(w.fh); fit != files_.end() && fit->second.id != kNoFile) {
      for (uint64_t b = w.off / block; b * block < end; ++b) {
        if (const uint32_t s = Lookup(fit->second.id, b); s != kNoSlot) need.push_back(s);
      }
    }
    const auto got = HoldCrcs(need, holds);
    if (got == CrcStore::Got::kFailed) {
      out.kind = WbOutcome::kUnavailable;
      stats_.wb_arounds++;
      return false;
    }
    if (got == CrcStore::Got::kHeld) break;
  }
  FileState& f = State(w.fh);
  // Step 1 (locked): where each block's pages go, and which pages of the
  // block's current slot must be carried over or merged.
  struct Plan {
    PageBits read{};   // pages of `from` to read
    std::vector<uint32_t> crc;  // their CRCs now
  };
  std::vector<Plan> plans;
  for (uint64_t b = w.off / block; b * block < end; ++b) {
    WbPart part;
    part.block = b;
    const uint64_t lo = std::max(w.off, b * block) - b * block;
    const uint64_t hi = std::min(end, (b + 1) * block) - b * block;
    part.p0 = static_cast<uint32_t>(lo / kPage);
    part.np = static_cast<uint32_t>((hi - 1) / kPage) - part.p0 + 1;
    if (f.id != kNoFile) part.from = Lookup(f.id, b);  // (kNoSlot == UINT32_MAX: none)
    // Pages covered in part: merged with the cache's copy or the server's.
    for (uint32_t p : {part.p0, part.p0 + part.np - 1}) {
      const uint64_t ps = uint64_t{p} * kPage;
      const bool partial = lo > ps || hi < ps + kPage;
      if (!partial) continue;
      const bool cached = part.from != UINT32_MAX && TestBit(Valid(slots_[part.from]), p);
      if (!cached && !w.base.count(b * block + ps)) out.need.push_back(b * block + ps);
    }
    parts.push_back(std::move(part));
  }
  if (!out.need.empty()) {
    std::sort(out.need.begin(), out.need.end());
    out.need.erase(std::unique(out.need.begin(), out.need.end()), out.need.end());
    out.kind = WbOutcome::kNeedPages;
    parts.clear();
    return false;
  }
  // Every block's current slot is pinned before any slot is allocated: an
  // allocation for one block must not evict the slot another block of this
  // write was found in (its data would then be written there as the other
  // block's).
  for (auto& part : parts) {
    if (part.from == UINT32_MAX) continue;
    part.from_gen = slots_[part.from].gen;
    policy_->Pin(part.from);
    part.pinned_from = true;
  }
  for (auto& part : parts) {
    Plan plan;
    // A dirty page is copied (copy-on-write) if a record a crash may keep
    // declares it (the older claim must survive a torn rewrite), or if a
    // reader holds the slot (it would read a torn page). Else it is
    // rewritten in place: a crash then keeps the older claim (a retired
    // slot's, or the page is clean or invalid in this slot's records).
    bool cow = false, rewrite = false;
    if (part.from != UINT32_MAX) {
      const Slot& from = slots_[part.from];
      auto fwbit = wb_.find(part.from);
      for (uint32_t p = part.p0; p < part.p0 + part.np; ++p) {
        if (!TestBit(DirtyBits(from), p)) continue;
        if (fwbit != wb_.end() && !TestBit(fwbit->second.claimed, p)) {
          rewrite = true;
        } else {
          cow = true;
        }
      }
      if (rewrite && !cow) {
        // Ours (this write's and the batch's earlier writes'), and the
        // dirty pin: any other pin is a reader's.
        auto held = batch_pins.find(part.from);
        const uint32_t ours = 1 + (from.dirty_pin ? 1 : 0) + (held == batch_pins.end() ? 0 : held->second);
        cow = policy_->Pins(part.from) != ours;
      }
      if (cow) rewrite = false;
    }
    // A copy goes back to the block's partner when that still holds what
    // it held (see WbSlot): then only the pages changed since are copied.
    // (Safe as any copy: the partner's last claim, if a crash leaves it,
    // is older than `from`'s durable one, and its new record is written
    // only after its data is synced, by the commit.)
    const WbSlot* fwb = nullptr;
    if (part.from != UINT32_MAX && cow) {
      auto it = wb_.find(part.from);
      if (it != wb_.end() && it->second.partner != kNoSlot &&
          slots_[it->second.partner].file == kNoFile &&
          slots_[it->second.partner].gen == it->second.partner_gen &&
          policy_->Take(it->second.partner, PolicyKey(w.fh, part.block), policy_->InMain(part.from))) {
        fwb = &it->second;
      }
    }
    if (part.from != UINT32_MAX && !cow) {
      part.to = part.from;
    } else {
      auto got = fwb ? std::optional<uint32_t>(fwb->partner) : AllocateSlot(PolicyKey(w.fh, part.block));
      if (!got) {
        // Every slot is dirty or busy: this write goes to the server.
        UndoWb(parts);
        out.kind = WbOutcome::kUnavailable;
        stats_.wb_arounds++;
        return false;
      }
      part.to = *got;
      part.to_partner = fwb != nullptr;
      Slot& to = slots_[part.to];
      Attach(part.to, f, part.block);
      Valid(to).Clear();
      DirtyBits(to).Clear();
      SetVersion(to, f.validated);
      wb_.erase(part.to);
      to.gen++;
      to.rec_seq = seq_++;
      policy_->Pin(part.to);
      part.allocated = true;
      part.to_gen = to.gen;
    }
    if (part.from != UINT32_MAX) {
      Slot& from = slots_[part.from];
      // Read from the current slot: the partial pages it holds, and on a
      // copy every valid page the write does not cover whole.
      const uint64_t blo = std::max(w.off, part.block * block) - part.block * block;
      const uint64_t bhi = std::min(end, (part.block + 1) * block) - part.block * block;
      for (uint32_t p = 0; p < pages(); ++p) {
        if (!TestBit(Valid(from), p)) continue;
        const bool touched = p >= part.p0 && p < part.p0 + part.np;
        const bool partial = blo > uint64_t{p} * kPage || bhi < uint64_t{p + 1} * kPage;
        if (cow && !touched && fwb && !TestBit(fwb->delta, p)) {
          SetBit(part.reuse, p);
        } else if ((touched && partial) || (cow && !touched)) {
          SetBit(plan.read, p);
        }
      }
      plan.crc.assign(PageCrcs(from), PageCrcs(from) + pages());
      if (!cow) {
        // In place: readers of clean pages being rewritten go to the server
        // (it has them) until the new data is in; dirty pages stay valid and
        // dirty, and readers keep away from the slot (Slot::rewriting).
        for (uint32_t p = part.p0; p < part.p0 + part.np; ++p) {
          if (TestBit(Valid(from), p) && !TestBit(DirtyBits(from), p)) {
            ClearBit(Valid(from), p);
            used_pages_--;
          }
        }
        if (rewrite) {
          from.rewriting = true;
          part.rewriting = true;
          WbSlot& fwb = Wb(part.from);
          for (uint32_t p = part.p0; p < part.p0 + part.np; ++p) SetBit(fwb.rewriting, p);
        }
        from.inval++;
      }
    }
    plans.push_back(std::move(plan));
  }
  // Step 2 (unlocked): build the new pages.
  mu_.Unlock();
  bool io_error = false;
  int err = 0;
  std::vector<uint64_t> bad;  // partial pages whose cached copy is damaged
  std::vector<std::pair<size_t, uint32_t>> damaged;  // (part, page) read back damaged
  for (size_t i = 0; i < parts.size() && !io_error; ++i) {
    WbPart& part = parts[i];
    const Plan& plan = plans[i];
    uint32_t lo = part.p0, hi = part.p0 + part.np;  // page span of the image
    for (uint32_t p = 0; p < pages(); ++p) {
      if (TestBit(plan.read, p)) {
        lo = std::min(lo, p);
        hi = std::max(hi, p + 1);
      }
    }
    part.img0 = lo;
    part.image.resize(size_t{hi - lo} * kPage);
    std::memset(part.image.data(), 0, part.image.size());
    part.crc.assign(hi - lo, 0);
    const uint64_t bstart = part.block * opts_.block;
    for (uint32_t p = lo; p < hi; ++p) {
      char* page = part.image.data() + size_t{p - lo} * kPage;
      if (TestBit(plan.read, p)) {
        if (!data_->ReadAt(page, kPage, uint64_t{part.from} * opts_.block + uint64_t{p} * kPage)) {
          io_error = true;
          err = errno;
          break;
        }
        if (Crc(page, kPage) == plan.crc[p]) {
          SetBit(part.copied, p);
          continue;
        }
        std::memset(page, 0, kPage);
        damaged.emplace_back(i, p);
        const bool edge = p == part.p0 || p == part.p0 + part.np - 1;
        if (edge && !w.base.count(bstart + uint64_t{p} * kPage)) bad.push_back(bstart + uint64_t{p} * kPage);
      }
      if (auto it = w.base.find(bstart + uint64_t{p} * kPage);
          it != w.base.end() && !TestBit(part.copied, p)) {
        std::memcpy(page, it->second.data(), std::min<size_t>(it->second.size(), kPage));
      }
    }
    if (io_error) break;
    // The write's own bytes.
    const uint64_t img_start = bstart + uint64_t{lo} * kPage;
    const uint64_t from = std::max(w.off, img_start);
    const uint64_t to = std::min(w.off + w.len, bstart + opts_.block);
    std::memcpy(part.image.data() + (from - img_start), w.data + (from - w.off), to - from);
    for (uint32_t p = lo; p < hi; ++p) part.crc[p - lo] = Crc(part.image.data() + size_t{p - lo} * kPage, kPage);
  }
  mu_.Lock();
  for (auto [i, p] : damaged) {
    // A damaged page is dropped (a partial one is completed from the
    // server's copy: kNeedPages); an unflushed write it held is lost, and
    // reported to fsync as Read() does.
    const WbPart& part = parts[i];
    Slot& from = slots_[part.from];
    if (from.gen != part.from_gen || !TestBit(Valid(from), p)) {
      // Invalidated meanwhile, or a clean page taken out for a rewrite in
      // place: nothing to drop, but the failure counts.
      stats_.checksum_failures++;
      continue;
    }
    DropDamagedPage(part.from, p);
  }
  if (io_error || !bad.empty()) {
    if (io_error) DeviceError("reading the cache", err);
    if (!bad.empty()) Log("cache")->warn("cached page failed its checksum during a write; merging with the server's");
    UndoWb(parts);
    out.kind = io_error ? WbOutcome::kUnavailable : WbOutcome::kNeedPages;
    out.need = std::move(bad);
    return false;
  }
  return true;
}

bool BlockCache::Rewriting(uint32_t s, uint32_t p) const {
  if (!slots_[s].rewriting) return false;
  auto it = wb_.find(s);
  return it != wb_.end() && TestBit(it->second.rewriting, p);
}

void BlockCache::UndoWb(std::vector<WbPart>& parts) {
  for (auto& part : parts) {
    if (part.allocated) {
      FreeSlot(part.to, /*persist=*/true);  // its previous record may name an evicted block
      policy_->Unpin(part.to);
      policy_->Release(part.to);
    } else if (part.pinned_from && slots_[part.from].gen == part.from_gen) {
      Persist(part.from);  // in place: the pages cleared for the write stay invalid
      if (part.rewriting) {
        Slot& from = slots_[part.from];
        WbSlot& fwb = Wb(part.from);
        // (A failed rewrite may have torn the dirty pages it covered; they
        // keep their CRCs, so the flush the filesystem does before sending
        // that write around the cache finds a torn page, drops it and marks
        // the file's writes lost: Durable() then fails the file's fsync.
        // Pages the write did not reach, e.g. refused at once, flush whole.)
        fwb.rewriting = PageBits{};
        from.rewriting = false;
        from.inval++;
        rewrite_cv_.SignalAll();
      }
    }
    if (part.pinned_from) policy_->Unpin(part.from);
  }
  parts.clear();
}

void BlockCache::WriterWb(std::vector<Job>& batch) {
  struct Item {
    std::vector<WbPart> parts;
    WbOutcome out;
    bool ok = false;  // applied in memory
  };
  std::vector<Item> items(batch.size());
  std::unordered_map<uint32_t, uint32_t> batch_pins;  // held by the batch's writes until its end
  const auto now = std::chrono::steady_clock::now();
  for (size_t i = 0; i < batch.size(); ++i) {
    const WbWrite& w = *batch[i].wb;
    Item& it = items[i];
    if (health_ != Health::kHealthy || wb_stopped_ || stop_) {
      // (Also queued before a detach or unmount began: those flush what
      // is dirty and then release the export, so nothing new may be.)
      it.out.kind = WbOutcome::kUnavailable;
      stats_.wb_arounds++;
      continue;
    }
    if (!PrepareWb(w, it.parts, it.out, batch_pins)) continue;
    // The CRCs step 3 reads and sets, held in RAM from before any page is
    // written (reading them back may release the lock: as the writing
    // below does; what it guards is checked after it): a failure to hold
    // them then costs nothing written.
    CrcStore::Holds holds(*crcs_);
    {
      std::vector<uint32_t> need;
      for (const auto& part : it.parts) {
        if (part.pinned_from) need.push_back(part.from);
        need.push_back(part.to);
      }
      if (HoldCrcs(need, holds) == CrcStore::Got::kFailed) {
        UndoWb(it.parts);
        it.out.kind = WbOutcome::kUnavailable;
        stats_.wb_arounds++;
        continue;
      }
    }
    for (const auto& part : it.parts) {
      if (part.pinned_from) batch_pins[part.from]++;
      if (part.allocated) batch_pins[part.to]++;
    }
    // Step 2b (unlocked): write the new pages to their slots.
    mu_.Unlock();
    bool wrote = true;
    for (const auto& part : it.parts) {
      // The image's pages, but those the partner holds already.
      const uint32_t n = static_cast<uint32_t>(part.image.size() / kPage);
      for (uint32_t k = 0; k < n && wrote;) {
        if (TestBit(part.reuse, part.img0 + k)) {
          ++k;
          continue;
        }
        uint32_t e = k;
        while (e < n && !TestBit(part.reuse, part.img0 + e)) ++e;
        const uint64_t at = uint64_t{part.to} * opts_.block + uint64_t{part.img0 + k} * kPage;
        wrote = data_->WriteAt(part.image.data() + size_t{k} * kPage, size_t{e - k} * kPage, at);
        k = e;
      }
    }
    const int err = errno;
    mu_.Lock();
    bool raced = false;
    for (const auto& part : it.parts) {
      raced = raced || (part.pinned_from && slots_[part.from].gen != part.from_gen);
      // A coherence drop or a forgotten file freed the slot allocated for
      // the write (pinned, so nobody else has it): the write starts over.
      raced = raced || (part.allocated && slots_[part.to].gen != part.to_gen);
    }
    if (!wrote || raced) {
      if (!wrote) DeviceError("writing the cache", err);
      for (const auto& part : it.parts) {
        if (part.pinned_from) batch_pins[part.from]--;
        if (part.allocated) batch_pins[part.to]--;
      }
      UndoWb(it.parts);
      it.out.kind = wrote ? WbOutcome::kRetry : WbOutcome::kUnavailable;
      if (!wrote) stats_.wb_arounds++;
      continue;
    }
    // Step 3 (locked): the new pages become what readers see.
    FileState& f = State(w.fh);
    for (auto& part : it.parts) {
      Slot& to = slots_[part.to];
      const Slot* from = part.pinned_from ? &slots_[part.from] : nullptr;
      const bool moved = part.to != part.from;
      uint64_t carried = 0;
      for (uint32_t p = 0; p < pages(); ++p) {
        const bool touched = p >= part.p0 && p < part.p0 + part.np;
        const bool reused = TestBit(part.reuse, p);
        if (!touched && !TestBit(part.copied, p) && !reused) continue;
        // A page invalidated since the plan (a write sent around the cache,
        // a coherence drop, a checksum failure) stays invalid.
        if (!touched && from && !TestBit(Valid(*from), p)) continue;
        if (!TestBit(Valid(to), p)) used_pages_++;
        SetBit(Valid(to), p);
        // (`from` is pinned and only this thread writes pages: a reused
        // page's CRC is the one it had when the write was planned.)
        MutCrcs(to)[p] = reused ? PageCrcs(*from)[p] : part.crc[p - part.img0];
        if (!touched && !reused) carried++;
        if (touched || (from && TestBit(DirtyBits(*from), p))) SetBit(DirtyBits(to), p);
        // A page whose clean mark is not durable yet stays "dirty" to
        // HasDirty in its new slot too (Flushed clears it there).
        if (!touched && from && moved && TestBit(Cleaning(*from), p)) SetBit(Cleaning(to), p);
      }
      WbSlot& twb = Wb(part.to);
      if (from && moved) {
        const WbSlot& fwb = WbOf(part.from);
        twb.wgen = fwb.wgen;
        twb.fsize = fwb.fsize;
        twb.dirty_since = AnyBit(DirtyBits(*from)) ? fwb.dirty_since : now;
        stats_.copies++;
        stats_.copied_pages += carried;
        stats_.copies_to_partner += part.to_partner ? 1 : 0;
      } else if (!to.dirty_pin) {
        twb.dirty_since = now;
      }
      // What `to` holds that its partner-to-be (`from`, once freed) or its
      // partner does not: the pages written now (a copy starts with none).
      for (uint32_t p = part.p0; p < part.p0 + part.np; ++p) SetBit(twb.delta, p);
      // Never repeats, not even in a slot freed and taken again: a flush
      // round's Flushed() must not mistake a newer write for the one it sent.
      twb.wgen = ++counter_;
      // The end of what writes put in this block, not the file's size: a
      // record that lands without the record of the write that extended the
      // file must not extend it after a crash (crash_test.cc:
      // ARecordKeptAloneDoesNotExtendTheFile).
      twb.fsize = std::max(twb.fsize, std::min(w.off + w.len, (part.block + 1) * uint64_t{opts_.block}));
      twb.uid = w.uid;
      twb.groups = w.groups;
      twb.gid = w.gid;
      to.inval++;
      if (from) stats_.write_hits++;
      if (moved) {
        TableSet(part.to);
        List(part.to);
        if (from) Unlist(part.from);  // freed after the commit (below)
      }
      if (part.rewriting) {
        to.rewriting = false;
        twb.rewriting = PageBits{};
        stats_.rewrites_in_place++;
        rewrite_cv_.SignalAll();
      }
      SetDirtyPin(part.to);
      NoteChange(f, part.block, part.p0, part.np);
    }
    f.wb_size = std::max(f.wb_size, w.off + w.len);
    f.wb_commit = commits_ + 1;  // (no commit runs while this thread applies writes)
    stats_.writes++;
    it.ok = true;
  }
  // Acknowledged now, durable at the next commit (Commit): their records
  // are written only once the data is synced, and the old slots of moved
  // blocks stay pinned, holding the older claims, until those records are.
  const bool was_pending = WbPending();
  bool any = false;
  for (auto& it : items) {
    for (auto& part : it.parts) {
      if (part.allocated) policy_->Unpin(part.to);
      if (!part.pinned_from) continue;
      if (it.ok && part.to != part.from) {
        wb_retire_.push_back(Retire{part.from, slots_[part.from].gen, part.to,
                                    slots_[part.to].gen});  // keeps the pin
      } else {
        policy_->Unpin(part.from);
      }
    }
    if (!it.ok) continue;
    for (const auto& part : it.parts) wb_persist_.push_back(part.to);
    any = true;
  }
  if (any) {
    if (!was_pending) commit_due_ = now + opts_.commit_interval;
    wb_unsynced_ = true;
  }
  mu_.Unlock();
  for (size_t i = 0; i < batch.size(); ++i) batch[i].done(std::move(items[i].out));
  batch.clear();
  mu_.Lock();
}

bool BlockCache::TakeLost(const std::string& fh) {
  MutexLock lock(mu_);
  auto it = files_.find(fh);
  if (it == files_.end()) return false;
  FileState& f = it->second;
  bool lost = std::exchange(f.lost, false);
  for (uint32_t s = f.head; s != kNoSlot && !lost; s = slots_[s].next) lost = Dirtyish(slots_[s]);
  return lost;
}

void BlockCache::Durable(const std::string& fh, std::function<void(bool)> done) {
  MutexLock lock(mu_);
  if (index_broken_ || !journal_) {
    lock.Unlock();
    return done(false);
  }
  // (Exactly: commits_ counts commits ended, their records synced, and a
  // commit in progress covers every write applied when it began.)
  auto it = files_.find(fh);
  if (it != files_.end() && it->second.lost) {
    // Some of the file's writes were lost by the cache disk: the caller
    // flushes to the server and reports them (TakeLost).
    lock.Unlock();
    return done(false);
  }
  if (it == files_.end() || it->second.wb_commit <= commits_) {
    lock.Unlock();
    return done(true);
  }
  // (A write found lost during the commit fails it too.)
  done = [this, fh, done = std::move(done)](bool ok) {
    bool lost = false;
    {
      MutexLock l(mu_);
      auto f = files_.find(fh);
      lost = f != files_.end() && f->second.lost;
    }
    done(ok && !lost);
  };
  if (!writer_.joinable() || stop_) {
    const bool ok = Commit();
    lock.Unlock();
    return done(ok);
  }
  durable_waiters_.push_back(std::move(done));
  cv_.SignalAll();
}

bool BlockCache::StaleClaims(const std::string& fh) {
  MutexLock lock(mu_);
  return fh.empty() ? !broken_claims_.empty() : broken_claims_.count(fh) != 0;
}

void BlockCache::EmptyBrokenIndex() {
  MutexLock lock(mu_);
  DiscardBrokenIndex();  // (if nothing is dirty any more)
}

bool BlockCache::HasDirty(const std::string& fh, uint64_t off, size_t len) {
  MutexLock lock(mu_);
  if (broken_claims_.count(fh)) return true;
  if (dirty_slots_ == 0) return false;
  const uint64_t block = opts_.block;
  for (uint64_t b = off / block; b * block < off + len; ++b) {
    const uint32_t s = Lookup(fh, b);
    if (s == kNoSlot) continue;
    const Slot& slot = slots_[s];
    if (!slot.dirty_pin) continue;
    const uint64_t lo = std::max(off, b * block) - b * block;
    const uint64_t hi = std::min(off + len, (b + 1) * block) - b * block;
    for (uint32_t p = static_cast<uint32_t>(lo / kPage); p <= (hi - 1) / kPage; ++p) {
      if (TestBit(DirtyBits(slot), p) || TestBit(Cleaning(slot), p)) return true;
    }
  }
  return false;
}

std::vector<BlockCache::Writer> BlockCache::DirtyWriters(const std::string& fh, uint64_t* stamp) {
  MutexLock lock(mu_);
  std::vector<Writer> out;
  auto it = files_.find(fh);
  if (stamp) *stamp = counter_;
  if (dirty_slots_ == 0 || it == files_.end()) return out;
  for (uint32_t s = it->second.head; s != kNoSlot; s = slots_[s].next) {
    if (!slots_[s].dirty_pin) continue;
    const WbSlot& wb = WbOf(s);
    Writer w{wb.uid, wb.gid, wb.groups};
    if (std::find(out.begin(), out.end(), w) == out.end()) out.push_back(std::move(w));
  }
  return out;
}

uint64_t BlockCache::SizeFloor(const std::string& fh) {
  MutexLock lock(mu_);
  auto it = files_.find(fh);
  return it == files_.end() ? 0 : it->second.wb_size;
}

OverlayResult BlockCache::Overlay(const std::string& fh, uint64_t token, uint64_t off,
                                 std::string_view server, size_t want, std::string* out) {
  OverlayPlan plan;
  if (auto early = PlanOverlay(fh, token, off, server.size(), want, &plan)) return *early;
  return RunOverlay(plan, off, server, out);
}

void BlockCache::OverlayAsync(std::shared_ptr<BlockCache> cache, const std::string& fh, uint64_t token,
                              uint64_t off, std::string_view server, size_t want,
                              std::function<void(OverlayResult, std::string_view)> done) {
  OverlayPlan plan;
  if (auto early = cache->PlanOverlay(fh, token, off, server.size(), want, &plan)) {
    return done(*early, server);
  }
  if (plan.pieces.empty()) {
    // Only longer than the server says (unflushed writes extend the file): no disk I/O.
    std::string out;
    auto r = cache->RunOverlay(plan, off, server, &out);
    return done(r, out);
  }
  // Unflushed pages must be read back: not on this (event-loop) thread.
  auto reader = cache->reader_;
  reader->Post([cache = std::move(cache), plan = std::move(plan), off, copy = std::string(server),
                done = std::move(done)]() mutable {
    std::string out;
    auto r = cache->RunOverlay(plan, off, copy, &out);
    done(r, r.replaced ? std::string_view(out) : std::string_view(copy));
  });
}

std::optional<OverlayResult> BlockCache::PlanOverlay(const std::string& fh, uint64_t token, uint64_t off,
                                                     size_t have, size_t want, OverlayPlan* plan) {
  auto& pieces = plan->pieces;
  size_t& len = plan->len;
  len = have;
  const uint64_t block = opts_.block;
  {
    MutexLock lock(mu_);
    auto fit = files_.find(fh);
    if (fit == files_.end()) return OverlayResult{};
    FileState& f = fit->second;
    if (f.wb_size > off + have) len = static_cast<size_t>(std::min<uint64_t>(want, f.wb_size - off));
    for (uint64_t b = off / block; b * block < off + len; ++b) {
      const uint32_t s = f.id == kNoFile ? kNoSlot : Lookup(f.id, b);
      const Slot* slot = s == kNoSlot ? nullptr : &slots_[s];
      if (!Changed(f, b, token) && (!slot || !slot->dirty_pin)) continue;
      const uint64_t lo = std::max(off, b * block) - b * block;
      const uint64_t hi = std::min(off + len, (b + 1) * block) - b * block;
      for (uint32_t p = static_cast<uint32_t>(lo / kPage); p <= (hi - 1) / kPage; ++p) {
        const bool changed = PageChanged(f, b, p, token);
        const bool valid = slot && TestBit(Valid(*slot), p);
        if (valid && Rewriting(s, p)) {
          // Being rewritten in place: the read goes again (as for any write
          // to this page since the read began).
          for (const auto& pc : pieces) policy_->Unpin(pc.slot);
          return OverlayResult{OverlayResult::kRetry, false};
        }
        if (valid && (changed || TestBit(DirtyBits(*slot), p))) {
          pieces.push_back(OverlayPlan::Piece{s, slot->gen, b, p, 0});  // (crc: RunOverlay)
          policy_->Pin(s);
        } else if (changed && !valid) {
          // Written or flushed since the read left, and not held here: the
          // server's answer may predate that.
          for (const auto& pc : pieces) policy_->Unpin(pc.slot);
          return OverlayResult{OverlayResult::kRetry, false};
        }
      }
    }
  }
  if (pieces.empty() && len == have) return OverlayResult{};
  return std::nullopt;
}

OverlayResult BlockCache::RunOverlay(const OverlayPlan& plan, uint64_t off, std::string_view server,
                                     std::string* out) {
  using Piece = OverlayPlan::Piece;
  const auto& pieces = plan.pieces;
  const size_t len = plan.len;
  const uint64_t block = opts_.block;
  out->assign(server);
  out->resize(len, '\0');
  AlignedBuf page(kPage);
  OverlayResult res{OverlayResult::kOk, true};
  int err = 0;
  std::optional<Piece> bad;
  // The pieces' CRCs, read here, not in PlanOverlay (an event loop may not
  // wait for the cache disk, which holding them may take). The slots are
  // pinned (they keep their blocks), but a clean page among them may be
  // rewritten in place meanwhile: its CRC is then the new data's (the read
  // below serves that newer data, as a read racing a write may), or the
  // page is invalid and its check fails and the read goes again (kRetry).
  std::vector<uint32_t> crc(pieces.size());
  if (!pieces.empty()) {
    MutexLock lock(mu_);
    CrcStore::Holds holds(*crcs_);
    std::vector<uint32_t> need;
    for (const Piece& pc : pieces) need.push_back(pc.slot);
    if (HoldCrcs(need, holds) == CrcStore::Got::kFailed) {
      for (const auto& pc : pieces) policy_->Unpin(pc.slot);
      return OverlayResult{OverlayResult::kError, false};
    }
    for (size_t i = 0; i < pieces.size(); ++i) crc[i] = PageCrcs(slots_[pieces[i].slot])[pieces[i].page];
  }
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& pc = pieces[i];
    if (!data_->ReadAt(page.data(), kPage, uint64_t{pc.slot} * block + uint64_t{pc.page} * kPage)) {
      err = errno;
      res.kind = OverlayResult::kError;
      break;
    }
    if (Crc(page.data(), kPage) != crc[i]) {
      bad = pc;
      bad->crc = crc[i];
      res.kind = OverlayResult::kRetry;
      break;
    }
    const uint64_t ps = pc.block * block + uint64_t{pc.page} * kPage;
    const uint64_t from = std::max(off, ps), to = std::min<uint64_t>(off + len, ps + kPage);
    std::memcpy(out->data() + (from - off), page.data() + (from - ps), to - from);
  }
  MutexLock lock(mu_);
  CrcStore::Holds holds(*crcs_);
  // (Pinned until the CRC below is compared: the slot keeps its block.)
  const bool held = bad && HoldCrcs({bad->slot}, holds) != CrcStore::Got::kFailed;
  for (const auto& pc : pieces) policy_->Unpin(pc.slot);
  if (res.kind == OverlayResult::kError) DeviceError("reading the cache", err);
  if (bad && held) {
    Slot& slot = slots_[bad->slot];
    if (slot.gen == bad->gen && TestBit(Valid(slot), bad->page) && PageCrcs(slot)[bad->page] == bad->crc) {
      // Damaged on disk, not a race.
      if (DropDamagedPage(bad->slot, bad->page)) res.kind = OverlayResult::kError;
    }
  }
  return res;
}

BlockCache::DirtyLevel BlockCache::Dirty() const {
  MutexLock lock(mu_);
  DirtyLevel d;
  d.blocks = dirty_slots_;
  d.slots = nslots_;
  d.urgent = health_ != Health::kHealthy;
  const auto now = std::chrono::steady_clock::now();
  for (uint32_t s : dirty_set_) d.oldest = std::max(d.oldest, now - WbOf(s).dirty_since);
  return d;
}

std::vector<DirtyRun> BlockCache::CollectDirty(uint64_t max_bytes, const std::string& fh,
                                               std::chrono::steady_clock::time_point older_than,
                                               const std::set<std::string>* skip, bool* failed) {
  if (failed) *failed = false;
  struct Pick {
    uint32_t slot;
    std::string fh;
    uint64_t block, gen, wgen, size;
    PageBits dirty;
    std::vector<uint32_t> crc;
    uint32_t uid, gid;
    std::vector<uint32_t> groups;
  };
  std::vector<Pick> picks;
  {
    MutexLock lock(mu_);
    CrcStore::Holds holds(*crcs_);  // (released before the lock)
    std::vector<uint32_t> cand;
    // Slots whose checksums could not be read back: left out of this round
    // (reported through *failed), not holding up the others.
    std::vector<uint32_t> unreadable;
    // Until the CRCs of the slots picked are in RAM with no release of the
    // lock since they were picked (reading them back releases it).
    for (std::vector<uint32_t> need;;) {
    for (bool busy = true; busy;) {
      busy = false;
      cand.clear();
      for (uint32_t s : dirty_set_) {
        const Slot& slot = slots_[s];
        if ((!fh.empty() && Fh(slot) != fh) || WbOf(s).dirty_since > older_than) continue;
        if (skip && !skip->empty() && skip->count(Fh(slot))) continue;
        // A block moved by copy-on-write keeps its old slot dirty until the
        // new one is durable; only the block's current slot is flushed (two
        // WRITEs of one range in one round could land in either order).
        if (Lookup(slot.file, slot.block) != s) continue;
        if (std::find(unreadable.begin(), unreadable.end(), s) != unreadable.end()) continue;
        cand.push_back(s);
      }
      // File order: by handle, then offset (the server sees ascending writes).
      std::sort(cand.begin(), cand.end(), [this](uint32_t a, uint32_t b) REQUIRES(mu_) {
        const Slot &x = slots_[a], &y = slots_[b];
        return x.file != y.file ? Fh(x) < Fh(y) : x.block < y.block;
      });
      // A slot this round takes whose pages are being rewritten in place:
      // wait for that write (one write of the writer thread, which never
      // waits for this one).
      uint64_t would = 0;
      for (uint32_t s : cand) {
        if (would >= max_bytes) break;
        busy = busy || slots_[s].rewriting;
        for (auto w : DirtyBits(slots_[s])) would += uint64_t{static_cast<uint32_t>(__builtin_popcountll(w))} * kPage;
      }
      if (busy) rewrite_cv_.Wait(mu_);
    }
    need.clear();
    uint64_t would = 0;
    // (At most kRoundFrames frames of checksums: a round of scattered
    // small dirty blocks must not hold far more than the budget in RAM.)
    constexpr size_t kRoundFrames = 64;
    std::vector<uint32_t> frames;
    for (size_t i = 0; i < cand.size(); ++i) {
      const uint32_t s = cand[i];
      const uint32_t fr = crcs_->FrameOf(s);
      const bool known = std::find(frames.begin(), frames.end(), fr) != frames.end();
      if (would >= max_bytes || (!known && frames.size() >= kRoundFrames)) {
        cand.resize(i);
        break;
      }
      if (!known) frames.push_back(fr);
      need.push_back(s);
      for (auto w : DirtyBits(slots_[s])) would += uint64_t{static_cast<uint32_t>(__builtin_popcountll(w))} * kPage;
    }
    bool again = false;
    for (uint32_t s : need) {
      const auto got = HoldCrcs({s}, holds);
      if (got == CrcStore::Got::kFailed) unreadable.push_back(s);
      again = again || got != CrcStore::Got::kHeld;
    }
    if (!again) break;
    }
    if (failed) *failed = !unreadable.empty();
    uint64_t bytes = 0;
    for (uint32_t s : cand) {
      if (bytes >= max_bytes) break;
      const Slot& slot = slots_[s];
      const WbSlot& wb = WbOf(s);
      const uint64_t size = std::max(LogicalSize(FileOf(slot)), wb.fsize);
      picks.push_back(Pick{s, Fh(slot), slot.block, slot.gen, wb.wgen, size, DirtyBits(slot),
                           std::vector<uint32_t>(PageCrcs(slot), PageCrcs(slot) + pages()), wb.uid,
                           wb.gid, wb.groups});
      for (auto w : DirtyBits(slot)) bytes += uint64_t{static_cast<uint32_t>(__builtin_popcountll(w))} * kPage;
      policy_->Pin(s);
    }
  }
  std::vector<DirtyRun> runs;
  std::vector<std::pair<uint32_t, uint32_t>> bad;  // slot, page
  int err = 0;
  bool io_error = false;
  const uint64_t block = opts_.block;
  AlignedBuf io;
  for (const Pick& pk : picks) {
    // (A pick that cannot be read back stays dirty; the others go on.)
    bool pick_failed = false;
    for (uint32_t p = 0; p < pages() && !pick_failed;) {
      if (!TestBit(pk.dirty, p)) {
        ++p;
        continue;
      }
      uint32_t e = p;
      while (e < pages() && TestBit(pk.dirty, e)) ++e;
      DirtyRun run;
      run.fh = pk.fh;
      run.block = pk.block;
      run.wgen = pk.wgen;
      run.uid = pk.uid;
      run.groups = pk.groups;
      run.gid = pk.gid;
      run.first_page = p;
      run.npages = e - p;
      run.off = pk.block * block + uint64_t{p} * kPage;
      io.resize(size_t{e - p} * kPage);
      if (!data_->ReadAt(io.data(), io.size(), uint64_t{pk.slot} * block + uint64_t{p} * kPage)) {
        io_error = pick_failed = true;
        err = errno;
        break;
      }
      run.data.assign(io.data(), io.size());
      bool ok = true;
      for (uint32_t k = p; k < e; ++k) {
        if (Crc(run.data.data() + size_t{k - p} * kPage, kPage) != pk.crc[k]) {
          bad.emplace_back(pk.slot, k);
          ok = false;
        }
      }
      // Pages past the end of the file are not written (they would grow it).
      if (ok && run.off < pk.size) {
        run.data.resize(static_cast<size_t>(std::min<uint64_t>(run.data.size(), pk.size - run.off)));
        runs.push_back(std::move(run));
      }
      p = e;
    }
  }
  MutexLock lock(mu_);
  CrcStore::Holds holds(*crcs_);
  std::vector<uint32_t> need;
  for (const auto& [s, p] : bad) need.push_back(s);
  // (Before the slots are unpinned: they keep their blocks meanwhile.)
  const bool held = HoldCrcs(need, holds) != CrcStore::Got::kFailed;
  for (const Pick& pk : picks) policy_->Unpin(pk.slot);
  if (io_error) DeviceError("reading dirty data from the cache", err);
  if (failed) *failed = *failed || io_error || !held;
  for (const auto& [s, p] : held ? bad : decltype(bad){}) {
    Slot& slot = slots_[s];
    auto pk = std::find_if(picks.begin(), picks.end(), [s = s](const Pick& x) { return x.slot == s; });
    if (slot.gen != pk->gen || PageCrcs(slot)[p] != pk->crc[p] || !TestBit(DirtyBits(slot), p)) continue;
    DropDamagedPage(s, p);
  }
  return runs;
}

void BlockCache::Flushed(const std::vector<DirtyRun>& runs) {
  MutexLock lock(mu_);
  struct Cleaned {
    uint32_t slot;
    uint64_t gen;
    std::string fh;
    uint64_t block;
    PageBits pages;
  };
  std::vector<Cleaned> cleaned;
  for (const auto& run : runs) {
    const uint32_t s = Lookup(run.fh, run.block);
    if (s == kNoSlot) continue;
    Slot& slot = slots_[s];
    stats_.flushed_bytes += run.data.size();
    flush_window_.Add(MonotonicSec(), run.data.size());
    if (WbOf(s).wgen != run.wgen) continue;  // written again meanwhile: still dirty
    PageBits pages{};
    for (uint32_t p = run.first_page; p < run.first_page + run.npages; ++p) {
      if (!TestBit(DirtyBits(slot), p)) continue;
      ClearBit(DirtyBits(slot), p);
      SetBit(Cleaning(slot), p);
      SetBit(pages, p);
    }
    cleaned.push_back(Cleaned{s, slot.gen, run.fh, run.block, pages});
    NoteChange(State(run.fh), run.block, run.first_page, run.npages);
    Persist(s);
  }
  if (cleaned.empty()) return;
  // Until the clean marks are durable the pages still count as dirty for
  // HasDirty(): a write sent around the cache now could be overwritten by a
  // stale dirty page after a crash.
  Barrier();
  auto clear = [this](uint32_t s, const PageBits& pages) REQUIRES(mu_) {
    Slot& slot = slots_[s];
    for (size_t w = 0; w < Cleaning(slot).size(); ++w) Cleaning(slot)[w] &= ~pages[w];
    SetDirtyPin(s);
  };
  for (const auto& c : cleaned) {
    // In the slot flushed, and in the one the block was copied to since.
    if (slots_[c.slot].gen == c.gen) clear(c.slot, c.pages);
    if (const uint32_t s = Lookup(c.fh, c.block); s != kNoSlot && s != c.slot) {
      clear(s, c.pages);
    }
  }
  DiscardBrokenIndex();
}

void BlockCache::StopWriteBack() {
  MutexLock lock(mu_);
  wb_stopped_ = true;
}

void BlockCache::ResumeWriteBack() {
  MutexLock lock(mu_);
  wb_stopped_ = false;
}

void BlockCache::NoteFlushError() {
  MutexLock lock(mu_);
  stats_.flush_errors++;
}

}  // namespace mpnfs::cache
