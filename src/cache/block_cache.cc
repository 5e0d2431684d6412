#include "cache/block_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>

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

const char* ModeName(CacheMode m) {
  switch (m) {
    case CacheMode::kReadOnly: return "readonly";
    case CacheMode::kWriteThrough: return "writethrough";
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
  struct stat st{};
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Error::Errno(ENOENT, "cache_dir " + dir + ": not a directory");
  }
  if (access(dir.c_str(), W_OK | X_OK) != 0) {
    return Error::Errno(EACCES, "cache_dir " + dir + ": not writable");
  }
  lock_fd_ = open((dir + "/lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd_ < 0) return Sys("cache_dir " + dir + "/lock");
  if (flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    return Error::Errno(EBUSY, "cache_dir " + dir + " is in use by another mount");
  }

  // Size: cache_size, but never more than the filesystem can hold while
  // keeping 5% of it free (the data file is preallocated below).
  const uint32_t ppb = pages();
  record_bytes_ = RecordBytes(ppb);
  const std::string data_path = dir + "/data", index_path = dir + "/index";
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
  std::ostringstream meta;
  meta << "mpnfs-cache " << kFormatVersion << " " << opts_.block << " " << nslots_ << " "
       << record_bytes_ << "\n";
  std::string old_meta;
  {
    std::ifstream in(dir + "/meta");
    std::getline(in, old_meta);
    old_meta += "\n";
  }
  const bool reuse = old_meta == meta.str();
  if (!reuse) {
    if (old_meta.size() > 1) {
      Log("cache")->warn("cache_dir {}: geometry or format changed; starting empty", dir);
    }
    unlink(index_path.c_str());
  }
  data_fd_ = open(data_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (data_fd_ < 0) return Sys("cache data file " + data_path);
  index_fd_ = open(index_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
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
    out << meta.str();
    if (!out.flush()) return Error::Errno(EIO, "cannot write " + dir + "/meta");
  }

  slots_.resize(nslots_);
  policy_ = std::make_unique<TwoQueue>(nslots_, opts_.admit_second);
  stats_.mode = ModeName(opts_.mode);
  if (reuse) LoadIndex();
  writer_ = std::thread([this] { WriterMain(); });
  Log("cache")->info("cache {} in {}: {} MiB in {} KiB blocks, {} blocks kept from before", stats_.mode,
                     dir, capacity_bytes() >> 20, opts_.block >> 10, policy_->in_use());
  return true;
}

void BlockCache::LoadIndex() NO_THREAD_SAFETY_ANALYSIS {  // before the writer starts
  const uint32_t ppb = pages();
  const size_t chunk_slots = 1024;
  std::unordered_map<uint32_t, uint64_t> loaded_seq;
  std::string buf;
  for (uint32_t first = 0; first < nslots_; first += chunk_slots) {
    const uint32_t n = std::min<uint32_t>(chunk_slots, nslots_ - first);
    buf.resize(size_t{n} * 2 * record_bytes_);
    if (!PreadAll(index_fd_, buf.data(), buf.size(), off_t{first} * 2 * record_bytes_)) return;
    for (uint32_t i = 0; i < n; ++i) {
      std::optional<Record> best;
      for (int copy = 0; copy < 2; ++copy) {
        auto r = DecodeRecord(
            std::string_view(buf.data() + (size_t{i} * 2 + copy) * record_bytes_, record_bytes_), ppb);
        if (r && (!best || r->seq > best->seq)) best = std::move(r);
      }
      if (!best) continue;
      seq_ = std::max(seq_, best->seq + 1);
      if (best->fh.empty() || !AnyBit(best->valid)) continue;
      const uint32_t s = first + i;
      const std::string key = Key(best->fh, best->block);
      if (auto it = index_.find(key); it != index_.end()) {
        // The same block twice (a crash between storing it anew and freeing
        // the old slot): keep the newer.
        const uint32_t other = it->second;
        if (loaded_seq[other] > best->seq) continue;
        FreeSlot(other, false);
        policy_->Release(other);
      }
      loaded_seq[s] = best->seq;
      Slot& slot = slots_[s];
      slot.fh = best->fh;
      slot.block = best->block;
      slot.valid = best->valid;
      slot.crc = std::move(best->crc);
      slot.version = best->version;
      index_[key] = s;
      files_[slot.fh].slots.insert(s);
      policy_->Adopt(s, key, /*hot=*/false);
      for (uint32_t p = 0; p < ppb; ++p) used_pages_ += TestBit(slot.valid, p) ? 1 : 0;
    }
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

void BlockCache::Persist(uint32_t s) {
  const Slot& slot = slots_[s];
  Record r;
  r.seq = seq_++;
  r.fh = slot.fh;
  r.block = slot.block;
  r.valid = slot.valid;
  r.version = slot.version;
  r.crc = slot.crc;
  const std::string bytes = EncodeRecord(r, pages());
  const off_t at = (off_t{s} * 2 + static_cast<off_t>(r.seq % 2)) * record_bytes_;
  if (!PwriteAll(index_fd_, bytes.data(), bytes.size(), at)) {
    // The index may now claim pages that are gone: the next mount must not trust it.
    DeviceError("writing the cache index", errno);
    if (ftruncate(index_fd_, 0) != 0) unlink((opts_.dir + "/index").c_str());
    health_ = Health::kOut;
  }
}

void BlockCache::FreeSlot(uint32_t s, bool persist) {
  Slot& slot = slots_[s];
  if (slot.fh.empty()) return;
  index_.erase(Key(slot.fh, slot.block));
  if (auto it = files_.find(slot.fh); it != files_.end()) it->second.slots.erase(s);
  for (uint32_t p = 0; p < pages(); ++p) used_pages_ -= TestBit(slot.valid, p) ? 1 : 0;
  slot.fh.clear();
  slot.valid = {};
  slot.filling = {};
  slot.crc.assign(pages(), 0);
  slot.gen++;
  slot.inval++;
  if (persist) Persist(s);
}

void BlockCache::DropLocked(FileState& f) {
  std::vector<uint32_t> held(f.slots.begin(), f.slots.end());
  for (uint32_t s : held) {
    FreeSlot(s, /*persist=*/true);
    policy_->Release(s);
  }
  if (!held.empty()) {
    stats_.files_dropped++;
    Log("cache")->debug("dropped {} cached blocks of a file changed elsewhere", held.size());
  }
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
      FreeSlot(s, true);
      policy_->Release(s);
    }
  }
}

void BlockCache::Drop(const std::string& fh) {
  std::lock_guard lock(mu_);
  FileState& f = State(fh);
  DropLocked(f);
  f.have = false;  // the next Observe sets the version
  f.pruned_upto = ++f.write_counter;
}

uint64_t BlockCache::DropAll() {
  std::lock_guard lock(mu_);
  uint64_t n = 0;
  for (uint32_t s = 0; s < slots_.size(); ++s) {
    if (slots_[s].fh.empty()) continue;
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
  // write-behind requests of one stream arrive slightly out of order.
  constexpr uint64_t kSlack = 8 << 20;
  const bool near = off + kSlack >= f.seq_next && off <= f.seq_next + kSlack;
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
  std::string buf;
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
    jobs_.push_back(Job{s, slot.gen, slot.inval, p0, std::string(data + (lo - off), hi - lo)});
    queued = true;
  }
  if (queued) cv_.notify_one();
}

void BlockCache::Fill(const std::string& fh, uint64_t token, uint64_t off, const char* data, size_t len) {
  std::lock_guard lock(mu_);
  FileState& f = State(fh);
  StoreLocked(fh, f, off, data, len,
              [&f, token](uint64_t b) {
                auto it = f.writes.find(b);
                if (it == f.writes.end()) return f.pruned_upto <= token;
                return it->second.inflight == 0 && it->second.last_begin <= token;
              },
              false);
}

uint64_t BlockCache::WriteStart(const std::string& fh, uint64_t off, size_t len) {
  std::lock_guard lock(mu_);
  FileState& f = State(fh);
  stats_.writes++;
  f.writes_inflight++;
  f.burst_concurrency = std::max(f.burst_concurrency, f.writes_inflight);
  const uint64_t token = ++f.write_counter;
  const uint64_t block = opts_.block;
  for (uint64_t b = off / block; b * block < off + len; ++b) {
    BlockWrites& w = f.writes[b];
    w.last_begin = token;
    w.inflight++;
    auto it = index_.find(Key(fh, b));
    if (it == index_.end()) continue;
    Slot& slot = slots_[it->second];
    const uint64_t lo = std::max(off, b * block) - b * block;
    const uint64_t hi = std::min(off + len, (b + 1) * block) - b * block;
    bool changed = false;
    for (uint32_t p = static_cast<uint32_t>(lo / kPage); p <= (hi - 1) / kPage; ++p) {
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
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
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
            if (fstat(index_fd_, &st) == 0 && st.st_size > 0) {
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
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    const off_t at = static_cast<off_t>(uint64_t{job.slot} * opts_.block + uint64_t{job.first_page} * kPage);
    const bool wrote = PwriteAll(data_fd_, job.data.data(), job.data.size(), at);
    const int err = errno;
    const uint32_t np = static_cast<uint32_t>(job.data.size() / kPage);
    std::vector<uint32_t> crcs(np);
    for (uint32_t k = 0; k < np; ++k) crcs[k] = Crc(job.data.data() + size_t{k} * kPage, kPage);
    lock.lock();
    Slot& slot = slots_[job.slot];
    const bool current = slot.gen == job.gen && slot.inval == job.inval;
    for (uint32_t k = 0; k < np && slot.gen == job.gen; ++k) ClearBit(slot.filling, job.first_page + k);
    if (!wrote) {
      DeviceError("writing the cache", err);
      continue;
    }
    if (!current) continue;  // given to another block, or invalidated meanwhile
    for (uint32_t k = 0; k < np; ++k) {
      const uint32_t p = job.first_page + k;
      if (!TestBit(slot.valid, p)) used_pages_++;
      SetBit(slot.valid, p);
      slot.crc[p] = crcs[k];
    }
    if (auto it = files_.find(slot.fh); it != files_.end() && it->second.have) {
      slot.version = it->second.validated;
    }
    stats_.pages_filled += np;
    Persist(job.slot);
  }
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
  return s;
}

}  // namespace mpnfs::cache
