// BlockCache, the core: the block table and slots, coherence with the
// server (versions, Observe, drops, truncates), reads, fills and
// write-through stores, the writer and reader threads, and the statistics.
// Opening and closing are in block_cache_open.cc, writing the index in
// block_cache_index.cc, write-back in block_cache_writeback.cc. The
// contract is in block_cache.h.
#include "cache/block_cache.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "common/log.h"

namespace mpnfs::cache {
namespace {

constexpr int kOutAfterErrors = 8;

}  // namespace

BlockCache::BlockCache(CacheOptions opts)
    : opts_(std::move(opts)), disk_(opts_.disk ? *opts_.disk : RealDisk()) {}

std::string BlockCache::Key(const std::string& fh, uint64_t block) {
  std::string k = fh;
  k.append(reinterpret_cast<const char*>(&block), sizeof(block));
  return k;
}

uint64_t BlockCache::PolicyKey(const std::string& fh, uint64_t block) {
  return std::hash<std::string_view>()(fh) ^ (block * 0x9E3779B97F4A7C15ull);
}

namespace {
uint64_t MixKey(uint32_t file, uint64_t block) {
  uint64_t x = (uint64_t{file} << 32) ^ block ^ (block >> 32) * 0x9E3779B97F4A7C15ull;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return x;
}
}  // namespace

size_t BlockCache::TableHome(uint32_t file, uint64_t block) const {
  return static_cast<size_t>((static_cast<unsigned __int128>(MixKey(file, block)) * block_table_.size()) >> 64);
}

uint32_t BlockCache::Lookup(uint32_t file, uint64_t block) const {
  const size_t n = block_table_.size();
  for (size_t i = TableHome(file, block);; i = i + 1 == n ? 0 : i + 1) {
    const uint32_t s = block_table_[i];
    if (s == kNoSlot) return kNoSlot;
    if (slots_[s].file == file && slots_[s].block == block) return s;
  }
}

uint32_t BlockCache::Lookup(const std::string& fh, uint64_t block) const {
  auto it = files_.find(fh);
  if (it == files_.end() || it->second.id == kNoFile) return kNoSlot;
  return Lookup(it->second.id, block);
}

void BlockCache::TableSet(uint32_t s) {
  const Slot& slot = slots_[s];
  const size_t n = block_table_.size();
  for (size_t i = TableHome(slot.file, slot.block);; i = i + 1 == n ? 0 : i + 1) {
    const uint32_t o = block_table_[i];
    if (o == kNoSlot || (slots_[o].file == slot.file && slots_[o].block == slot.block)) {
      block_table_[i] = s;
      return;
    }
  }
}

void BlockCache::TableErase(uint32_t s) {
  const Slot& slot = slots_[s];
  const size_t n = block_table_.size();
  auto next = [n](size_t i) { return i + 1 == n ? 0 : i + 1; };
  size_t i = TableHome(slot.file, slot.block);
  while (block_table_[i] != s) {
    if (block_table_[i] == kNoSlot) return;  // not its block's slot
    i = next(i);
  }
  // Backward-shift deletion: no tombstones, probe chains stay whole.
  block_table_[i] = kNoSlot;
  for (size_t j = next(i); block_table_[j] != kNoSlot; j = next(j)) {
    const Slot& o = slots_[block_table_[j]];
    const size_t home = TableHome(o.file, o.block);
    // Move j back to the hole at i unless its home lies in (i, j] (cyclically).
    if ((j + n - home) % n >= (j + n - i) % n) {
      block_table_[i] = block_table_[j];
      block_table_[j] = kNoSlot;
      i = j;
    }
  }
}

const FileVersion& BlockCache::VersionOf(const Slot& sl) const {
  static const FileVersion kNone{};
  return sl.version == kNoVersion ? kNone : versions_[sl.version].v;
}

void BlockCache::ReleaseVersion(Slot& sl) {
  if (sl.version == kNoVersion) return;
  VersionEntry& e = versions_[sl.version];
  if (--e.refs == 0) {
    version_ids_.erase(e.v);
    free_versions_.push_back(sl.version);
  }
  sl.version = kNoVersion;
}

void BlockCache::SetVersion(Slot& sl, const FileVersion& v) {
  if (sl.version != kNoVersion && versions_[sl.version].v == v) return;
  ReleaseVersion(sl);
  auto [it, made] = version_ids_.try_emplace(v, 0);
  if (made) {
    if (free_versions_.empty()) {
      it->second = static_cast<uint32_t>(versions_.size());
      versions_.push_back(VersionEntry{v, 0});
    } else {
      it->second = free_versions_.back();
      free_versions_.pop_back();
      versions_[it->second] = VersionEntry{v, 0};
    }
  }
  versions_[it->second].refs++;
  sl.version = it->second;
}

const BlockCache::WbSlot& BlockCache::WbOf(uint32_t s) const {
  static const WbSlot kNone{};
  auto it = wb_.find(s);
  return it == wb_.end() ? kNone : it->second;
}

void BlockCache::Attach(uint32_t s, FileState& f, uint64_t block) {
  Slot& slot = slots_[s];
  if (f.id == kNoFile) {
    if (free_file_ids_.empty()) {
      f.id = static_cast<uint32_t>(file_ids_.size());
      file_ids_.push_back(&f);
    } else {
      f.id = free_file_ids_.back();
      free_file_ids_.pop_back();
      file_ids_[f.id] = &f;
    }
  }
  slot.file = f.id;
  slot.block = block;
  slot.listed = false;
  f.nslots++;
}

void BlockCache::List(uint32_t s) {
  Slot& slot = slots_[s];
  if (slot.listed) return;
  FileState& f = FileOf(slot);
  slot.prev = kNoSlot;
  slot.next = f.head;
  if (f.head != kNoSlot) slots_[f.head].prev = s;
  f.head = s;
  slot.listed = true;
}

void BlockCache::Unlist(uint32_t s) {
  Slot& slot = slots_[s];
  if (!slot.listed) return;
  FileState& f = FileOf(slot);
  if (slot.prev != kNoSlot) slots_[slot.prev].next = slot.next; else f.head = slot.next;
  if (slot.next != kNoSlot) slots_[slot.next].prev = slot.prev;
  slot.prev = slot.next = kNoSlot;
  slot.listed = false;
}

std::vector<uint32_t> BlockCache::SlotsOf(const FileState& f) const {
  std::vector<uint32_t> out;
  out.reserve(f.nslots);
  for (uint32_t s = f.head; s != kNoSlot; s = slots_[s].next) out.push_back(s);
  return out;
}

void BlockCache::Reader::Post(std::function<void()> task) {
  MutexLock lock(mu_);
  tasks_.push_back(std::move(task));
  cv_.Signal();
}

void BlockCache::Reader::Stop() {
  MutexLock lock(mu_);
  stop_ = true;
  cv_.Signal();
}

void BlockCache::Reader::Main() {
  MutexLock lock(mu_);
  while (true) {
    while (!stop_ && tasks_.empty()) cv_.Wait(mu_);
    if (tasks_.empty()) return;  // stopped
    auto task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.Unlock();
    task();
    task = nullptr;  // (may drop the last reference to its cache)
    lock.Lock();
  }
}

BlockCache::FileState& BlockCache::State(const std::string& fh) {
  if (auto it = files_.find(fh); it != files_.end()) return it->second;
  if (files_.size() >= prune_at_) {
    // Forget files with nothing cached and nothing in flight (a token of
    // theirs still out compares older than anything of the new entry).
    for (auto it = files_.begin(); it != files_.end();) {
      if (it->second.nslots == 0 && it->second.writes_inflight == 0 && it->second.truncates_inflight == 0) {
        it = files_.erase(it);
      } else {
        ++it;
      }
    }
    prune_at_ = std::max<size_t>(65536, 2 * files_.size());  // amortized
  }
  auto [it, made] = files_.try_emplace(fh);
  it->second.fh = &it->first;
  it->second.write_counter = it->second.pruned_upto = ++counter_;
  return it->second;
}

bool BlockCache::Dirtyish(const Slot& slot) const { return AnyBit(DirtyBits(slot)) || AnyBit(Cleaning(slot)); }

void BlockCache::SetDirtyPin(uint32_t s) {
  Slot& slot = slots_[s];
  const bool dirty = Dirtyish(slot);
  if (dirty == slot.dirty_pin) return;
  slot.dirty_pin = dirty;
  if (dirty) {
    policy_->Pin(s);
    dirty_slots_++;
    dirty_set_.insert(s);
  } else {
    policy_->Unpin(s);
    dirty_slots_--;
    dirty_set_.erase(s);
  }
}

bool BlockCache::DropDamagedPage(uint32_t s, uint32_t p) {
  Slot& slot = slots_[s];
  stats_.checksum_failures++;
  const bool dirty = TestBit(DirtyBits(slot), p);
  if (dirty) {
    // An unflushed write lost: reported to fsync (Durable, TakeLost).
    Log("cache")->error("an unflushed page failed its checksum (slot {}, page {}): that write is lost", s, p);
    FileOf(slot).lost = true;
    ClearBit(DirtyBits(slot), p);
    SetDirtyPin(s);
  } else {
    Log("cache")->warn("cache page failed its checksum (slot {}, page {}); dropped, read from the server", s, p);
  }
  ClearBit(Valid(slot), p);
  used_pages_--;
  slot.inval++;
  Persist(s);
  return dirty;
}

bool BlockCache::FreeDurable(const OlderFree& o) const {
  const uint64_t b = group_batch_[journal_->GroupOf(o.slot)];
  return b > o.after && synced_batch_ >= b;
}

void BlockCache::SettleTombs() {
  for (auto it = older_frees_.begin(); it != older_frees_.end();) {
    auto& v = it->second;
    v.erase(std::remove_if(v.begin(), v.end(),
                           [this](const OlderFree& o) REQUIRES(mu_) { return FreeDurable(o); }),
            v.end());
    it = v.empty() ? older_frees_.erase(it) : std::next(it);
  }
  for (auto it = tombs_.begin(); it != tombs_.end();) {
    const auto& w = it->second.waits;
    if (std::all_of(w.begin(), w.end(),
                    [this](const OlderFree& o) REQUIRES(mu_) { return FreeDurable(o); })) {
      // (Its tombstone may stay on disk: an empty claim older than any
      // claim the slot makes next.)
      policy_->Unpin(it->first);
      it = tombs_.erase(it);
    } else {
      ++it;
    }
  }
}

void BlockCache::RetireFree(uint32_t s) {
  older_frees_[Key(Fh(slots_[s]), slots_[s].block)].push_back(OlderFree{s, batches_});
  uint64_t& need = unsettled_frees_[Fh(slots_[s])];  // (an older copy's claim: StaleClaims)
  need = std::max(need, batches_ + 1);
  FreeSlot(s, /*persist=*/true);
  policy_->Release(s);
}

std::optional<uint32_t> BlockCache::AllocateSlot(uint64_t key) {
  while (true) {
    bool evicted = false;
    auto got = policy_->Allocate(key, &evicted);
    if (!got || !evicted) return got;
    stats_.evictions++;
    // (The new record overwrites the old, unless the slot must be held.)
    if (!FreeSlot(*got, /*persist=*/false)) return got;
    policy_->Release(*got);
  }
}

bool BlockCache::FreeSlot(uint32_t s, bool persist) {
  Slot& slot = slots_[s];
  if (slot.file == kNoFile) return false;
  // Rule 2a: the newest claim of a block whose older claim's free is not
  // durable yet.
  bool held = false;
  if (!older_frees_.empty() && Lookup(slot.file, slot.block) == s) {
    std::string key = Key(Fh(slot), slot.block);
    if (auto it = older_frees_.find(key); it != older_frees_.end()) {
      std::vector<OlderFree> waits;
      for (const auto& o : it->second) {
        if (o.slot != s && !FreeDurable(o)) waits.push_back(o);
      }
      if (!waits.empty()) {
        tombs_[s] = Tomb{Fh(slot), slot.block, std::move(waits)};
        policy_->Pin(s);
        persist = held = true;
        stats_.tombstones++;
      }
    }
  }
  if (persist || slot.dirty_pin) {
    // Its record may declare pages dirty until the free is durable (a
    // broken index then keeps declaring them: StaleClaims).
    auto w = wb_.find(s);
    if (slot.dirty_pin || (w != wb_.end() && AnyBit(w->second.claimed))) {
      uint64_t& need = unsettled_frees_[Fh(slot)];
      need = std::max(need, batches_ + 1);
    }
  }
  TableErase(s);
  Unlist(s);
  FileState& f = FileOf(slot);
  if (--f.nslots == 0) {
    // The file's id goes with its last slot (its FileState stays, and is
    // forgotten later if idle: State()).
    file_ids_[f.id] = nullptr;
    free_file_ids_.push_back(f.id);
    f.id = kNoFile;
  }
  for (uint32_t p = 0; p < pages(); ++p) used_pages_ -= TestBit(Valid(slot), p) ? 1 : 0;
  slot.file = kNoFile;
  ReleaseVersion(slot);
  Valid(slot).Clear();
  DirtyBits(slot).Clear();
  Cleaning(slot).Clear();
  SetDirtyPin(s);
  wb_.erase(s);
  if (slot.rewriting) {
    slot.rewriting = false;
    rewrite_cv_.SignalAll();
  }
  slot.gen++;
  slot.inval++;
  if (persist) Persist(s);
  return held;
}

void BlockCache::DropLocked(FileState& f) {
  std::vector<uint32_t> held = SlotsOf(f);
  for (uint32_t s : held) {
    if (KeepDirtyOnly(s)) continue;
    FreeSlot(s, /*persist=*/true);
    policy_->Release(s);
  }
  if (!held.empty()) {
    stats_.files_dropped++;
    Log("cache")->debug("dropped {} cached blocks of a file changed elsewhere", held.size());
  }
}

bool BlockCache::KeepDirtyOnly(uint32_t s) {
  Slot& slot = slots_[s];
  if (!slot.dirty_pin) return false;
  // Unflushed writes are never thrown away by coherence checks (write-back
  // assumes a single writer); the clean pages around them are.
  for (uint32_t p = 0; p < pages(); ++p) {
    if (TestBit(Valid(slot), p) && !TestBit(DirtyBits(slot), p)) {
      ClearBit(Valid(slot), p);
      used_pages_--;
    }
  }
  slot.inval++;
  Persist(s);
  return true;
}

void BlockCache::Observe(const std::string& fh, const FileVersion& v) {
  MutexLock lock(mu_);
  FileState& f = State(fh);
  if (!f.have) {
    f.have = true;
    f.validated = v;
  } else if (v != f.validated && f.writes_inflight == 0 && v.ctime_ns >= f.validated.ctime_ns) {
    // Our own writes are accounted for when they settle (WriteDone), so a
    // new version seen with none in flight is another client's doing. (An
    // older ctime is a reply that left the server before our last write.)
    DropLocked(f);
    f.validated = v;
  }
  if (!f.verified) {
    // Blocks found at start-up: keep those stored under this very version.
    f.verified = true;
    std::vector<uint32_t> stale;
    for (uint32_t s = f.head; s != kNoSlot; s = slots_[s].next) {
      if (VersionOf(slots_[s]) != f.validated) stale.push_back(s);
    }
    for (uint32_t s : stale) {
      if (KeepDirtyOnly(s)) continue;
      FreeSlot(s, true);
      policy_->Release(s);
    }
  }
}

void BlockCache::Drop(const std::string& fh) {
  MutexLock lock(mu_);
  ForgetFile(State(fh));
}

BlockCache::DropResult BlockCache::DropAsOf(const std::string& fh, uint64_t stamp) {
  MutexLock lock(mu_);
  auto it = files_.find(fh);
  if (it == files_.end()) return DropResult::kNothing;
  FileState& f = it->second;
  // A block written since the stamp has a newer write generation (both
  // come from counter_, which only grows): its last writer may not have
  // been asked.
  const auto newer = [this, stamp](uint32_t s) REQUIRES(mu_) {
    return slots_[s].dirty_pin && WbOf(s).wgen > stamp;
  };
  bool asked_dirty = false, any_newer = false;
  for (uint32_t s = f.head; s != kNoSlot; s = slots_[s].next) {
    if (newer(s)) {
      any_newer = true;
    } else if (slots_[s].dirty_pin) {
      asked_dirty = true;
    }
  }
  if (!asked_dirty) return DropResult::kNothing;
  if (!any_newer) {
    ForgetFile(f);
    return DropResult::kDropped;
  }
  std::vector<uint32_t> old;
  for (uint32_t s = f.head; s != kNoSlot; s = slots_[s].next) {
    if (!newer(s)) old.push_back(s);
  }
  for (uint32_t s : old) {
    FreeSlot(s, /*persist=*/true);
    policy_->Release(s);
  }
  stats_.files_dropped++;
  return DropResult::kPartial;
}

bool BlockCache::ForgetFile(FileState& f) {
  std::vector<uint32_t> held = SlotsOf(f);
  bool dirty = false;
  for (uint32_t s : held) {
    dirty = dirty || Dirtyish(slots_[s]);
    FreeSlot(s, /*persist=*/true);
    policy_->Release(s);
  }
  if (!held.empty()) stats_.files_dropped++;
  f.have = false;  // the next Observe sets the version
  f.wb_size = 0;
  f.pruned_upto = f.write_counter = ++counter_;
  f.writes.clear();
  return dirty;
}

bool BlockCache::Truncating(const std::string& fh, std::function<void()> then) {
  MutexLock lock(mu_);
  if (broken_claims_.count(fh)) return false;  // (StaleClaims: the flush fails or empties the index)
  FileState& f = State(fh);
  for (uint32_t s = f.head; s != kNoSlot; s = slots_[s].next) {
    if (AnyBit(DirtyBits(slots_[s]))) return false;  // written since the flush: flush again
  }
  // An old slot of a block moved by copy-on-write still claims older data
  // on disk until the next commit frees it: the truncate waits for that
  // too (its newest copy may have lost its dirty pages to a checksum
  // failure, leaving nothing "cleaning").
  bool retired = false;
  for (const Retire& r : wb_retire_) {
    retired = retired || (slots_[r.slot].gen == r.gen && f.id != kNoFile && slots_[r.slot].file == f.id);
  }
  const bool cleaning = ForgetFile(f) || retired;
  f.truncates_inflight++;  // (until TruncateDone: no fills)
  if (cleaning && writer_.joinable() && !stop_ && !index_broken_) {
    // Records still saying "dirty" on disk must be freed durably before the
    // truncate is sent: a crash must not bring the cut data back.
    Job job{};
    job.barrier = std::move(then);
    jobs_.push_back(std::move(job));
    cv_.SignalAll();
    return true;
  }
  if (retired) {
    Commit();  // (frees the old slots, as a barrier would)
  } else if (cleaning) {
    WriteRecords(/*sync=*/true);
  }
  lock.Unlock();
  then();
  return true;
}

void BlockCache::TruncateDone(const std::string& fh) {
  MutexLock lock(mu_);
  FileState& f = State(fh);
  if (f.truncates_inflight > 0) f.truncates_inflight--;
  // Every read started before the SETATTR was answered may carry what it cut.
  f.pruned_upto = f.write_counter = ++counter_;
  for (auto& [b, w] : f.writes) {
    w.last_begin = f.write_counter;
    w.all_pages = true;
  }
}

uint64_t BlockCache::DropAll() {
  MutexLock lock(mu_);
  uint64_t n = 0;
  for (uint32_t s = 0; s < slots_.size(); ++s) {
    if (slots_[s].file == kNoFile) continue;
    // Dirty blocks keep their unflushed pages only (their clean ones go).
    if (KeepDirtyOnly(s)) continue;
    // A clean slot a write-back write, a read or a flush holds right now
    // (pinned) stays: freeing it would let another block or file take it
    // under that operation.
    if (policy_->Pinned(s)) continue;
    FreeSlot(s, /*persist=*/true);
    policy_->Release(s);
    ++n;
  }
  return n;
}

void BlockCache::OwnChange(const std::string& fh, const FileVersion& before, const FileVersion& after) {
  MutexLock lock(mu_);
  auto it = files_.find(fh);
  if (it == files_.end() || !it->second.have || it->second.writes_inflight != 0) return;
  if (it->second.validated == before) it->second.validated = after;
}

bool BlockCache::Sequential(const std::string& fh, uint64_t off, size_t len, bool write) {
  MutexLock lock(mu_);
  FileState::SeqRuns& f = State(fh).seq[write ? 1 : 0];
  // Close to where a run ended counts as continuing it: readahead and
  // write-behind requests of one stream arrive slightly out of order. How
  // close scales with the request, so that small random requests in a small
  // file do not look like a stream.
  // A run is lengthened by the bytes of the stream it has seen, each once:
  // the part of a request beyond its end, and the part behind its end that
  // falls in a hole a jump ahead left (requests of a stream swapped or
  // delayed). A rewrite or re-read behind the end adds nothing, so a run is
  // never longer than the ground from its first request to its end: random
  // I/O in a file no larger than seq_cutoff never becomes a "stream", and a
  // random request near a run adds at most its own length.
  // A run past the cutoff that jumped ahead within the last kKeepFor
  // accesses also takes a request in one of its holes, however far behind
  // its end: the requests a jump skipped arrive after it (many FUSE threads
  // on a slow machine), and a jump as long as the slack leaves them further
  // behind than the slack. They are the stream's, and bypass as it does.
  // Before the cutoff, and once the jump is old, they start a run of their
  // own: random requests in a small file leave holes all over a run, and
  // must not join it.
  // Two runs are kept. A request near neither starts one in place of the
  // least recently used, but not in place of the longest while that one
  // continued within the last kKeepFor accesses: a stream's stragglers,
  // arriving further behind than the slack, start runs of their own and
  // leave the stream's alone. Replacing the stream's run would restart it
  // (twice: once for the straggler, once for the next request in order) and
  // let another seq_cutoff of it into the cache. Two streams in one file keep
  // a run each. Of two runs near a request, the longer takes it.
  constexpr uint64_t kKeepFor = 16;
  const uint64_t slack = std::clamp<uint64_t>(4 * uint64_t{len}, 512 << 10, 8 << 20);
  const uint64_t end = off + len;
  const uint64_t now = ++f.tick;
  FileState::SeqRun* run = nullptr;
  for (FileState::SeqRun& r : f.runs) {
    if (r.length == 0) continue;
    auto in_hole = [&](const auto& h) { return h.first < h.second && off < h.second && end > h.first; };
    const bool near = (off + slack >= r.next && off <= r.next + slack) ||
                      (r.length > opts_.seq_cutoff && now - r.jumped <= kKeepFor &&
                       std::any_of(r.holes.begin(), r.holes.end(), in_hole));
    if (near && (run == nullptr || r.length > run->length)) run = &r;
  }
  if (run != nullptr) {
    uint64_t credit = end > run->next ? end - std::max(off, run->next) : 0;
    if (off < run->next) {
      // The bytes behind the end that fill holes count, once.
      for (auto& h : run->holes) {
        const uint64_t lo = std::max(off, h.first), hi = std::min(end, h.second);
        if (lo >= hi) continue;
        credit += hi - lo;
        if (lo == h.first) {
          h.first = hi;
        } else if (hi == h.second) {
          h.second = lo;
        } else {  // split: [hi, second) (beyond this request) moves to a free entry
          auto free = std::find_if(run->holes.begin(), run->holes.end(),
                                   [](const auto& x) { return x.first >= x.second; });
          if (free != run->holes.end()) {
            *free = {hi, h.second};
          }  // (else that piece is forgotten)
          h.second = lo;
        }
      }
    } else if (off > run->next) {
      auto slot = std::min_element(run->holes.begin(), run->holes.end(), [](const auto& a, const auto& b) {
        const bool ea = a.first >= a.second, eb = b.first >= b.second;
        return ea != eb ? ea : a.first < b.first;  // an empty entry, else the lowest
      });
      *slot = {run->next, off};
      run->jumped = now;
    }
    run->length += credit;
    run->next = std::max(run->next, end);
  } else {
    auto& rs = f.runs;
    const auto longest = std::max_element(rs.begin(), rs.end(),
                                          [](const auto& a, const auto& b) { return a.length < b.length; });
    for (auto& r : rs) {
      if (&r == &*longest && r.length > 0 && now - r.used <= kKeepFor) continue;
      if (run == nullptr || r.used < run->used) run = &r;
    }
    run->length = len;
    run->next = end;
    run->holes = {};
  }
  run->used = now;
  return opts_.seq_cutoff > 0 && run->length > opts_.seq_cutoff;
}

CrcStore::Got BlockCache::HoldCrcs(const std::vector<uint32_t>& slots, CrcStore::Holds& h) {
  auto got = CrcStore::Got::kHeld;
  for (uint32_t s : slots) {
    const auto held = crcs_->Hold(mu_, s, h);
    const int hold_err = errno;
    // A frame that could not be written back (kept in RAM) is a device error
    // too, reported here, by whichever Hold() met it (once per frame).
    for (const uint64_t we = crcs_->write_errors(); crc_write_errors_ < we; ++crc_write_errors_) {
      DeviceError("writing the cache's page checksums", EIO);
    }
    errno = hold_err;
    switch (held) {
      case CrcStore::Got::kHeld:
        break;
      case CrcStore::Got::kRelocked:
        got = CrcStore::Got::kRelocked;
        break;
      case CrcStore::Got::kFailed: {
        const int err = errno;
        DeviceError("reading or writing the cache's page checksums", err);
        errno = err;
        return CrcStore::Got::kFailed;
      }
    }
  }
  return got;
}

void BlockCache::NoteBypass(bool write) {
  MutexLock lock(mu_);
  (write ? stats_.write_bypasses : stats_.read_bypasses)++;
}

std::optional<std::string> BlockCache::Read(const std::string& fh, uint64_t off, size_t len) {
  struct Piece {
    uint32_t slot;
    uint64_t block;
    uint32_t first_page, npages;
    uint64_t inval;
    std::vector<uint32_t> crc;  // (copied: the table may change meanwhile)
  };
  std::vector<Piece> pieces;
  const uint64_t block = opts_.block;
  const size_t asked = len;
  {
    MutexLock lock(mu_);
    CrcStore::Holds holds(*crcs_);  // (released before the lock)
    auto miss = [this]() REQUIRES(mu_) -> std::optional<std::string> {
      stats_.read_misses++;
      return std::nullopt;
    };
    // Until the pages' CRCs are in RAM with no release of the lock since
    // the lookup (reading them back from the cache disk releases it).
    for (std::vector<uint32_t> need;;) {
      pieces.clear();
      need.clear();
      len = asked;
      if (len == 0 || health_ == Health::kOut) return miss();
      auto fit = files_.find(fh);
      if (fit == files_.end() || !fit->second.have || !fit->second.verified) return miss();
      if (opts_.mode == CacheMode::kWriteBack) {
        // Pages past the end of the file hold zeros that must not show.
        const uint64_t size = LogicalSize(fit->second);
        if (off >= size) {
          stats_.read_hits++;
          return std::string();
        }
        len = static_cast<size_t>(std::min<uint64_t>(len, size - off));
      }
      for (uint64_t b = off / block; b * block < off + len; ++b) {
        const uint32_t s = Lookup(fit->second.id, b);
        if (s == kNoSlot) return miss();
        const Slot& slot = slots_[s];
        const uint64_t lo = std::max(off, b * block) - b * block;
        const uint64_t hi = std::min(off + len, (b + 1) * block) - b * block;
        const uint32_t p0 = static_cast<uint32_t>(lo / kPage), p1 = static_cast<uint32_t>((hi - 1) / kPage);
        for (uint32_t p = p0; p <= p1; ++p) {
          // (A page being rewritten in place: the server read and the
          // overlay that follows it sort that out.)
          if (!TestBit(Valid(slot), p) || Rewriting(s, p)) return miss();
        }
        pieces.push_back(Piece{s, b, p0, p1 - p0 + 1, slot.inval, {}});
        need.push_back(s);
      }
      const auto got = HoldCrcs(need, holds);
      if (got == CrcStore::Got::kFailed) return miss();
      if (got == CrcStore::Got::kHeld) break;
    }
    for (auto& p : pieces) {
      const uint32_t* crc = PageCrcs(slots_[p.slot]);
      p.crc.assign(crc + p.first_page, crc + p.first_page + p.npages);
    }
    for (const auto& p : pieces) {
      policy_->Pin(p.slot);
      policy_->Touch(p.slot);
    }
  }
  std::string out(len, '\0');
  AlignedBuf buf;
  bool ok = true, io_error = false;
  size_t bad_piece = 0;
  uint32_t bad_page = 0;
  for (size_t i = 0; i < pieces.size() && ok; ++i) {
    const Piece& p = pieces[i];
    buf.resize(size_t{p.npages} * kPage);
    const uint64_t slot_off = uint64_t{p.slot} * block;
    if (!data_->ReadAt(buf.data(), buf.size(), slot_off + uint64_t{p.first_page} * kPage)) {
      ok = false;
      io_error = true;
      break;
    }
    for (uint32_t k = 0; k < p.npages; ++k) {
      if (Crc(buf.data() + size_t{k} * kPage, kPage) != p.crc[k]) {
        ok = false;
        bad_piece = i;
        bad_page = p.first_page + k;
        break;
      }
    }
    if (!ok) break;
    // Copy the requested part of these pages.
    const uint64_t piece_start = p.block * block + uint64_t{p.first_page} * kPage;
    const uint64_t from = std::max(off, piece_start);
    const uint64_t to = std::min(off + len, piece_start + buf.size());
    std::memcpy(out.data() + (from - off), buf.data() + (from - piece_start), to - from);
  }
  MutexLock lock(mu_);
  for (const auto& p : pieces) policy_->Unpin(p.slot);
  if (io_error) {
    DeviceError("reading the cache", errno);
    stats_.read_misses++;
    return std::nullopt;
  }
  if (!ok) {
    const Piece& p = pieces[bad_piece];
    Slot& slot = slots_[p.slot];
    if (slot.inval == p.inval && TestBit(Valid(slot), bad_page)) {
      // Not a race with an invalidation: the page on disk is damaged.
      DropDamagedPage(p.slot, bad_page);
    }
    stats_.read_misses++;
    return std::nullopt;
  }
  stats_.read_hits++;
  return out;
}

uint64_t BlockCache::ReadStart(const std::string& fh) {
  MutexLock lock(mu_);
  return State(fh).write_counter;
}

template <class Allowed>
void BlockCache::StoreLocked(const std::string& fh, FileState& f, uint64_t off, const char* data,
                             size_t len, Allowed allowed, bool count_write_hits) {
  if (health_ != Health::kHealthy || !f.have) return;
  const uint64_t block = opts_.block;
  // Whole pages only.
  const uint64_t first = (off + kPage - 1) / kPage * kPage;
  const uint64_t end = (off + len) / kPage * kPage;
  bool queued = false;
  for (uint64_t b = first / block; b * block < end && first < end; ++b) {
    const uint64_t lo = std::max(first, b * block), hi = std::min(end, (b + 1) * block);
    if (lo >= hi || !allowed(b)) continue;
    const uint64_t key = PolicyKey(fh, b);
    uint32_t s;
    if (const uint32_t found = f.id == kNoFile ? kNoSlot : Lookup(f.id, b); found != kNoSlot) {
      s = found;
      if (count_write_hits) stats_.write_hits++;
    } else {
      if (!policy_->Admit(key)) continue;
      auto got = AllocateSlot(key);
      if (!got) continue;
      s = *got;
      Slot& slot = slots_[s];
      Attach(s, f, b);
      List(s);
      Valid(slot).Clear();
      SetVersion(slot, f.validated);
      slot.gen++;
      slot.rec_seq = seq_++;  // (its record may be written with a neighbour's)
      TableSet(s);
    }
    Slot& slot = slots_[s];
    const uint32_t p0 = static_cast<uint32_t>((lo - b * block) / kPage);
    Job job{};
    job.slot = s;
    job.gen = slot.gen;
    job.inval = slot.inval;
    job.first_page = p0;
    job.data.resize(hi - lo);
    std::memcpy(job.data.data(), data + (lo - off), hi - lo);
    jobs_.push_back(std::move(job));
    queued = true;
  }
  if (queued) cv_.Signal();
}

bool BlockCache::Changed(const FileState& f, uint64_t block, uint64_t token) {
  auto it = f.writes.find(block);
  if (it == f.writes.end()) return f.pruned_upto > token;
  return it->second.inflight != 0 || it->second.last_begin > token;
}

bool BlockCache::PageChanged(const FileState& f, uint64_t block, uint32_t page, uint64_t token) {
  auto it = f.writes.find(block);
  if (it == f.writes.end()) return f.pruned_upto > token;
  const BlockWrites& w = it->second;
  if (w.inflight == 0 && w.last_begin <= token) return false;
  return w.all_pages || TestBit(w.pages, page);
}

void BlockCache::NoteChange(FileState& f, uint64_t block, uint32_t p0, uint32_t np) {
  if (f.writes.size() > 4096 && f.writes_inflight == 0) {
    f.writes.clear();
    f.pruned_upto = f.write_counter;
  }
  BlockWrites& w = f.writes[block];
  w.last_begin = f.write_counter = ++counter_;
  for (uint32_t p = p0; p < p0 + np; ++p) SetBit(w.pages, p);
}

void BlockCache::Fill(const std::string& fh, uint64_t token, uint64_t off, const char* data, size_t len) {
  MutexLock lock(mu_);
  FileState& f = State(fh);
  StoreLocked(fh, f, off, data, len,
              [&f, token](uint64_t b) { return f.truncates_inflight == 0 && !Changed(f, b, token); }, false);
}

uint64_t BlockCache::WriteStart(const std::string& fh, uint64_t off, size_t len, bool invalidate) {
  MutexLock lock(mu_);
  FileState& f = State(fh);
  if (invalidate) stats_.writes++;  // (not the flusher's)
  f.writes_inflight++;
  f.burst_concurrency = std::max(f.burst_concurrency, f.writes_inflight);
  const uint64_t token = f.write_counter = ++counter_;
  const uint64_t block = opts_.block;
  for (uint64_t b = off / block; b * block < off + len; ++b) {
    BlockWrites& w = f.writes[b];
    w.last_begin = token;
    w.inflight++;
    const uint64_t lo = std::max(off, b * block) - b * block;
    const uint64_t hi = std::min(off + len, (b + 1) * block) - b * block;
    if (invalidate) {
      w.all_pages = true;
    } else {
      for (uint64_t p = lo / kPage; p <= (hi - 1) / kPage; ++p) SetBit(w.pages, static_cast<uint32_t>(p));
    }
    const uint32_t s = f.id == kNoFile ? kNoSlot : Lookup(f.id, b);
    if (s == kNoSlot || !invalidate) continue;
    Slot& slot = slots_[s];
    bool changed = false;
    for (uint32_t p = static_cast<uint32_t>(lo / kPage); p <= (hi - 1) / kPage; ++p) {
      if (TestBit(DirtyBits(slot), p)) continue;  // unflushed: newer than any write sent around it
      if (TestBit(Valid(slot), p)) {
        ClearBit(Valid(slot), p);
        used_pages_--;
        changed = true;
      }
    }
    slot.inval++;
    if (changed) {
      stats_.invalidations++;
      Persist(s);  // before the write leaves: a crash must not resurrect old data
    }
  }
  return token;
}

void BlockCache::WriteDone(const std::string& fh, uint64_t token, uint64_t off, const char* data,
                           size_t len, bool ok, bool admit, const std::optional<FileVersion>& before,
                           const std::optional<FileVersion>& after) {
  MutexLock lock(mu_);
  FileState& f = State(fh);
  const uint64_t block = opts_.block;
  if (ok && admit && opts_.mode == CacheMode::kWriteThrough) {
    // Stored only where no other write to the block started after this one
    // or is still in flight (it might land on the server after this one).
    StoreLocked(fh, f, off, data, len,
                [&f, token](uint64_t b) {
                  auto it = f.writes.find(b);
                  return it != f.writes.end() && it->second.last_begin == token &&
                         it->second.inflight == 1;
                },
                true);
  }
  for (uint64_t b = off / block; b * block < off + len; ++b) {
    auto it = f.writes.find(b);
    if (it != f.writes.end()) it->second.inflight--;
  }
  f.writes_inflight--;
  // WCC bookkeeping: is every change to the file this client's own?
  if (ok) {
    if (!after) {
      f.unexplained = true;  // no idea what the file is now
    } else {
      // Without pre-op attributes (NFS-Ganesha sends none for WRITE) the
      // change is taken as ours, as the Linux client does (force_wcc).
      if (before && before->ctime_ns != f.validated.ctime_ns && !f.own_ctimes.count(before->ctime_ns)) {
        f.pending_pre.insert(before->ctime_ns);
      }
      f.own_ctimes.insert(after->ctime_ns);
      f.pending_pre.erase(after->ctime_ns);
      if (!f.newest_after || after->ctime_ns >= f.newest_after->ctime_ns) f.newest_after = after;
    }
  }
  if (f.writes_inflight == 0) Settle(f);
}

void BlockCache::Settle(FileState& f) {
  if ((!f.pending_pre.empty() && f.burst_concurrency <= 1) || f.unexplained) {
    // Another client changed the file between our writes (or the server
    // gave no WCC data to tell): nothing cached of it can be trusted.
    DropLocked(f);
    f.have = false;
  } else if (f.newest_after) {
    f.validated = *f.newest_after;
  }
  f.own_ctimes.clear();
  f.pending_pre.clear();
  f.burst_concurrency = 0;
  f.newest_after.reset();
  f.unexplained = false;
  f.pruned_upto = f.write_counter;
  f.writes.clear();
}

void BlockCache::DeviceError(const char* what, int err) {
  stats_.device_errors++;
  const Health before = health_;
  health_ = stats_.device_errors >= kOutAfterErrors ? Health::kOut : Health::kDegraded;
  if (health_ != before) {
    Log("cache")->warn("cache disk error {}: {}; cache now {}", what, std::strerror(err),
                       health_ == Health::kOut ? "out of service" : "degraded (not caching new data)");
  }
}

bool BlockCache::Probe() {
  const std::string path = opts_.dir + "/probe";
  auto f = disk_.Open(path, Disk::kCreate);
  if (!f) return false;
  std::string page(kPage, 'p'), back(kPage, '\0');
  bool ok = (*f)->Truncate(0) && (*f)->WriteAt(page.data(), page.size(), 0) && (*f)->Sync() &&
            (*f)->ReadAt(back.data(), back.size(), 0) && back == page;
  f->reset();
  disk_.Remove(path);
  return ok;
}

void BlockCache::WriterMain() {
  MutexLock lock(mu_);
  auto next_probe = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (true) {
    if (!durable_waiters_.empty() ||
        (WbPending() && (stop_ || commit_asked_ || std::chrono::steady_clock::now() >= commit_due_ ||
                         wb_retire_.size() > nslots_ / 8))) {
      // Acknowledged write-back writes become durable: asked for (fsync,
      // Quiesce, unmount), a second after the first of them, or when the
      // old slots of moved blocks waiting for it grow many.
      writing_ = true;
      Commit();
      // Under a steady stream of commits, the mark (below) is also written
      // every 10 s, after the commit answered its waiters: what a load must
      // check stays about what 10 s wrote.
      if (!index_broken_ && journal_->MarkBehind() &&
          std::chrono::steady_clock::now() - last_mark_ >= std::chrono::seconds(10)) {
        WriteMark();
      }
      continue;
    }
    if (jobs_.empty() && WbPending()) {
      // Records wait for the commit too (it writes them all at once).
      writing_ = false;
      idle_cv_.SignalAll();
      cv_.WaitUntil(mu_, commit_due_);
      continue;
    }
    if (jobs_.empty() && !queued_groups_.empty()) {
      // Record changes made outside the writer (invalidations, frees,
      // version updates): written now, synced by the next barrier.
      writing_ = true;
      // (Synced if slots are held for it: rule 2a.)
      WriteRecords(/*sync=*/!tombs_.empty());
      continue;
    }
    if (jobs_.empty()) {
      DiscardBrokenIndex();
      if (!jobs_.empty() || !queued_groups_.empty()) continue;
      writing_ = false;
      commit_asked_ = false;  // (nothing pending: a Quiesce() is answered)
      idle_cv_.SignalAll();
      if (stop_) return;
      if (health_ != Health::kHealthy) {
        cv_.WaitUntil(mu_, next_probe);
        if (std::chrono::steady_clock::now() >= next_probe) {
          next_probe = std::chrono::steady_clock::now() + std::chrono::seconds(30);
          lock.Unlock();
          const bool ok = Probe();
          lock.Lock();
          if (ok && health_ != Health::kHealthy && !stop_) {
            // A failed record write broke the index: stay out then.
            if (!index_broken_) {
              health_ = Health::kHealthy;
              stats_.device_errors = 0;
              Log("cache")->warn("cache disk answers again; cache healthy");
            }
          }
        }
      } else if (journal_ && !index_broken_ && journal_->MarkBehind()) {
        // Idle a while after a sync: its pages are marked synced (index.h),
        // a check the next mount's load then skips. (Not at once: a stream
        // of fsyncs would pay a second sync each.)
        const auto due = last_sync_ + opts_.commit_interval;
        if (std::chrono::steady_clock::now() < due) {
          cv_.WaitUntil(mu_, due);
          continue;
        }
        writing_ = true;
        WriteMark();
      } else {
        cv_.Wait(mu_);
      }
      continue;
    }
    writing_ = true;
    if (jobs_.front().barrier) {
      // Everything queued before it is durable before it runs.
      Job job = std::move(jobs_.front());
      jobs_.pop_front();
      Commit();
      lock.Unlock();
      job.barrier();
      lock.Lock();
      continue;
    }
    if (jobs_.front().wb) {
      // Write-back writes are applied in batches and acknowledged; a later
      // commit makes them durable (one sync of the data file, records
      // included, for all of them).
      std::vector<Job> batch;
      while (!jobs_.empty() && jobs_.front().wb && batch.size() < 64) {
        batch.push_back(std::move(jobs_.front()));
        jobs_.pop_front();
      }
      WriterWb(batch);
      continue;
    }
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    WriteFill(job);
  }
}

void BlockCache::WriteFill(Job& job) {
  Slot& slot = slots_[job.slot];
  const uint32_t np = static_cast<uint32_t>(job.data.size() / kPage);
  auto current = [&] { return slot.gen == job.gen && slot.inval == job.inval; };
  // Checked before writing too: the slot may hold another block by now,
  // and pages valid already are as new as this data or newer (dirty ones
  // certainly), so only invalid pages are written.
  if (!current()) return;
  PageBits fresh{};  // pages not valid yet
  for (uint32_t k = 0; k < np; ++k) {
    if (!TestBit(Valid(slot), job.first_page + k)) SetBit(fresh, job.first_page + k);
  }
  mu_.Unlock();
  std::vector<uint32_t> crcs(np);
  bool wrote = true;
  int err = 0;
  for (uint32_t k = 0; k < np && wrote;) {
    if (!TestBit(fresh, job.first_page + k)) {
      ++k;
      continue;
    }
    uint32_t e = k;
    while (e < np && TestBit(fresh, job.first_page + e)) {
      crcs[e] = Crc(job.data.data() + size_t{e} * kPage, kPage);
      ++e;
    }
    const uint64_t at = uint64_t{job.slot} * opts_.block + uint64_t{job.first_page + k} * kPage;
    wrote = data_->WriteAt(job.data.data() + size_t{k} * kPage, size_t{e - k} * kPage, at);
    err = errno;
    k = e;
  }
  mu_.Lock();
  if (!wrote) return DeviceError("writing the cache", err);
  CrcStore::Holds holds(*crcs_);
  if (HoldCrcs({job.slot}, holds) == CrcStore::Got::kFailed) return;
  if (!current()) return;  // given to another block, or invalidated meanwhile
  uint32_t filled = 0;
  for (uint32_t k = 0; k < np; ++k) {
    const uint32_t p = job.first_page + k;
    if (!TestBit(fresh, p) || TestBit(Valid(slot), p)) continue;
    used_pages_++;
    SetBit(Valid(slot), p);
    MutCrcs(slot)[p] = crcs[k];
    ++filled;
  }
  // Filled pages are not in a copy-on-write partner (WbSlot::delta).
  if (auto it = wb_.find(job.slot); it != wb_.end()) {
    for (uint32_t k = 0; k < np; ++k) {
      if (TestBit(fresh, job.first_page + k)) SetBit(it->second.delta, job.first_page + k);
    }
  }
  if (filled == 0) return;
  if (const FileState& f = FileOf(slot); f.have) SetVersion(slot, f.validated);
  stats_.pages_filled += filled;
  Persist(job.slot);
}

void BlockCache::Quiesce(bool commit) {
  MutexLock lock(mu_);
  if (!writer_.joinable() || stop_) return;
  auto done = [this, commit]() REQUIRES(mu_) {
    return jobs_.empty() && !writing_ && (!commit || (queued_groups_.empty() && !WbPending()));
  };
  if (commit && !done()) {
    // (Also for writes still queued: they are pending once applied. Not
    // when nothing is: the request would outlive this call and commit the
    // next write at once.)
    commit_asked_ = true;
    cv_.SignalAll();
  }
  while (!done()) idle_cv_.Wait(mu_);
}

CacheStats BlockCache::Stats() const {
  MutexLock lock(mu_);
  CacheStats s = stats_;
  s.state = health_ == Health::kHealthy ? "healthy" : health_ == Health::kDegraded ? "degraded" : "out";
  s.capacity_bytes = capacity_bytes();
  s.slots = nslots_;
  s.slots_used = policy_->in_use();
  s.used_bytes = used_pages_ * kPage;
  s.files_cached = file_ids_.size() - free_file_ids_.size();
  const auto crc = crcs_->counters();
  s.checksum_reads = crc.reads;
  s.checksum_writes = crc.writes;
  s.checksum_ram_bytes = crc.ram_bytes;
  const auto now = std::chrono::steady_clock::now();
  std::chrono::steady_clock::duration oldest{};
  for (uint32_t k : dirty_set_) {
    // (The old copy of a block moved by copy-on-write stays dirty until the
    // commit that frees it: it is not more unflushed data.)
    if (Lookup(slots_[k].file, slots_[k].block) != k) continue;
    s.dirty_blocks++;
    for (auto w : DirtyBits(slots_[k])) s.dirty_bytes += uint64_t{static_cast<uint32_t>(__builtin_popcountll(w))} * kPage;
    oldest = std::max(oldest, now - WbOf(k).dirty_since);
  }
  s.dirty_age_s = std::chrono::duration<double>(oldest).count();
  s.flush_rate_bps = flush_window_.PerSecond(MonotonicSec());
  return s;
}


}  // namespace mpnfs::cache
