#include "cache/block_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <utility>

#include "cache/cache_dir.h"
#include "common/log.h"

namespace mpnfs::cache {
namespace {

// Whole seconds of the monotonic clock (the flush rate's window).
int64_t NowSec() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

constexpr uint32_t kMinSlots = 16;
constexpr int kOutAfterErrors = 8;

Error Sys(const std::string& what) {
  return Error::Errno(errno, what + ": " + std::strerror(errno));
}

const char* ModeName(CacheMode m) {
  switch (m) {
    case CacheMode::kReadOnly: return "readonly";
    case CacheMode::kWriteThrough: return "writethrough";
    case CacheMode::kWriteBack: return "writeback";
    default: return "off";
  }
}

// Whether the index of geometry `g` in `dir` holds dirty records.
Result<bool> IndexHasDirty(Disk& disk, const std::string& dir, const Geometry& g, File* data) {
  auto index = Index::Open(disk, dir, g, data);
  if (!index) return index.error();
  bool dirty = false;
  auto st = (*index)->Load([&dirty](uint32_t, Record&& r) { dirty = dirty || AnyBit(r.dirty); });
  if (!st) return st.error();
  return dirty;
}

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

Result<std::unique_ptr<BlockCache>> BlockCache::Open(const CacheOptions& opts) {
  if (opts.block < 64 * 1024 || opts.block > kMaxPages * kPage || (opts.block & (opts.block - 1))) {
    return Error::Errno(EINVAL, "cache_block must be a power of two from 64 to 1024 KiB");
  }
  std::unique_ptr<BlockCache> c(new BlockCache(opts));
  auto r = c->Init();
  if (!r) return r.error();
  return c;
}

Result<bool> BlockCache::Init() {
  // From here on the cache lives at the path the check resolved (see
  // CheckCacheDir); messages name it too.
  auto trusted = CheckCacheDir(opts_.dir);
  if (!trusted) return trusted.error();
  opts_.dir = *trusted;
  const std::string& dir = opts_.dir;
  if (access(dir.c_str(), W_OK | X_OK) != 0) {
    return Error::Errno(EACCES, "cache_dir " + dir + ": not writable");
  }
  auto lock = LockCacheDir(dir, opts_.lock_wait);
  if (!lock) return lock.error();
  lock_fd_ = *lock;

  const std::string data_path = dir + "/data", index_path = dir + "/" + Index::kName;
  // Size: cache_size, but never more than the filesystem can hold while
  // keeping 5% of it free (the data file is preallocated below).
  struct statvfs vfs{};
  if (statvfs(dir.c_str(), &vfs) != 0) return Sys("statvfs " + dir);
  const uint64_t have = disk_.Allocated(data_path) + disk_.Allocated(index_path);
  const uint64_t total = uint64_t{vfs.f_blocks} * vfs.f_frsize;
  const uint64_t avail = uint64_t{vfs.f_bavail} * vfs.f_frsize + have;
  const uint64_t margin = total / 20;
  const uint64_t per_slot = opts_.block + Index::RegionBytes(Geometry{opts_.block, 4096}) / 4096 + 1;
  uint64_t want = opts_.size / opts_.block;
  const uint64_t fit = avail > margin ? (avail - margin) / per_slot : 0;
  if (fit < want) {
    Log("cache")->warn("cache_dir {}: room for {} MiB only (keeping 5% of the filesystem free); "
                       "cache_size lowered from {} MiB",
                       dir, fit * opts_.block >> 20, opts_.size >> 20);
    want = fit;
  }
  if (want < kMinSlots) {
    return Error::Errno(ENOSPC, "cache_dir " + dir + ": no room for a cache (" +
                                    std::to_string(avail >> 20) + " MiB available)");
  }
  Geometry g{opts_.block, static_cast<uint32_t>(std::min<uint64_t>(want, UINT32_MAX - 1)),
             opts_.index_per_page};

  // A cache of format 3 is converted first, keeping every record.
  if (auto up = Index::Upgrade(disk_, dir); !up) {
    return Error::Errno(up.error().err, "cache_dir " + dir + ": converting the index of format 3: " +
                                            up.error().what + "; refusing to start rather than lose "
                                            "write-back data");
  }
  // Reuse what a previous mount left if it has the same geometry. An index
  // that cannot be read is refused, never replaced (it may hold the only
  // copy of acknowledged writes).
  auto found = Index::Probe(disk_, dir);
  if (!found) return Error::Errno(found.error().err, "cache_dir " + dir + ": " + found.error().what);
  // cache_direct: cached data lives on the cache disk only, not a second
  // time in the page cache. Filesystems without O_DIRECT get buffered I/O.
  auto data = disk_.Open(data_path, Disk::kCreate | (opts_.direct ? Disk::kDirect : 0));
  if (!data) return Error::Errno(data.error().err, "cache data file " + data.error().what);
  data_ = std::move(*data);
  bool reuse = false;
  if (*found && **found == g) {
    reuse = true;
  } else if (*found) {
    // Write-back data not yet on the server is never thrown away for a
    // change of geometry: the cache keeps its old one until it is flushed.
    auto dirty = IndexHasDirty(disk_, dir, **found, data_.get());
    if (!dirty) return Error::Errno(dirty.error().err, "cache_dir " + dir + ": " + dirty.error().what);
    if (*dirty) {
      g = **found;
      reuse = true;
      Log("cache")->warn("cache_dir {} holds write-back data not yet on the server: keeping its "
                         "geometry ({} MiB in {} KiB blocks) for this mount",
                         dir, (uint64_t{g.slots} * g.block) >> 20, g.block >> 10);
    } else {
      Log("cache")->warn("cache_dir {}: cache_size or cache_block changed; starting empty", dir);
      // Gone before the data file is resized under it (a crash then finds
      // no index, not one whose records were cut off).
      if (!disk_.Remove(index_path) || !disk_.SyncDir(dir)) return Sys("removing " + index_path);
    }
  }
  opts_.block = g.block;
  opts_.size = uint64_t{g.slots} * g.block;
  nslots_ = g.slots;
  const uint64_t data_size = Index::DataFileBytes(g);
  if (!reuse) {
    // The record region is cleared (cut and grown again), then the data
    // file synced, before the index that points into it exists.
    if (!data_->Truncate(std::min(data_->Size(), Index::RegionOffset(g))) || !data_->Truncate(data_size) ||
        !data_->Allocate(data_size)) {
      return Sys("sizing the cache data file " + data_path);
    }
    if (!data_->Sync()) return Sys("syncing " + data_path);
    auto made = Index::Create(disk_, dir, g);
    if (!made) return Error::Errno(made.error().err, "cache_dir " + dir + ": " + made.error().what);
    disk_.Remove(dir + "/meta");  // format 2 kept its geometry there
  }
  auto index = Index::Open(disk_, dir, g, data_.get());
  if (!index) return Error::Errno(index.error().err, "cache index " + index.error().what);
  journal_ = std::move(*index);
  {
    std::lock_guard lock(mu_);
    group_batch_.assign((nslots_ + journal_->per_page() - 1) / journal_->per_page(), 0);
  }
  if (auto id = ReadWholeFile(disk_, dir + "/id"); id && id->size() == 33 && id->back() == '\n') {
    id_ = id->substr(0, 32);
  } else {
    std::random_device rd;
    id_ = fmt::format("{:08x}{:08x}{:08x}{:08x}", rd(), rd(), rd(), rd());
    if (auto r = ReplaceFile(disk_, dir, "id", id_ + "\n"); !r) {
      return Error::Errno(r.error().err, "cache_dir " + dir + ": " + r.error().what);
    }
  }

  slots_.resize(nslots_);
  bits_.assign(size_t{nslots_} * kBitKinds * words(), 0);
  crcs_ = CrcTable::Open(dir, nslots_, pages());
  if (!crcs_) return Sys("mapping the page checksum table");
  block_table_.assign(size_t{nslots_} + nslots_ / 2 + 16, kNoSlot);  // load at most 2/3
  // The policy asks for the key of a slot it evicts (under mu_, while the
  // slot still holds its block) rather than keeping one per slot.
  policy_ = std::make_unique<TwoQueue>(nslots_, opts_.admit_second,
                                       [this](uint32_t s) NO_THREAD_SAFETY_ANALYSIS {
                                         const Slot& slot = slots_[s];
                                         return slot.file == kNoFile ? 0 : PolicyKey(Fh(slot), slot.block);
                                       });
  stats_.mode = ModeName(opts_.mode);
  if (reuse) {
    if (auto r = LoadIndex(); !r) {
      return Error::Errno(r.error().err, "cache_dir " + dir + ": " + r.error().what +
                                             "; refusing to start rather than lose write-back data");
    }
    // Claims that lost to newer ones are freed durably before anything
    // else happens (a later crash must not find the older claim alone).
    std::unique_lock lock(mu_);
    if (!WriteRecords(lock, /*sync=*/true)) return Sys("writing the cache index in " + dir);
    // Then the empty claims that won (rule 2a: had they been freed with
    // the claims they superseded, a crash could keep those alone).
    if (!load_empties_.empty()) {
      for (uint32_t e : load_empties_) {
        // (SettleTombs released it after the first sync: it waits for nothing.)
        if (tombs_.erase(e)) policy_->Unpin(e);
        Persist(e);
      }
      load_empties_.clear();
      if (!WriteRecords(lock, /*sync=*/true)) return Sys("writing the cache index in " + dir);
    }
  }
  if (dirty_slots_ > 0 && opts_.mode != CacheMode::kWriteBack) {
    uint64_t pages_dirty = 0;
    for (uint32_t s : dirty_set_) {
      for (auto w : DirtyBits(slots_[s])) pages_dirty += static_cast<uint64_t>(__builtin_popcountll(w));
    }
    return Error::Errno(EBUSY, fmt::format("cache_dir {} holds {} KiB of write-back data not yet on "
                                           "the server; mount it with cache_mode=writeback to flush it",
                                           dir, pages_dirty * (kPage / 1024)));
  }
  writer_ = std::thread([this] { WriterMain(); });
  reader_thread_ = std::thread([reader = reader_] { reader->Main(); });
  Log("cache")->info("cache {} in {}: {} MiB in {} KiB blocks, {} blocks kept from before ({} dirty)",
                     stats_.mode, dir, capacity_bytes() >> 20, opts_.block >> 10, policy_->in_use(),
                     dirty_slots_);
  return true;
}

Status BlockCache::LoadIndex() NO_THREAD_SAFETY_ANALYSIS {  // before the writer starts
  const uint32_t ppb = pages();
  // Every claim to a block, loaded or not: when a crash left two slots
  // claiming one block (a copy-on-write move whose old slot was not freed
  // yet), the newer claim wins, even one with nothing valid left. A loaded
  // claim is found through the block table; claims with nothing valid
  // (rare: left by a crash) are kept aside while loading.
  struct Claim {
    uint32_t slot;
    uint64_t seq;
  };
  std::unordered_map<std::string, Claim> empty_claims;
  std::vector<uint32_t> superseded;
  auto st = journal_->Load([&](uint32_t s, Record&& r) {
    seq_ = std::max(seq_, r.seq + 1);
    uint32_t other = kNoSlot;
    uint64_t other_seq = 0;
    bool other_loaded = false;
    std::string key;
    if (auto fit = files_.find(r.fh); fit != files_.end() && fit->second.id != kNoFile) {
      other = Lookup(fit->second.id, r.block);
      if (other != kNoSlot) {
        other_seq = slots_[other].rec_seq;
        other_loaded = true;
      }
    }
    if (other == kNoSlot && !empty_claims.empty()) {
      key = Key(r.fh, r.block);
      if (auto it = empty_claims.find(key); it != empty_claims.end()) {
        other = it->second.slot;
        other_seq = it->second.seq;
        empty_claims.erase(it);
      }
    }
    if (other != kNoSlot) {
      if (other_seq > r.seq) {
        if (!other_loaded) empty_claims[key] = Claim{other, other_seq};  // (still the newest)
        superseded.push_back(s);
        return;
      }
      if (other_loaded) {
        FreeSlot(other, false);
        policy_->Release(other);
      }
      superseded.push_back(other);
    }
    if (!AnyBit(r.valid)) {
      if (key.empty()) key = Key(r.fh, r.block);
      empty_claims[key] = Claim{s, r.seq};
      superseded.push_back(s);
      return;
    }
    Slot& slot = slots_[s];
    auto [fit, made] = files_.try_emplace(r.fh);  // (no pruning while loading)
    FileState& f = fit->second;
    if (made) {
      f.fh = &fit->first;
      f.write_counter = f.pruned_upto = ++counter_;
    }
    Attach(s, f, r.block);
    List(s);
    Valid(slot) = r.valid;
    DirtyBits(slot) = r.dirty;
    std::copy_n(r.crc.begin(), std::min<size_t>(r.crc.size(), ppb), PageCrcs(slot));
    if (r.fsize != 0 || AnyBit(r.dirty) || r.uid != 0 || r.gid != 0 || !r.groups.empty()) {
      WbSlot& wb = Wb(s);
      wb.claimed = r.dirty;
      wb.fsize = r.fsize;
      wb.uid = r.uid;
      wb.groups = std::move(r.groups);
      wb.gid = r.gid;
      wb.dirty_since = std::chrono::steady_clock::now();
    }
    SetVersion(slot, r.version);
    slot.rec_seq = r.seq;
    TableSet(s);
    policy_->Adopt(s, PolicyKey(r.fh, r.block), /*hot=*/false);
    SetDirtyPin(s);
    for (uint32_t p = 0; p < ppb; ++p) used_pages_ += TestBit(Valid(slot), p) ? 1 : 0;
  });
  if (!st) return st;
  // The size unflushed writes imply, from the claims that won (one that
  // lost may have been loaded first).
  for (uint32_t s = 0; s < nslots_; ++s) {
    const Slot& slot = slots_[s];
    if (slot.file == kNoFile || !AnyBit(DirtyBits(slot))) continue;
    FileState& f = FileOf(slot);
    f.wb_size = std::max(f.wb_size, WbOf(s).fsize);
  }
  // (What was read may have been in the page cache only, the last mount
  // killed: Index::Load synced the data file, records and pages, first.)
  // A superseded claim must not come back once the newer one is gone: free
  // it on disk too (queued, written by the writer).
  // (Empty claims that won are freed once the claims they superseded are
  // durably freed: Open().)
  // Until then they are written as tombstones (as they are on disk), with
  // their own sequence numbers, should their index page be written with
  // another record's change (found by review).
  std::unordered_set<uint32_t> winners;
  for (const auto& [k, c] : empty_claims) {
    winners.insert(c.slot);
    uint64_t block = 0;
    std::memcpy(&block, k.data() + k.size() - sizeof(block), sizeof(block));
    tombs_[c.slot] = Tomb{k.substr(0, k.size() - sizeof(block)), block, {}};
    slots_[c.slot].rec_seq = c.seq;
    policy_->Pin(c.slot);  // (as every tombstone: SettleTombs unpins it)
  }
  for (uint32_t s : superseded) {
    if (slots_[s].file != kNoFile) continue;
    if (winners.count(s)) {
      load_empties_.push_back(s);
    } else {
      Persist(s);
    }
  }
  return Ok{};
}

void BlockCache::Reader::Post(std::function<void()> task) {
  std::lock_guard lock(mu_);
  tasks_.push_back(std::move(task));
  cv_.notify_one();
}

void BlockCache::Reader::Stop() {
  std::lock_guard lock(mu_);
  stop_ = true;
  cv_.notify_one();
}

void BlockCache::Reader::Main() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // stopped
    auto task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    task();
    task = nullptr;  // (may drop the last reference to its cache)
    lock.lock();
  }
}

