// BlockCache, opening and closing: the cache directory's checks, the data
// file's geometry, loading the index (the records, their checks against the
// pages' CRCs, the slots' state), and at close the last versions and the
// index's mark. The contract is in block_cache.h.
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

constexpr uint32_t kMinSlots = 16;

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
  const uint64_t have = disk_.Allocated(data_path) + disk_.Allocated(index_path) +
                        disk_.Allocated(dir + "/" + CrcStore::kName);
  const uint64_t total = uint64_t{vfs.f_blocks} * vfs.f_frsize;
  const uint64_t avail = uint64_t{vfs.f_bavail} * vfs.f_frsize + have;
  const uint64_t margin = total / 20;
  // (With its page checksums, should they not fit in RAM: crc_store.h.)
  const uint64_t per_slot = opts_.block + Index::RegionBytes(Geometry{opts_.block, 4096}) / 4096 + 1 +
                            CrcStore::TableBytes(1, opts_.block / kPage);
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
  // Nothing else runs yet (the writer and reader start at the end); the
  // lock is held for the analysis, and for the checksum store's protocol.
  MutexLock state_lock(mu_);
  group_batch_.assign((nslots_ + journal_->per_page() - 1) / journal_->per_page(), 0);
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
  {
    CrcStore::Options co;
    co.slots = nslots_;
    co.pages = pages();
    co.ram = opts_.crc_ram;
    co.frame = opts_.crc_frame;
    auto crcs = CrcStore::Open(disk_, dir, co);
    if (!crcs) return Error::Errno(crcs.error().err, "cache_dir " + dir + ": " + crcs.error().what);
    crcs_ = std::move(*crcs);
  }
  block_table_.assign(size_t{nslots_} + nslots_ / 2 + 16, kNoSlot);  // load at most 2/3
  // The policy asks for the key of a slot it evicts (under mu_, while the
  // slot still holds its block) rather than keeping one per slot.
  policy_ = std::make_unique<TwoQueue>(nslots_, opts_.admit_second,
                                       [this](uint32_t s) REQUIRES(mu_) {
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
    if (!WriteRecords(/*sync=*/true)) return Sys("writing the cache index in " + dir);
    // Then the empty claims that won (rule 2a: had they been freed with
    // the claims they superseded, a crash could keep those alone).
    if (!load_empties_.empty()) {
      for (uint32_t e : load_empties_) {
        // (SettleTombs released it after the first sync: it waits for nothing.)
        if (tombs_.erase(e)) policy_->Unpin(e);
        Persist(e);
      }
      load_empties_.clear();
      if (!WriteRecords(/*sync=*/true)) return Sys("writing the cache index in " + dir);
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
  // (Read before the writer starts, which may change them.)
  const std::string mode = stats_.mode;
  const uint64_t kept = policy_->in_use(), dirty = dirty_slots_;
  state_lock.Unlock();
  writer_ = std::thread([this] { WriterMain(); });
  reader_thread_ = std::thread([reader = reader_] { reader->Main(); });
  Log("cache")->info("cache {} in {}: {} MiB in {} KiB blocks, {} blocks kept from before ({} dirty)",
                     mode, dir, capacity_bytes() >> 20, opts_.block >> 10, kept, dirty);
  return true;
}

Status BlockCache::LoadIndex() {  // before the writer starts
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
  int crc_err = 0;  // writing the checksums of a paged table failed (crc_store.h)
  auto st = journal_->Load([&](uint32_t s, Record&& r) REQUIRES(mu_) {
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
    {
      // (Nothing else runs yet: the lock, held by Init(), is only the
      // checksum store's protocol.)
      CrcStore::Holds holds(*crcs_);
      if (HoldCrcs({s}, holds) == CrcStore::Got::kFailed) {
        crc_err = crc_err != 0 ? crc_err : (errno != 0 ? errno : EIO);
      } else {
        std::copy_n(r.crc.begin(), std::min<size_t>(r.crc.size(), ppb), MutCrcs(slot));
      }
    }
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
  if (crc_err != 0) {
    return Error::Errno(crc_err, std::string("reading or writing the page checksum file: ") + std::strerror(crc_err));
  }
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
  // another record's change.
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
      MutexLock lock(mu_);
      stop_ = true;
    }
    cv_.SignalAll();
    writer_.join();
  }
  if (journal_) {
    MutexLock lock(mu_);
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
    Commit();
    if (!index_broken_ && !journal_->Mark()) IndexFailed("writing or syncing the cache index's mark", errno);
    DiscardBrokenIndex();  // again: the disk may take it now
  }
  if (lock_fd_ >= 0) close(lock_fd_);  // releases the flock
}

}  // namespace mpnfs::cache
