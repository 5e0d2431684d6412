#include "cache/block_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "cache/cache_dir.h"
#include "common/log.h"

namespace mpnfs::cache {
namespace {

constexpr uint32_t kMinSlots = 16;
constexpr int kOutAfterErrors = 8;

Error Sys(const std::string& what) {
  return Error::Errno(errno, what + ": " + std::strerror(errno));
}

bool PwriteAll(int fd, const char* p, size_t n, off_t off) {
  while (n > 0) {
    ssize_t w = pwrite(fd, p, n, off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
    off += w;
  }
  return true;
}

bool PreadAll(int fd, char* p, size_t n, off_t off) {
  while (n > 0) {
    ssize_t r = pread(fd, p, n, off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      if (r == 0) errno = EIO;  // short: the file is smaller than the index says
      return false;
    }
    p += r;
    n -= static_cast<size_t>(r);
    off += r;
  }
  return true;
}

// The newer sound copy of a slot's two record copies (`two` holds both).
std::optional<Record> BestRecord(std::string_view two, uint32_t pages) {
  const size_t rec = two.size() / 2;
  std::optional<Record> best;
  for (int copy = 0; copy < 2; ++copy) {
    auto r = DecodeRecord(two.substr(copy * rec, rec), pages);
    if (r && (!best || r->seq > best->seq)) best = std::move(r);
  }
  return best;
}

const char* ModeName(CacheMode m) {
  switch (m) {
    case CacheMode::kReadOnly: return "readonly";
    case CacheMode::kWriteThrough: return "writethrough";
    case CacheMode::kWriteBack: return "writeback";
    default: return "off";
  }
}

}  // namespace

BlockCache::BlockCache(CacheOptions opts) : opts_(std::move(opts)) {}

std::string BlockCache::Key(const std::string& fh, uint64_t block) {
  std::string k = fh;
  k.append(reinterpret_cast<const char*>(&block), sizeof(block));
  return k;
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
  const std::string& dir = opts_.dir;
  if (auto trusted = CheckCacheDir(dir); !trusted) return trusted.error();
  if (access(dir.c_str(), W_OK | X_OK) != 0) {
    return Error::Errno(EACCES, "cache_dir " + dir + ": not writable");
  }
  auto lock = LockCacheDir(dir, opts_.lock_wait);
  if (!lock) return lock.error();
  lock_fd_ = *lock;

  const std::string data_path = dir + "/data", index_path = dir + "/index";
  std::string old_meta;
  {
    std::ifstream in(dir + "/meta");
    std::getline(in, old_meta);
    old_meta += "\n";
  }
  // Size: cache_size, but never more than the filesystem can hold while
  // keeping 5% of it free (the data file is preallocated below).
  const uint32_t ppb = pages();
  record_bytes_ = RecordBytes(ppb);
  struct statvfs vfs{};
  if (statvfs(dir.c_str(), &vfs) != 0) return Sys("statvfs " + dir);
  uint64_t have = 0;
  for (const auto& p : {data_path, index_path}) {
    struct stat fst{};
    if (stat(p.c_str(), &fst) == 0) have += static_cast<uint64_t>(fst.st_blocks) * 512;
  }
  const uint64_t total = uint64_t{vfs.f_blocks} * vfs.f_frsize;
  const uint64_t avail = uint64_t{vfs.f_bavail} * vfs.f_frsize + have;
  const uint64_t margin = total / 20;
  const uint64_t per_slot = opts_.block + 2ull * record_bytes_;
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
  nslots_ = static_cast<uint32_t>(std::min<uint64_t>(want, UINT32_MAX - 1));

  // Reuse what a previous mount left if it has the same geometry.
  auto meta_line = [this] {
    return fmt::format("mpnfs-cache {} {} {} {}\n", kFormatVersion, opts_.block, nslots_, record_bytes_);
  };
  if (old_meta != meta_line()) {
    // Write-back data not yet on the server is never thrown away for a
    // change of geometry: the cache keeps its old one until it is flushed
    // (its files exist at that size already).
    std::istringstream in(old_meta);
    std::string magic;
    uint32_t ver = 0, block = 0, slots = 0, rec = 0;
    if (in >> magic >> ver >> block >> slots >> rec && magic == "mpnfs-cache" && ver == kFormatVersion &&
        block >= 64 * 1024 && block <= kMaxPages * kPage && (block & (block - 1)) == 0 &&
        slots >= kMinSlots && rec == RecordBytes(block / kPage) &&
        IndexHasDirty(index_path, block / kPage, slots, rec)) {
      Log("cache")->warn("cache_dir {} holds write-back data not yet on the server: keeping its "
                         "geometry ({} MiB in {} KiB blocks) for this mount",
                         dir, (uint64_t{slots} * block) >> 20, block >> 10);
      opts_.block = block;
      opts_.size = uint64_t{slots} * block;
      nslots_ = slots;
      record_bytes_ = rec;
    }
  }
  const bool reuse = old_meta == meta_line();
  if (!reuse) {
    if (old_meta.size() > 1) {
      Log("cache")->warn("cache_dir {}: geometry or format changed; starting empty", dir);
    }
    unlink(index_path.c_str());
  }
  // cache_direct: cached data lives on the cache disk only, not a second
  // time in the page cache. Filesystems without O_DIRECT get buffered I/O.
  data_fd_ = open(data_path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC | (opts_.direct ? O_DIRECT : 0), 0600);
  if (data_fd_ < 0 && opts_.direct && errno == EINVAL) {
    data_fd_ = open(data_path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (data_fd_ >= 0) Log("cache")->info("cache_dir {}: no O_DIRECT there; cached data goes through the page cache", dir);
  }
  if (data_fd_ < 0) return Sys("cache data file " + data_path);
  index_fd_ = open(index_path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (index_fd_ < 0) return Sys("cache index file " + index_path);
  const off_t data_size = static_cast<off_t>(uint64_t{nslots_} * opts_.block);
  const off_t index_size = static_cast<off_t>(uint64_t{nslots_} * 2 * record_bytes_);
  if (ftruncate(data_fd_, data_size) != 0 || ftruncate(index_fd_, index_size) != 0) {
    return Sys("sizing the cache files in " + dir);
  }
  int rc = posix_fallocate(data_fd_, 0, data_size);
  if (rc == 0) rc = posix_fallocate(index_fd_, 0, index_size);
  if (rc != 0 && rc != EOPNOTSUPP && rc != EINVAL) {
    errno = rc;
    return Sys("preallocating the cache files in " + dir);
  }
  {
    std::ofstream out(dir + "/meta", std::ios::trunc);
    out << meta_line();
    if (!out.flush()) return Error::Errno(EIO, "cannot write " + dir + "/meta");
  }
  {
    std::ifstream in(dir + "/id");
    std::getline(in, id_);
  }
  if (id_.size() != 32) {
    std::random_device rd;
    id_ = fmt::format("{:08x}{:08x}{:08x}{:08x}", rd(), rd(), rd(), rd());
    std::ofstream out(dir + "/id", std::ios::trunc);
    out << id_ << "\n";
    if (!out.flush()) return Error::Errno(EIO, "cannot write " + dir + "/id");
  }

  slots_.resize(nslots_);
  policy_ = std::make_unique<TwoQueue>(nslots_, opts_.admit_second);
  stats_.mode = ModeName(opts_.mode);
  if (reuse) LoadIndex();
  if (dirty_slots_ > 0 && opts_.mode != CacheMode::kWriteBack) {
    uint64_t pages_dirty = 0;
    for (uint32_t s : dirty_set_) {
      for (auto w : slots_[s].dirty) pages_dirty += static_cast<uint64_t>(__builtin_popcountll(w));
    }
    return Error::Errno(EBUSY, fmt::format("cache_dir {} holds {} KiB of write-back data not yet on "
                                           "the server; mount it with cache_mode=writeback to flush it",
                                           dir, pages_dirty * (kPage / 1024)));
  }
  writer_ = std::thread([this] { WriterMain(); });
  Log("cache")->info("cache {} in {}: {} MiB in {} KiB blocks, {} blocks kept from before ({} dirty)",
                     stats_.mode, dir, capacity_bytes() >> 20, opts_.block >> 10, policy_->in_use(),
                     dirty_slots_);
  return true;
}

bool BlockCache::IndexHasDirty(const std::string& path, uint32_t pages, uint32_t slots, uint32_t rec) {
  int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return false;
  bool dirty = false;
  std::string buf;
  const uint32_t chunk = 1024;
  for (uint32_t first = 0; first < slots && !dirty; first += chunk) {
    const uint32_t n = std::min(chunk, slots - first);
    buf.resize(size_t{n} * 2 * rec);
    if (!PreadAll(fd, buf.data(), buf.size(), off_t{first} * 2 * rec)) break;
    for (uint32_t i = 0; i < n && !dirty; ++i) {
      auto best = BestRecord(std::string_view(buf).substr(size_t{i} * 2 * rec, 2 * size_t{rec}), pages);
      dirty = best && !best->fh.empty() && AnyBit(best->dirty);
    }
  }
  close(fd);
  return dirty;
}

void BlockCache::LoadIndex() NO_THREAD_SAFETY_ANALYSIS {  // before the writer starts
  const uint32_t ppb = pages();
  const size_t chunk_slots = 1024;
  std::unordered_map<uint32_t, uint64_t> loaded_seq;
  std::vector<uint32_t> superseded;
  std::string buf;
  for (uint32_t first = 0; first < nslots_; first += chunk_slots) {
    const uint32_t n = std::min<uint32_t>(chunk_slots, nslots_ - first);
    buf.resize(size_t{n} * 2 * record_bytes_);
    if (!PreadAll(index_fd_, buf.data(), buf.size(), off_t{first} * 2 * record_bytes_)) return;
    for (uint32_t i = 0; i < n; ++i) {
      auto best = BestRecord(
          std::string_view(buf).substr(size_t{i} * 2 * record_bytes_, 2 * size_t{record_bytes_}), ppb);
      if (!best) continue;
      seq_ = std::max(seq_, best->seq + 1);
      if (best->fh.empty() || !AnyBit(best->valid)) continue;
      const uint32_t s = first + i;
      const std::string key = Key(best->fh, best->block);
      if (auto it = index_.find(key); it != index_.end()) {
        // The same block twice (a crash between storing it anew and freeing
        // the old slot): keep the newer.
        const uint32_t other = it->second;
        if (loaded_seq[other] > best->seq) {
          superseded.push_back(first + i);
          continue;
        }
        FreeSlot(other, false);
        policy_->Release(other);
        superseded.push_back(other);
      }
      loaded_seq[s] = best->seq;
      Slot& slot = slots_[s];
      slot.fh = best->fh;
      slot.block = best->block;
      slot.valid = best->valid;
      slot.dirty = best->dirty;
      slot.fsize = best->fsize;
      slot.uid = best->uid;
      slot.groups = best->groups;
      slot.gid = best->gid;
      slot.crc = std::move(best->crc);
      slot.version = best->version;
      slot.dirty_since = std::chrono::steady_clock::now();
      index_[key] = s;
      FileState& f = files_[slot.fh];
      f.slots.insert(s);
      policy_->Adopt(s, key, /*hot=*/false);
      if (AnyBit(slot.dirty)) f.wb_size = std::max(f.wb_size, slot.fsize);
      SetDirtyPin(s);
      for (uint32_t p = 0; p < ppb; ++p) used_pages_ += TestBit(slot.valid, p) ? 1 : 0;
    }
  }
  // The older copy of a block stored twice must not come back once the
  // newer one is gone: free it on disk too.
  for (uint32_t s : superseded) {
    if (slots_[s].fh.empty()) Persist(s);
  }
}

BlockCache::~BlockCache() {
  if (writer_.joinable()) {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    writer_.join();
  }
  {
    std::lock_guard lock(mu_);
    // Blocks of files whose version moved by our own writes are still
    // right: record the new version so that the next mount keeps them.
    for (uint32_t s = 0; s < slots_.size(); ++s) {
      Slot& slot = slots_[s];
      if (slot.fh.empty()) continue;
      auto it = files_.find(slot.fh);
      if (it == files_.end() || !it->second.have || it->second.writes_inflight != 0) continue;
      if (slot.version != it->second.validated) {
        slot.version = it->second.validated;
        Persist(s);
      }
    }
    DiscardBrokenIndex();  // again: the disk may take it now
  }
  if (data_fd_ >= 0) {
    fdatasync(data_fd_);
    close(data_fd_);
  }
  if (index_fd_ >= 0) {
    fdatasync(index_fd_);
    close(index_fd_);
  }
  if (lock_fd_ >= 0) close(lock_fd_);  // releases the flock
}

BlockCache::FileState& BlockCache::State(const std::string& fh) {
  if (files_.size() > 65536 && files_.find(fh) == files_.end()) {
    // Forget files with nothing cached and nothing in flight.
    for (auto it = files_.begin(); it != files_.end();) {
      if (it->second.slots.empty() && it->second.writes_inflight == 0) {
        it = files_.erase(it);
      } else {
        ++it;
      }
    }
  }
  return files_[fh];
}

bool BlockCache::Persist(uint32_t s) {
  if (index_broken_) return false;
  const Slot& slot = slots_[s];
  Record r;
  r.seq = seq_++;
  r.fh = slot.fh;
  r.block = slot.block;
  r.valid = slot.valid;
  r.dirty = slot.dirty;
  r.version = slot.version;
  r.fsize = slot.fsize;
  r.uid = slot.uid;
  r.groups = slot.groups;
  r.gid = slot.gid;
  r.crc = slot.crc;
  const std::string bytes = EncodeRecord(r, pages());
  const off_t at = (off_t{s} * 2 + static_cast<off_t>(r.seq % 2)) * record_bytes_;
  if (PwriteAll(index_fd_, bytes.data(), bytes.size(), at)) return true;
  // The index may now claim pages that are gone (or miss newer ones): the
  // next mount must not trust it. It is emptied at once, unless it records
  // unflushed writes: then once they are on the server (the flusher drains
  // a cache that is out of service).
  DeviceError("writing the cache index", errno);
  health_ = Health::kOut;
  index_broken_ = true;
  DiscardBrokenIndex();
  return false;
}

void BlockCache::DiscardBrokenIndex() {
  if (!index_broken_ || dirty_slots_ != 0) return;
  if (ftruncate(index_fd_, 0) != 0) unlink((opts_.dir + "/index").c_str());
}

void BlockCache::SetDirtyPin(uint32_t s) {
  Slot& slot = slots_[s];
  const bool dirty = AnyBit(slot.dirty);
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

void BlockCache::FreeSlot(uint32_t s, bool persist) {
  Slot& slot = slots_[s];
  if (slot.fh.empty()) return;
  if (auto it = index_.find(Key(slot.fh, slot.block)); it != index_.end() && it->second == s) {
    index_.erase(it);
  }
  if (auto it = files_.find(slot.fh); it != files_.end()) it->second.slots.erase(s);
  for (uint32_t p = 0; p < pages(); ++p) used_pages_ -= TestBit(slot.valid, p) ? 1 : 0;
  slot.fh.clear();
  slot.valid = {};
  slot.dirty = {};
  slot.fsize = 0;
  SetDirtyPin(s);
  slot.filling = {};
  slot.crc.assign(pages(), 0);
  slot.gen++;
  slot.inval++;
  if (persist) Persist(s);
}

void BlockCache::DropLocked(FileState& f) {
  std::vector<uint32_t> held(f.slots.begin(), f.slots.end());
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
    if (TestBit(slot.valid, p) && !TestBit(slot.dirty, p)) {
      ClearBit(slot.valid, p);
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
    for (uint32_t s : f.slots) {
      if (slots_[s].version != f.validated) stale.push_back(s);
    }
    for (uint32_t s : stale) {
      if (KeepDirtyOnly(s)) continue;
      FreeSlot(s, true);
      policy_->Release(s);
    }
  }
}

void BlockCache::Drop(const std::string& fh) {
  std::lock_guard lock(mu_);
  FileState& f = State(fh);
  // A truncate: the caller flushed the file first; what is dirty now is
  // cut off by it.
  std::vector<uint32_t> held(f.slots.begin(), f.slots.end());
  for (uint32_t s : held) {
    FreeSlot(s, /*persist=*/true);
    policy_->Release(s);
  }
  if (!held.empty()) stats_.files_dropped++;
  f.have = false;  // the next Observe sets the version
  f.wb_size = 0;
  f.pruned_upto = ++f.write_counter;
  f.writes.clear();
}

uint64_t BlockCache::DropAll() {
  std::lock_guard lock(mu_);
  uint64_t n = 0;
  for (uint32_t s = 0; s < slots_.size(); ++s) {
    if (slots_[s].fh.empty()) continue;
    if (KeepDirtyOnly(s)) continue;
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
  const uint64_t slack = std::clamp<uint64_t>(4 * uint64_t{len}, 512 << 10, 8 << 20);
  const bool near = off + slack >= f.seq_next && off <= f.seq_next + slack;
  f.seq_run = near && f.seq_run > 0 ? f.seq_run + len : len;
  f.seq_next = near ? std::max(f.seq_next, off + len) : off + len;
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
    std::vector<uint32_t> crc;
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
      auto it = index_.find(Key(fh, b));
      if (it == index_.end()) return miss();
      const Slot& slot = slots_[it->second];
      const uint64_t lo = std::max(off, b * block) - b * block;
      const uint64_t hi = std::min(off + len, (b + 1) * block) - b * block;
      const uint32_t p0 = static_cast<uint32_t>(lo / kPage), p1 = static_cast<uint32_t>((hi - 1) / kPage);
      for (uint32_t p = p0; p <= p1; ++p) {
        if (!TestBit(slot.valid, p)) return miss();
      }
      pieces.push_back(Piece{it->second, b, p0, p1 - p0 + 1, slot.inval,
                             std::vector<uint32_t>(slot.crc.begin() + p0, slot.crc.begin() + p1 + 1)});
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
    if (!PreadAll(data_fd_, buf.data(), buf.size(), static_cast<off_t>(slot_off + uint64_t{p.first_page} * kPage))) {
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
    if (slot.inval == p.inval && TestBit(slot.valid, bad_page)) {
      // Not a race with an invalidation: the page on disk is damaged.
      stats_.checksum_failures++;
      Log("cache")->warn("cache page failed its checksum (slot {}, page {}); dropped, read from the server",
                         p.slot, bad_page);
      ClearBit(slot.valid, bad_page);
      used_pages_--;
      slot.inval++;
      Persist(p.slot);
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
    const std::string key = Key(fh, b);
    uint32_t s;
    if (auto it = index_.find(key); it != index_.end()) {
      s = it->second;
      if (count_write_hits) stats_.write_hits++;
    } else {
      if (!policy_->Admit(key)) continue;
      bool evicted = false;
      auto got = policy_->Allocate(key, &evicted);
      if (!got) continue;
      s = *got;
      if (evicted) {
        stats_.evictions++;
        FreeSlot(s, /*persist=*/false);  // the new record overwrites the old
      }
      Slot& slot = slots_[s];
      slot.fh = fh;
      slot.block = b;
      slot.valid = {};
      slot.filling = {};
      slot.crc.assign(pages(), 0);
      slot.version = f.validated;
      slot.gen++;
      index_[key] = s;
      f.slots.insert(s);
    }
    Slot& slot = slots_[s];
    const uint32_t p0 = static_cast<uint32_t>((lo - b * block) / kPage);
    const uint32_t np = static_cast<uint32_t>((hi - lo) / kPage);
    for (uint32_t p = p0; p < p0 + np; ++p) SetBit(slot.filling, p);
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
  w.last_begin = ++f.write_counter;
  for (uint32_t p = p0; p < p0 + np; ++p) SetBit(w.pages, p);
}

void BlockCache::Fill(const std::string& fh, uint64_t token, uint64_t off, const char* data, size_t len) {
  std::lock_guard lock(mu_);
  FileState& f = State(fh);
  StoreLocked(fh, f, off, data, len, [&f, token](uint64_t b) { return !Changed(f, b, token); },
              false);
}

uint64_t BlockCache::WriteStart(const std::string& fh, uint64_t off, size_t len, bool invalidate) {
  std::lock_guard lock(mu_);
  FileState& f = State(fh);
  if (invalidate) stats_.writes++;  // (not the flusher's)
  f.writes_inflight++;
  f.burst_concurrency = std::max(f.burst_concurrency, f.writes_inflight);
  const uint64_t token = ++f.write_counter;
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
    auto it = index_.find(Key(fh, b));
    if (it == index_.end() || !invalidate) continue;
    Slot& slot = slots_[it->second];
    bool changed = false;
    for (uint32_t p = static_cast<uint32_t>(lo / kPage); p <= (hi - 1) / kPage; ++p) {
      if (TestBit(slot.dirty, p)) continue;  // unflushed: newer than any write sent around it
      if (TestBit(slot.valid, p)) {
        ClearBit(slot.valid, p);
        used_pages_--;
        changed = true;
      }
      ClearBit(slot.filling, p);
    }
    slot.inval++;
    if (changed) {
      stats_.invalidations++;
      Persist(it->second);  // before the write leaves: a crash must not resurrect old data
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
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  std::string page(kPage, 'p'), back(kPage, '\0');
  bool ok = PwriteAll(fd, page.data(), page.size(), 0) && fdatasync(fd) == 0 &&
            PreadAll(fd, back.data(), back.size(), 0) && back == page;
  close(fd);
  unlink(path.c_str());
  return ok;
}

void BlockCache::WriterMain() {
  std::unique_lock lock(mu_);
  auto next_probe = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (true) {
    if (jobs_.empty()) {
      writing_ = false;
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
            // A failed record write truncated the index: stay out then.
            struct stat st{};
            if (!index_broken_ && fstat(index_fd_, &st) == 0 && st.st_size > 0) {
              health_ = Health::kHealthy;
              stats_.device_errors = 0;
              Log("cache")->warn("cache disk answers again; cache healthy");
            }
          }
        }
      } else {
        cv_.wait(lock);
      }
      continue;
    }
    writing_ = true;
    if (jobs_.front().wb) {
      // Write-back writes are committed in batches: one sync of the data
      // file and one of the index for all of them.
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
  auto clear_filling = [&] {
    for (uint32_t k = 0; k < np && slot.gen == job.gen; ++k) ClearBit(slot.filling, job.first_page + k);
  };
  // Checked before writing too: the slot may hold another block by now,
  // and pages valid already are as new as this data or newer (dirty ones
  // certainly), so only invalid pages are written.
  if (!current()) return clear_filling();
  PageBits fresh{};  // pages not valid yet
  for (uint32_t k = 0; k < np; ++k) {
    if (!TestBit(slot.valid, job.first_page + k)) SetBit(fresh, job.first_page + k);
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
    const off_t at = static_cast<off_t>(uint64_t{job.slot} * opts_.block +
                                        uint64_t{job.first_page + k} * kPage);
    wrote = PwriteAll(data_fd_, job.data.data() + size_t{k} * kPage, size_t{e - k} * kPage, at);
    err = errno;
    k = e;
  }
  lock.lock();
  clear_filling();
  if (!wrote) return DeviceError("writing the cache", err);
  if (!current()) return;  // given to another block, or invalidated meanwhile
  uint32_t filled = 0;
  for (uint32_t k = 0; k < np; ++k) {
    const uint32_t p = job.first_page + k;
    if (!TestBit(fresh, p) || TestBit(slot.valid, p)) continue;
    used_pages_++;
    SetBit(slot.valid, p);
    slot.crc[p] = crcs[k];
    ++filled;
  }
  if (filled == 0) return;
  if (auto it = files_.find(slot.fh); it != files_.end() && it->second.have) {
    slot.version = it->second.validated;
  }
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
    if (auto it = index_.find(Key(w.fh, b)); it != index_.end()) part.from = it->second;
    // Pages covered in part: merged with the cache's copy or the server's.
    for (uint32_t p : {part.p0, part.p0 + part.np - 1}) {
      const uint64_t ps = uint64_t{p} * kPage;
      const bool partial = lo > ps || hi < ps + kPage;
      if (!partial) continue;
      const bool cached = part.from != UINT32_MAX && TestBit(slots_[part.from].valid, p);
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
  for (auto& part : parts) {
    Plan plan;
    bool cow = false;
    if (part.from != UINT32_MAX) {
      const Slot& from = slots_[part.from];
      for (uint32_t p = part.p0; p < part.p0 + part.np; ++p) cow = cow || TestBit(from.dirty, p);
    }
    if (part.from != UINT32_MAX && !cow) {
      part.to = part.from;
    } else {
      bool evicted = false;
      auto got = policy_->Allocate(Key(w.fh, part.block), &evicted);
      if (!got) {
        // Every slot is dirty or busy: this write goes to the server.
        UndoWb(parts);
        out.kind = WbOutcome::kUnavailable;
        stats_.wb_arounds++;
        return false;
      }
      part.to = *got;
      if (evicted) {
        stats_.evictions++;
        FreeSlot(part.to, /*persist=*/false);
      }
      Slot& to = slots_[part.to];
      to.fh = w.fh;
      to.block = part.block;
      to.valid = {};
      to.dirty = {};
      to.filling = {};
      to.crc.assign(pages(), 0);
      to.version = f.validated;
      to.fsize = 0;
      to.gen++;
      policy_->Pin(part.to);
      part.allocated = true;
    }
    if (part.from != UINT32_MAX) {
      Slot& from = slots_[part.from];
      part.from_gen = from.gen;
      policy_->Pin(part.from);
      part.pinned_from = true;
      // Read from the current slot: the partial pages it holds, and on a
      // copy every valid page the write does not cover whole.
      for (uint32_t p = 0; p < pages(); ++p) {
        if (!TestBit(from.valid, p)) continue;
        const bool touched = p >= part.p0 && p < part.p0 + part.np;
        const bool edge = p == part.p0 || p == part.p0 + part.np - 1;
        if ((touched && edge) || (cow && !touched)) SetBit(plan.read, p);
      }
      plan.crc = from.crc;
      if (!cow) {
        // In place: readers of the pages being rewritten go to the server
        // (they are clean, so it has them) until the new data is in.
        for (uint32_t p = part.p0; p < part.p0 + part.np; ++p) {
          if (TestBit(from.valid, p)) {
            ClearBit(from.valid, p);
            used_pages_--;
          }
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
        const off_t at = static_cast<off_t>(uint64_t{part.from} * opts_.block + uint64_t{p} * kPage);
        if (!PreadAll(data_fd_, page, kPage, at)) {
          io_error = true;
          err = errno;
          break;
        }
        if (Crc(page, kPage) == plan.crc[p]) {
          SetBit(part.copied, p);
          continue;
        }
        std::memset(page, 0, kPage);
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
  if (io_error || !bad.empty()) {
    if (io_error) DeviceError("reading the cache", err);
    if (!bad.empty()) {
      stats_.checksum_failures += bad.size();
      Log("cache")->warn("cached page failed its checksum during a write; merging with the server's");
    }
    UndoWb(parts);
    out.kind = io_error ? WbOutcome::kUnavailable : WbOutcome::kNeedPages;
    out.need = std::move(bad);
    return false;
  }
  return true;
}

void BlockCache::UndoWb(std::vector<WbPart>& parts) {
  for (auto& part : parts) {
    if (part.allocated) {
      FreeSlot(part.to, /*persist=*/true);  // its previous record may name an evicted block
      policy_->Unpin(part.to);
      policy_->Release(part.to);
    } else if (part.pinned_from && slots_[part.from].gen == part.from_gen) {
      Persist(part.from);  // in place: the pages cleared for the write stay invalid
    }
    if (part.pinned_from) policy_->Unpin(part.from);
  }
  parts.clear();
}

void BlockCache::WriterWb(std::vector<Job>& batch, std::unique_lock<std::mutex>& lock) {
  struct Item {
    std::vector<WbPart> parts;
    WbOutcome out;
    bool ok = false;       // applied in memory
    bool durable = true;   // and its records written
  };
  std::vector<Item> items(batch.size());
  std::vector<uint32_t> retire;  // slots whose blocks moved (freed after the sync)
  const auto now = std::chrono::steady_clock::now();
  for (size_t i = 0; i < batch.size(); ++i) {
    const WbWrite& w = *batch[i].wb;
    Item& it = items[i];
    if (health_ != Health::kHealthy) {
      it.out.kind = WbOutcome::kUnavailable;
      stats_.wb_arounds++;
      continue;
    }
    if (!PrepareWb(w, it.parts, it.out, lock)) continue;
    // Step 2b (unlocked): write the new pages to their slots.
    lock.unlock();
    bool wrote = true;
    for (const auto& part : it.parts) {
      const off_t at = static_cast<off_t>(uint64_t{part.to} * opts_.block + uint64_t{part.img0} * kPage);
      wrote = wrote && PwriteAll(data_fd_, part.image.data(), part.image.size(), at);
    }
    const int err = errno;
    lock.lock();
    bool raced = false;
    for (const auto& part : it.parts) {
      raced = raced || (part.pinned_from && slots_[part.from].gen != part.from_gen);
    }
    if (!wrote || raced) {
      if (!wrote) DeviceError("writing the cache", err);
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
      for (uint32_t p = part.img0; p < part.img0 + part.image.size() / kPage; ++p) {
        const bool touched = p >= part.p0 && p < part.p0 + part.np;
        if (!touched && !TestBit(part.copied, p)) continue;
        if (!TestBit(to.valid, p)) used_pages_++;
        SetBit(to.valid, p);
        to.crc[p] = part.crc[p - part.img0];
        if (touched || (from && TestBit(from->dirty, p))) SetBit(to.dirty, p);
      }
      if (from && moved) {
        to.wgen = from->wgen;
        to.fsize = from->fsize;
        to.dirty_since = AnyBit(from->dirty) ? from->dirty_since : now;
        stats_.copies++;
      } else if (!to.dirty_pin) {
        to.dirty_since = now;
      }
      to.wgen++;
      to.fsize = std::max({to.fsize, w.off + w.len, LogicalSize(f)});
      to.uid = w.uid;
      to.groups = w.groups;
      to.gid = w.gid;
      to.inval++;
      if (from) stats_.write_hits++;
      if (moved) {
        const std::string key = Key(w.fh, part.block);
        index_[key] = part.to;
        f.slots.insert(part.to);
        if (from) {
          f.slots.erase(part.from);
          retire.push_back(part.from);
        }
      }
      SetDirtyPin(part.to);
      NoteChange(f, part.block, part.p0, part.np);
    }
    f.wb_size = std::max(f.wb_size, w.off + w.len);
    stats_.writes++;
    it.ok = true;
  }
  // Group commit: data, then the records that declare it, then the old
  // slots of moved blocks, each step synced before the writes are answered.
  lock.unlock();
  const bool data_synced = fdatasync(data_fd_) == 0;
  const int data_err = errno;
  lock.lock();
  if (!data_synced) DeviceError("syncing the cache data", data_err);
  if (data_synced) {
    for (auto& it : items) {
      if (!it.ok) continue;
      for (const auto& part : it.parts) {
        if (!Persist(part.to)) it.durable = false;
      }
    }
    for (uint32_t s : retire) {
      FreeSlot(s, /*persist=*/true);  // after the new records: a crash keeps one copy
      policy_->Release(s);
    }
  }
  lock.unlock();
  const bool index_synced = data_synced && fdatasync(index_fd_) == 0;
  const int index_err = errno;
  lock.lock();
  if (data_synced && !index_synced) DeviceError("syncing the cache index", index_err);
  for (auto& it : items) {
    for (auto& part : it.parts) {
      if (part.allocated) policy_->Unpin(part.to);
      if (part.pinned_from) policy_->Unpin(part.from);
    }
    if (it.ok && (!index_synced || !it.durable)) {
      // In memory the pages are there (and will be flushed); the caller is
      // told they are not durable, and writes them to the server itself.
      it.out.kind = WbOutcome::kUnavailable;
      stats_.wb_arounds++;
    }
  }
  lock.unlock();
  for (size_t i = 0; i < batch.size(); ++i) batch[i].done(std::move(items[i].out));
  batch.clear();
  lock.lock();
}

bool BlockCache::HasDirty(const std::string& fh, uint64_t off, size_t len) {
  std::lock_guard lock(mu_);
  if (dirty_slots_ == 0) return false;
  const uint64_t block = opts_.block;
  for (uint64_t b = off / block; b * block < off + len; ++b) {
    auto it = index_.find(Key(fh, b));
    if (it == index_.end()) continue;
    const Slot& slot = slots_[it->second];
    if (!slot.dirty_pin) continue;
    const uint64_t lo = std::max(off, b * block) - b * block;
    const uint64_t hi = std::min(off + len, (b + 1) * block) - b * block;
    for (uint32_t p = static_cast<uint32_t>(lo / kPage); p <= (hi - 1) / kPage; ++p) {
      if (TestBit(slot.dirty, p)) return true;
    }
  }
  return false;
}

uint64_t BlockCache::SizeFloor(const std::string& fh) {
  std::lock_guard lock(mu_);
  auto it = files_.find(fh);
  return it == files_.end() ? 0 : it->second.wb_size;
}

OverlayResult BlockCache::Overlay(const std::string& fh, uint64_t token, uint64_t off,
                                 std::string_view server, size_t want, std::string* out) {
  struct Piece {
    uint32_t slot;
    uint64_t gen, block;
    uint32_t page;
    uint32_t crc;
  };
  std::vector<Piece> pieces;
  const size_t have = server.size();
  size_t len = have;
  const uint64_t block = opts_.block;
  {
    std::lock_guard lock(mu_);
    auto fit = files_.find(fh);
    if (fit == files_.end()) return {};
    FileState& f = fit->second;
    if (f.wb_size > off + have) len = static_cast<size_t>(std::min<uint64_t>(want, f.wb_size - off));
    for (uint64_t b = off / block; b * block < off + len; ++b) {
      auto it = index_.find(Key(fh, b));
      const Slot* slot = it == index_.end() ? nullptr : &slots_[it->second];
      if (!Changed(f, b, token) && (!slot || !slot->dirty_pin)) continue;
      const uint64_t lo = std::max(off, b * block) - b * block;
      const uint64_t hi = std::min(off + len, (b + 1) * block) - b * block;
      for (uint32_t p = static_cast<uint32_t>(lo / kPage); p <= (hi - 1) / kPage; ++p) {
        const bool changed = PageChanged(f, b, p, token);
        const bool valid = slot && TestBit(slot->valid, p);
        if (valid && (changed || TestBit(slot->dirty, p))) {
          pieces.push_back(Piece{it->second, slot->gen, b, p, slot->crc[p]});
          policy_->Pin(it->second);
        } else if (changed && !valid) {
          // Written or flushed since the read left, and not held here: the
          // server's answer may predate that.
          for (const auto& pc : pieces) policy_->Unpin(pc.slot);
          return {OverlayResult::kRetry, false};
        }
      }
    }
  }
  if (pieces.empty() && len == have) return {};
  out->assign(server);
  out->resize(len, '\0');
  AlignedBuf page(kPage);
  OverlayResult res{OverlayResult::kOk, true};
  int err = 0;
  std::optional<Piece> bad;
  for (const Piece& pc : pieces) {
    const off_t at = static_cast<off_t>(uint64_t{pc.slot} * block + uint64_t{pc.page} * kPage);
    if (!PreadAll(data_fd_, page.data(), kPage, at)) {
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
    if (slot.gen == bad->gen && TestBit(slot.valid, bad->page) && slot.crc[bad->page] == bad->crc) {
      // Damaged on disk, not a race.
      stats_.checksum_failures++;
      if (TestBit(slot.dirty, bad->page)) {
        Log("cache")->error("an unflushed page failed its checksum (slot {}, page {}): that write is lost",
                            bad->slot, bad->page);
        ClearBit(slot.dirty, bad->page);
        SetDirtyPin(bad->slot);
        res.kind = OverlayResult::kError;
      }
      ClearBit(slot.valid, bad->page);
      used_pages_--;
      slot.inval++;
      Persist(bad->slot);
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
  for (uint32_t s : dirty_set_) d.oldest = std::max(d.oldest, now - slots_[s].dirty_since);
  return d;
}

std::vector<DirtyRun> BlockCache::CollectDirty(uint64_t max_bytes, const std::string& fh,
                                               std::chrono::steady_clock::time_point older_than) {
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
    std::lock_guard lock(mu_);
    std::vector<uint32_t> cand;
    for (uint32_t s : dirty_set_) {
      const Slot& slot = slots_[s];
      if ((fh.empty() || slot.fh == fh) && slot.dirty_since <= older_than) cand.push_back(s);
    }
    // File order: by handle, then offset (the server sees ascending writes).
    std::sort(cand.begin(), cand.end(), [this](uint32_t a, uint32_t b) {
      const Slot &x = slots_[a], &y = slots_[b];
      return x.fh != y.fh ? x.fh < y.fh : x.block < y.block;
    });
    uint64_t bytes = 0;
    for (uint32_t s : cand) {
      if (bytes >= max_bytes) break;
      const Slot& slot = slots_[s];
      auto fit = files_.find(slot.fh);
      const uint64_t size = fit == files_.end() ? slot.fsize : std::max(LogicalSize(fit->second), slot.fsize);
      picks.push_back(Pick{s, slot.fh, slot.block, slot.gen, slot.wgen, size, slot.dirty, slot.crc,
                           slot.uid, slot.gid, slot.groups});
      for (auto w : slot.dirty) bytes += uint64_t{static_cast<uint32_t>(__builtin_popcountll(w))} * kPage;
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
      if (!PreadAll(data_fd_, io.data(), io.size(),
                    static_cast<off_t>(uint64_t{pk.slot} * block + uint64_t{p} * kPage))) {
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
    if (slot.gen != pk->gen || slot.crc[p] != pk->crc[p] || !TestBit(slot.dirty, p)) continue;
    stats_.checksum_failures++;
    Log("cache")->error("an unflushed page failed its checksum (slot {}, page {}): that write is lost", s, p);
    ClearBit(slot.dirty, p);
    ClearBit(slot.valid, p);
    used_pages_--;
    slot.inval++;
    SetDirtyPin(s);
    Persist(s);
  }
  return runs;
}

void BlockCache::Flushed(const std::vector<DirtyRun>& runs) {
  std::lock_guard lock(mu_);
  std::set<uint32_t> touched;
  for (const auto& run : runs) {
    auto it = index_.find(Key(run.fh, run.block));
    if (it == index_.end()) continue;
    Slot& slot = slots_[it->second];
    stats_.flushed_bytes += run.data.size();
    if (slot.wgen != run.wgen) continue;  // written again meanwhile: still dirty
    for (uint32_t p = run.first_page; p < run.first_page + run.npages; ++p) ClearBit(slot.dirty, p);
    touched.insert(it->second);
    NoteChange(State(run.fh), run.block, run.first_page, run.npages);
  }
  for (uint32_t s : touched) {
    SetDirtyPin(s);
    Persist(s);
  }
  DiscardBrokenIndex();
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

void BlockCache::Quiesce() {
  std::unique_lock lock(mu_);
  idle_cv_.wait(lock, [this] { return jobs_.empty() && !writing_; });
}

CacheStats BlockCache::Stats() const {
  std::lock_guard lock(mu_);
  CacheStats s = stats_;
  s.state = health_ == Health::kHealthy ? "healthy" : health_ == Health::kDegraded ? "degraded" : "out";
  s.capacity_bytes = capacity_bytes();
  s.slots = nslots_;
  s.slots_used = policy_->in_use();
  s.used_bytes = used_pages_ * kPage;
  s.dirty_blocks = dirty_slots_;
  for (uint32_t k : dirty_set_) {
    for (auto w : slots_[k].dirty) s.dirty_bytes += uint64_t{static_cast<uint32_t>(__builtin_popcountll(w))} * kPage;
  }
  return s;
}

}  // namespace mpnfs::cache