BlockCache::~BlockCache() {
  reader_->Stop();
  if (reader_thread_.joinable()) {
    // The reader's last task may hold the last reference to this cache:
    // its thread then finishes on its own (its queue outlives the cache).
    if (reader_thread_.get_id() == std::this_thread::get_id()) {
      reader_thread_.detach();
    } else {
      reader_thread_.join();
    }
  }
  if (writer_.joinable()) {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    writer_.join();
  }
  if (journal_) {
    std::unique_lock lock(mu_);
    // Blocks of files whose version moved by our own writes are still
    // right: record the new version so that the next mount keeps them.
    for (uint32_t s = 0; s < slots_.size(); ++s) {
      Slot& slot = slots_[s];
      if (slot.file == kNoFile) continue;
      const FileState& f = FileOf(slot);
      if (!f.have || f.writes_inflight != 0) continue;
      if (VersionOf(slot) != f.validated) {
        SetVersion(slot, f.validated);
        Persist(s);
      }
    }
    // (The writer is gone: this thread is the index's only writer now.)
    Commit(lock);
    if (!index_broken_ && !journal_->Mark()) IndexFailed("writing or syncing the cache index's mark", errno);
    DiscardBrokenIndex(lock);  // again: the disk may take it now
  }
  if (lock_fd_ >= 0) close(lock_fd_);  // releases the flock
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

void BlockCache::Persist(uint32_t s) {
  slots_[s].rec_seq = seq_++;
  if (index_broken_) return;
  queued_groups_.insert(journal_->GroupOf(s));
  cv_.notify_all();
}

bool BlockCache::WriteRecords(std::unique_lock<std::mutex>& lock, bool sync) {
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
  std::vector<std::pair<uint32_t, std::vector<Record>>> out;
  out.reserve(queued_groups_.size());
  const uint64_t batch = ++batches_;
  for (uint32_t g : queued_groups_) {
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
  queued_groups_.clear();
  lock.unlock();
  bool ok = true;
  for (const auto& [g, recs] : out) {
    if (!journal_->WriteGroup(g, recs)) {
      ok = false;
      break;
    }
  }
  if (ok && sync) ok = journal_->Sync();
  const int err = errno;
  lock.lock();
  if (ok && sync) {
    wb_unsynced_ = false;
    last_sync_ = std::chrono::steady_clock::now();
    synced_batch_ = std::max(synced_batch_, batch);
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
    IndexFailed(sync ? "writing or syncing the cache index and data" : "writing the cache index", err);
  }
  return ok;
}

void BlockCache::WriteMark(std::unique_lock<std::mutex>& lock) {
  last_mark_ = std::chrono::steady_clock::now();
  lock.unlock();
  const bool ok = journal_->Mark();
  const int err = errno;
  lock.lock();
  if (!ok) IndexFailed("writing or syncing the cache index's mark", err);
}

void BlockCache::IndexFailed(const char* what, int err) {
  if (index_broken_) return;
  DeviceError(what, err);
  health_ = Health::kOut;
  index_broken_ = true;
  queued_groups_.clear();
  wb_unsynced_ = false;
}

void BlockCache::Barrier(std::unique_lock<std::mutex>& lock) {
  if (!writer_.joinable() || stop_ || writer_.get_id() == std::this_thread::get_id()) {
    Commit(lock);
    return;
  }
  bool done = false;
  std::condition_variable done_cv;
  Job job{};
  job.barrier = [this, &done, &done_cv] {
    std::lock_guard l(mu_);
    done = true;
    done_cv.notify_all();
  };
  jobs_.push_back(std::move(job));
  cv_.notify_all();
  done_cv.wait(lock, [&done] { return done; });
}

void BlockCache::DiscardBrokenIndex(std::unique_lock<std::mutex>& lock) {
  if (!index_broken_ || index_discarded_ || dirty_slots_ != 0) return;
  lock.unlock();
  const bool ok = journal_->Discard();
  const int err = errno;
  lock.lock();
  if (ok) {
    index_discarded_ = true;
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
    v.erase(std::remove_if(v.begin(), v.end(), [this](const OlderFree& o) { return FreeDurable(o); }), v.end());
    it = v.empty() ? older_frees_.erase(it) : std::next(it);
  }
  for (auto it = tombs_.begin(); it != tombs_.end();) {
    const auto& w = it->second.waits;
    if (std::all_of(w.begin(), w.end(), [this](const OlderFree& o) { return FreeDurable(o); })) {
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
    rewrite_cv_.notify_all();
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
  std::lock_guard lock(mu_);
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
  std::unique_lock lock(mu_);
  ForgetFile(State(fh));
}

BlockCache::DropResult BlockCache::DropAsOf(const std::string& fh, uint64_t stamp) {
  std::unique_lock lock(mu_);
  auto it = files_.find(fh);
  if (it == files_.end()) return DropResult::kNothing;
  FileState& f = it->second;
  // A block written since the stamp has a newer write generation (both
  // come from counter_, which only grows): its last writer may not have
  // been asked.
  const auto newer = [this, stamp](uint32_t s) { return slots_[s].dirty_pin && WbOf(s).wgen > stamp; };
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
  std::unique_lock lock(mu_);
  FileState& f = State(fh);
  for (uint32_t s = f.head; s != kNoSlot; s = slots_[s].next) {
    if (AnyBit(DirtyBits(slots_[s]))) return false;  // written since the flush: flush again
  }
  // An old slot of a block moved by copy-on-write still claims older data
  // on disk until the next commit frees it: the truncate waits for that
  // too (its newest copy may have lost its dirty pages to a checksum
  // failure, leaving nothing "cleaning"; found by review).
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
    cv_.notify_all();
    return true;
  }
  if (retired) {
    Commit(lock);  // (frees the old slots, as a barrier would)
  } else if (cleaning) {
    WriteRecords(lock, /*sync=*/true);
  }
  lock.unlock();
  then();
  return true;
}

void BlockCache::TruncateDone(const std::string& fh) {
  std::lock_guard lock(mu_);
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
  std::lock_guard lock(mu_);
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
  std::lock_guard lock(mu_);
  auto it = files_.find(fh);
  if (it == files_.end() || !it->second.have || it->second.writes_inflight != 0) return;
  if (it->second.validated == before) it->second.validated = after;
}

bool BlockCache::Sequential(const std::string& fh, uint64_t off, size_t len) {
  std::lock_guard lock(mu_);
  FileState& f = State(fh);
  // Close to where the run ended counts as continuing it: readahead and
  // write-behind requests of one stream arrive slightly out of order. How
  // close scales with the request, so that small random requests in a small
  // file do not look like a stream.
  // Only new ground lengthens a run: a request behind its end (a rewrite,
  // a random access near it) adds nothing, so random I/O in a file smaller
  // than the slack never becomes a "stream" however long it goes on.
  const uint64_t slack = std::clamp<uint64_t>(4 * uint64_t{len}, 512 << 10, 8 << 20);
  const uint64_t end = off + len;
  const bool near = off + slack >= f.seq_next && off <= f.seq_next + slack;
  if (near && f.seq_run > 0) {
    f.seq_run += end > f.seq_next ? end - f.seq_next : 0;
    f.seq_next = std::max(f.seq_next, end);
  } else {
    f.seq_run = len;
    f.seq_next = end;
  }
  return opts_.seq_cutoff > 0 && f.seq_run > opts_.seq_cutoff;
}

void BlockCache::NoteBypass(bool write) {
  std::lock_guard lock(mu_);
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
  {
    std::lock_guard lock(mu_);
    auto miss = [this]() -> std::optional<std::string> {
      stats_.read_misses++;
      return std::nullopt;
    };
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
      pieces.push_back(Piece{s, b, p0, p1 - p0 + 1, slot.inval,
                             std::vector<uint32_t>(PageCrcs(slot) + p0, PageCrcs(slot) + p1 + 1)});
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
  std::lock_guard lock(mu_);
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
  std::lock_guard lock(mu_);
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
  if (queued) cv_.notify_one();
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
  std::lock_guard lock(mu_);
  FileState& f = State(fh);
  StoreLocked(fh, f, off, data, len,
              [&f, token](uint64_t b) { return f.truncates_inflight == 0 && !Changed(f, b, token); }, false);
}

uint64_t BlockCache::WriteStart(const std::string& fh, uint64_t off, size_t len, bool invalidate) {
  std::lock_guard lock(mu_);
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
  std::lock_guard lock(mu_);
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
  std::unique_lock lock(mu_);
  auto next_probe = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (true) {
    if (!durable_waiters_.empty() ||
        (WbPending() && (stop_ || commit_asked_ || std::chrono::steady_clock::now() >= commit_due_ ||
                         wb_retire_.size() > nslots_ / 8))) {
      // Acknowledged write-back writes become durable: asked for (fsync,
      // Quiesce, unmount), a second after the first of them, or when the
      // old slots of moved blocks waiting for it grow many.
      writing_ = true;
      Commit(lock);
      // Under a steady stream of commits, the mark (below) is also written
      // every 10 s, after the commit answered its waiters: what a load must
      // check stays about what 10 s wrote.
      if (!index_broken_ && journal_->MarkBehind() &&
          std::chrono::steady_clock::now() - last_mark_ >= std::chrono::seconds(10)) {
        WriteMark(lock);
      }
      continue;
    }
    if (jobs_.empty() && WbPending()) {
      // Records wait for the commit too (it writes them all at once).
      writing_ = false;
      idle_cv_.notify_all();
      cv_.wait_until(lock, commit_due_);
      continue;
    }
    if (jobs_.empty() && !queued_groups_.empty()) {
      // Record changes made outside the writer (invalidations, frees,
      // version updates): written now, synced by the next barrier.
      writing_ = true;
      // (Synced if slots are held for it: rule 2a.)
      WriteRecords(lock, /*sync=*/!tombs_.empty());
      continue;
    }
    if (jobs_.empty()) {
      DiscardBrokenIndex(lock);
      if (!jobs_.empty() || !queued_groups_.empty()) continue;
      writing_ = false;
      commit_asked_ = false;  // (nothing pending: a Quiesce() is answered)
      idle_cv_.notify_all();
      if (stop_) return;
      if (health_ != Health::kHealthy) {
        cv_.wait_until(lock, next_probe);
        if (std::chrono::steady_clock::now() >= next_probe) {
          next_probe = std::chrono::steady_clock::now() + std::chrono::seconds(30);
          lock.unlock();
          const bool ok = Probe();
          lock.lock();
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
          cv_.wait_until(lock, due);
          continue;
        }
        writing_ = true;
        WriteMark(lock);
      } else {
        cv_.wait(lock);
      }
      continue;
    }
    writing_ = true;
    if (jobs_.front().barrier) {
      // Everything queued before it is durable before it runs.
      Job job = std::move(jobs_.front());
      jobs_.pop_front();
      Commit(lock);
      lock.unlock();
      job.barrier();
      lock.lock();
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
      WriterWb(batch, lock);
      continue;
    }
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    WriteFill(job, lock);
  }
}

void BlockCache::WriteFill(Job& job, std::unique_lock<std::mutex>& lock) {
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
  lock.unlock();
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
  lock.lock();
  if (!wrote) return DeviceError("writing the cache", err);
  if (!current()) return;  // given to another block, or invalidated meanwhile
  uint32_t filled = 0;
  for (uint32_t k = 0; k < np; ++k) {
    const uint32_t p = job.first_page + k;
    if (!TestBit(fresh, p) || TestBit(Valid(slot), p)) continue;
    used_pages_++;
    SetBit(Valid(slot), p);
    PageCrcs(slot)[p] = crcs[k];
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

// ---------------------------------------------------------------- write-back

void BlockCache::WriteBack(WbWrite w, std::function<void(WbOutcome)> done) {
  {
    std::lock_guard lock(mu_);
    if (opts_.mode == CacheMode::kWriteBack && health_ == Health::kHealthy && w.len > 0 && !stop_ &&
        !wb_stopped_) {
      Job job{};
      job.wb = std::make_shared<WbWrite>(std::move(w));
      job.done = std::move(done);
      jobs_.push_back(std::move(job));
      cv_.notify_one();
      return;
    }
    stats_.wb_arounds++;
  }
  done(WbOutcome{WbOutcome::kUnavailable, {}});
}

bool BlockCache::PrepareWb(const WbWrite& w, std::vector<WbPart>& parts, WbOutcome& out,
                           const std::unordered_map<uint32_t, uint32_t>& batch_pins,
                           std::unique_lock<std::mutex>& lock) {
  const uint64_t block = opts_.block;
  const uint64_t end = w.off + w.len;
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
  lock.unlock();
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
  lock.lock();
  for (auto [i, p] : damaged) {
    // A damaged page is dropped (a partial one is completed from the
    // server's copy: kNeedPages); an unflushed write it held is lost, and
    // reported to fsync as Read() does. (Found by review.)
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
        rewrite_cv_.notify_all();
      }
    }
    if (part.pinned_from) policy_->Unpin(part.from);
  }
  parts.clear();
}

void BlockCache::WriterWb(std::vector<Job>& batch, std::unique_lock<std::mutex>& lock) {
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
    if (!PrepareWb(w, it.parts, it.out, batch_pins, lock)) continue;
    for (const auto& part : it.parts) {
      if (part.pinned_from) batch_pins[part.from]++;
      if (part.allocated) batch_pins[part.to]++;
    }
    // Step 2b (unlocked): write the new pages to their slots.
    lock.unlock();
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
    lock.lock();
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
        // a coherence drop, a checksum failure) stays invalid. (Found by
        // review; older than copies to partners.)
        if (!touched && from && !TestBit(Valid(*from), p)) continue;
        if (!TestBit(Valid(to), p)) used_pages_++;
        SetBit(Valid(to), p);
        // (`from` is pinned and only this thread writes pages: a reused
        // page's CRC is the one it had when the write was planned.)
        PageCrcs(to)[p] = reused ? PageCrcs(*from)[p] : part.crc[p - part.img0];
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
      // file must not extend it after a crash (found by the crash explorer).
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
        rewrite_cv_.notify_all();
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
  lock.unlock();
  for (size_t i = 0; i < batch.size(); ++i) batch[i].done(std::move(items[i].out));
  batch.clear();
  lock.lock();
}

bool BlockCache::Commit(std::unique_lock<std::mutex>& lock) {
  // Old slots whose block's newest copy is gone already (a truncate or a
  // drop freed it) are freed in this commit's records, not after them: a
  // crash must not keep the old claim alone once the commit has answered
  // (rule 2a).
  std::erase_if(wb_retire_, [this](const Retire& r) {
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
  bool ok = WriteRecords(lock, /*sync=*/true);
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
  if (newest_gone) ok = WriteRecords(lock, /*sync=*/true) && ok;
  commit_asked_ = false;
  commits_++;
  auto waiters = std::move(durable_waiters_);
  durable_waiters_.clear();
  idle_cv_.notify_all();
  if (!waiters.empty()) {
    lock.unlock();
    for (auto& w : waiters) w(ok);
    lock.lock();
  }
  return ok;
}

bool BlockCache::TakeLost(const std::string& fh) {
  std::lock_guard lock(mu_);
  auto it = files_.find(fh);
  if (it == files_.end()) return false;
  FileState& f = it->second;
  bool lost = std::exchange(f.lost, false);
  for (uint32_t s = f.head; s != kNoSlot && !lost; s = slots_[s].next) lost = Dirtyish(slots_[s]);
  return lost;
}

void BlockCache::Durable(const std::string& fh, std::function<void(bool)> done) {
  std::unique_lock lock(mu_);
  if (index_broken_ || !journal_) {
    lock.unlock();
    return done(false);
  }
  // (Exactly: commits_ counts commits ended, their records synced, and a
  // commit in progress covers every write applied when it began.)
  auto it = files_.find(fh);
  if (it != files_.end() && it->second.lost) {
    // Some of the file's writes were lost by the cache disk: the caller
    // flushes to the server and reports them (TakeLost).
    lock.unlock();
    return done(false);
  }
  if (it == files_.end() || it->second.wb_commit <= commits_) {
    lock.unlock();
    return done(true);
  }
  // (A write found lost during the commit fails it too.)
  done = [this, fh, done = std::move(done)](bool ok) {
    bool lost = false;
    {
      std::lock_guard l(mu_);
      auto f = files_.find(fh);
      lost = f != files_.end() && f->second.lost;
    }
    done(ok && !lost);
  };
  if (!writer_.joinable() || stop_) {
    const bool ok = Commit(lock);
    lock.unlock();
    return done(ok);
  }
  durable_waiters_.push_back(std::move(done));
  cv_.notify_all();
}

bool BlockCache::HasDirty(const std::string& fh, uint64_t off, size_t len) {
  std::lock_guard lock(mu_);
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
  std::lock_guard lock(mu_);
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
  std::lock_guard lock(mu_);
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
    std::lock_guard lock(mu_);
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
          pieces.push_back(OverlayPlan::Piece{s, slot->gen, b, p, PageCrcs(*slot)[p]});
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
  for (const Piece& pc : pieces) {
    if (!data_->ReadAt(page.data(), kPage, uint64_t{pc.slot} * block + uint64_t{pc.page} * kPage)) {
      err = errno;
      res.kind = OverlayResult::kError;
      break;
    }
    if (Crc(page.data(), kPage) != pc.crc) {
      bad = pc;
      res.kind = OverlayResult::kRetry;
      break;
    }
    const uint64_t ps = pc.block * block + uint64_t{pc.page} * kPage;
    const uint64_t from = std::max(off, ps), to = std::min<uint64_t>(off + len, ps + kPage);
    std::memcpy(out->data() + (from - off), page.data() + (from - ps), to - from);
  }
  std::lock_guard lock(mu_);
  for (const auto& pc : pieces) policy_->Unpin(pc.slot);
  if (res.kind == OverlayResult::kError) DeviceError("reading the cache", err);
  if (bad) {
    Slot& slot = slots_[bad->slot];
    if (slot.gen == bad->gen && TestBit(Valid(slot), bad->page) && PageCrcs(slot)[bad->page] == bad->crc) {
      // Damaged on disk, not a race.
      if (DropDamagedPage(bad->slot, bad->page)) res.kind = OverlayResult::kError;
    }
  }
  return res;
}

BlockCache::DirtyLevel BlockCache::Dirty() const {
  std::lock_guard lock(mu_);
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
                                               const std::set<std::string>* skip) {
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
    std::unique_lock lock(mu_);
    std::vector<uint32_t> cand;
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
        cand.push_back(s);
      }
      // File order: by handle, then offset (the server sees ascending writes).
      std::sort(cand.begin(), cand.end(), [this](uint32_t a, uint32_t b) {
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
      if (busy) rewrite_cv_.wait(lock);
    }
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
    for (uint32_t p = 0; p < pages() && !io_error;) {
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
        io_error = true;
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
  std::lock_guard lock(mu_);
  for (const Pick& pk : picks) policy_->Unpin(pk.slot);
  if (io_error) DeviceError("reading dirty data from the cache", err);
  for (const auto& [s, p] : bad) {
    Slot& slot = slots_[s];
    auto pk = std::find_if(picks.begin(), picks.end(), [s = s](const Pick& x) { return x.slot == s; });
    if (slot.gen != pk->gen || PageCrcs(slot)[p] != pk->crc[p] || !TestBit(DirtyBits(slot), p)) continue;
    DropDamagedPage(s, p);
  }
  return runs;
}

void BlockCache::Flushed(const std::vector<DirtyRun>& runs) {
  std::unique_lock lock(mu_);
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
    flush_window_.Add(NowSec(), run.data.size());
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
  Barrier(lock);
  auto clear = [this](uint32_t s, const PageBits& pages) {
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
  DiscardBrokenIndex(lock);
}

void BlockCache::StopWriteBack() {
  std::lock_guard lock(mu_);
  wb_stopped_ = true;
}

void BlockCache::ResumeWriteBack() {
  std::lock_guard lock(mu_);
  wb_stopped_ = false;
}

void BlockCache::NoteFlushError() {
  std::lock_guard lock(mu_);
  stats_.flush_errors++;
}

void BlockCache::Quiesce(bool commit) {
  std::unique_lock lock(mu_);
  if (!writer_.joinable() || stop_) return;
  auto done = [this, commit] {
    return jobs_.empty() && !writing_ && (!commit || (queued_groups_.empty() && !WbPending()));
  };
  if (commit && !done()) {
    // (Also for writes still queued: they are pending once applied. Not
    // when nothing is: the request would outlive this call and commit the
    // next write at once.)
    commit_asked_ = true;
    cv_.notify_all();
  }
  idle_cv_.wait(lock, done);
}

CacheStats BlockCache::Stats() const {
  std::lock_guard lock(mu_);
  CacheStats s = stats_;
  s.state = health_ == Health::kHealthy ? "healthy" : health_ == Health::kDegraded ? "degraded" : "out";
  s.capacity_bytes = capacity_bytes();
  s.slots = nslots_;
  s.slots_used = policy_->in_use();
  s.used_bytes = used_pages_ * kPage;
  s.files_cached = file_ids_.size() - free_file_ids_.size();
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
  s.flush_rate_bps = flush_window_.PerSecond(NowSec());
  return s;
}


}  // namespace mpnfs::cache
