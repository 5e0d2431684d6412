// cache-cost: what the SSD cache costs as it grows. Builds a BlockCache of
// GIB GiB in DIR (emptied first), fills every slot through the cache's public
// API the way the filesystem does (Observe, ReadStart, Fill), and prints one
// JSON line with
//   - heap bytes (mallinfo2 uordblks + hblkhd) and anonymous RSS (RssAnon) the full
//     cache holds, in total and per GiB of cache, after the fill and again
//     after a reopen (what a mount of a full cache costs);
//   - the memory holding the page checksums after the reopen (crc_store.h:
//     all of them up to cache_crc_ram's default, else about that much), and
//     how many checksum frames the fill and churn read and wrote back;
//   - the time to reopen (mount) the full cache, index load included, with
//     the index dropped from the page cache first (cold) and again warm.
// With CHURN=1, half the cache's worth of new blocks is then read in, so
// that as many blocks are evicted and the policy's ghost list is full
// (policy.h): the steady state of a cache in use ("heap_churned").
// The data file is sparse: writes to its slots are dropped (only its size
// is real), so 50 GiB fit on a small disk; the index is real (its header
// file, and its record pages after the slots in the data file: format.h).
// Files are FILE_BLOCKS blocks long, with FH_BYTES-byte handles.
//   cache-cost DIR GIB [BLOCK_KIB=256] [FILE_BLOCKS=64] [FH_BYTES=36] [CHURN=0]
#include <fcntl.h>
#include <malloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "cache/block_cache.h"

using namespace mpnfs::cache;

namespace {

// The real disk, except that writes to the data file's slots (below
// `slots_end`) are dropped and its preallocation skipped, and it counts as
// allocated (so that a cache larger than the free space is not lowered).
// The index's record pages, after the slots, are written.
class SparseFile : public File {
 public:
  SparseFile(std::unique_ptr<File> f, uint64_t slots_end) : f_(std::move(f)), slots_end_(slots_end) {}
  bool ReadAt(char* p, size_t n, uint64_t off) override { return f_->ReadAt(p, n, off); }
  bool WriteAt(const char* p, size_t n, uint64_t off) override {
    if (off + n <= slots_end_) return true;
    if (off < slots_end_) abort();  // a write across the boundary: the layout changed
    return f_->WriteAt(p, n, off);
  }
  bool Sync() override { return f_->Sync(); }
  bool Truncate(uint64_t size) override { return f_->Truncate(size); }
  bool Allocate(uint64_t) override { return true; }
  uint64_t Size() override { return f_->Size(); }

 private:
  std::unique_ptr<File> f_;
  const uint64_t slots_end_;
};

class SparseDisk : public Disk {
 public:
  explicit SparseDisk(uint64_t slots_end) : slots_end_(slots_end) {}
  static bool IsData(const std::string& path) {
    return path.size() >= 5 && path.compare(path.size() - 5, 5, "/data") == 0;
  }
  mpnfs::Result<std::unique_ptr<File>> Open(const std::string& path, int flags) override {
    auto f = RealDisk().Open(path, flags & ~kDirect);
    if (!f || !IsData(path)) return f;
    return std::unique_ptr<File>(new SparseFile(std::move(*f), slots_end_));
  }
  bool Exists(const std::string& p) override { return RealDisk().Exists(p); }
  bool Rename(const std::string& a, const std::string& b) override { return RealDisk().Rename(a, b); }
  bool Remove(const std::string& p) override { return RealDisk().Remove(p); }
  bool SyncDir(const std::string& d) override { return RealDisk().SyncDir(d); }
  uint64_t Allocated(const std::string& p) override {
    struct stat st{};
    if (IsData(p) && stat(p.c_str(), &st) == 0) return static_cast<uint64_t>(st.st_size);
    return RealDisk().Allocated(p);
  }

 private:
  const uint64_t slots_end_;
};

int64_t StatusKb(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const size_t n = strlen(field);
  while (std::getline(in, line)) {
    if (line.compare(0, n, field) == 0 && line.size() > n && line[n] == ':') {
      return std::atoll(line.c_str() + n + 1);
    }
  }
  return -1;
}

struct Mem {
  int64_t heap, anon, file;
};
Mem Now() {
  malloc_trim(0);
  const struct mallinfo2 mi = mallinfo2();  // small chunks in use + large (mmapped) ones
  return Mem{static_cast<int64_t>(mi.uordblks + mi.hblkhd), StatusKb("RssAnon") * 1024,
             StatusKb("RssFile") * 1024};
}

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void DropFromPageCache(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  fdatasync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
}

std::string Handle(uint64_t file, size_t bytes) {
  std::string fh(bytes, '\0');
  uint64_t x = file * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < bytes; ++i) {
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    fh[i] = static_cast<char>(x >> 56);
  }
  std::memcpy(fh.data(), &file, std::min(bytes, sizeof(file)));  // unique
  return fh;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: cache-cost DIR GIB [BLOCK_KIB=256] [FILE_BLOCKS=64] [FH_BYTES=36]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const uint64_t gib = std::strtoull(argv[2], nullptr, 10);
  const uint32_t block = (argc > 3 ? std::atoi(argv[3]) : 256) * 1024;
  const uint64_t file_blocks = argc > 4 ? std::strtoull(argv[4], nullptr, 10) : 64;
  const size_t fh_bytes = argc > 5 ? std::strtoull(argv[5], nullptr, 10) : 36;
  const bool churn = argc > 6 && std::atoi(argv[6]) != 0;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  chmod(dir.c_str(), 0700);
  const uint64_t size = gib << 30;
  {
    // The sparse data file, at its final size (see SparseDisk::Allocated).
    int fd = open((dir + "/data").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) {
      perror("data file");
      return 1;
    }
    close(fd);
  }
  SparseDisk disk(size);  // size / block slots: the records start at size
  const size_t chunk = 4 << 20;
  std::string buf(chunk, 'x');
  CacheOptions o;
  o.dir = dir;
  o.size = size;
  o.block = block;
  o.mode = CacheMode::kWriteThrough;
  o.seq_cutoff = 0;
  o.disk = &disk;
  const Mem base = Now();
  auto c = BlockCache::Open(o);
  if (!c) {
    fprintf(stderr, "cache-cost: %s\n", c.error().what.c_str());
    return 1;
  }
  auto cache = std::move(*c);
  const uint64_t slots = cache->Stats().slots;
  if (slots * block != size) {
    // The cache lowered its size (a nearly full filesystem): the records no
    // longer start at `size`, and SparseDisk would drop some of them.
    fprintf(stderr, "cache-cost: the cache took %llu slots, not %llu (too little free space in %s?)\n",
            static_cast<unsigned long long>(slots), static_cast<unsigned long long>(size / block),
            dir.c_str());
    return 1;
  }
  const uint64_t files = (slots + file_blocks - 1) / file_blocks;
  const FileVersion v{file_blocks * block, 1000, 1000};
  auto fill = [&](uint64_t first, uint64_t files, uint64_t left) {
  for (uint64_t f = first; f < first + files; ++f) {
    const std::string fh = Handle(f, fh_bytes);
    cache->Observe(fh, v);
    const uint64_t bytes = std::min(left, file_blocks) * block;
    left -= bytes / block;
    for (uint64_t off = 0; off < bytes; off += chunk) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk, bytes - off));
      cache->Fill(fh, cache->ReadStart(fh), off, buf.data(), n);
    }
    if (f % 16 == 15) cache->Quiesce();
  }
  cache->Quiesce();
  };
  const auto t_fill = std::chrono::steady_clock::now();
  fill(0, files, slots);
  const double fill_s = Seconds(t_fill);
  const auto filled = cache->Stats();
  const Mem full = Now();
  Mem churned = full;
  uint64_t evictions = 0;
  if (churn) {
    const uint64_t more = slots / 2;
    fill(files, (more + file_blocks - 1) / file_blocks, more);
    churned = Now();
    evictions = cache->Stats().evictions;
  }
  const auto closed = cache->Stats();  // what the reopen must keep
  auto t0 = std::chrono::steady_clock::now();
  cache.reset();
  const double close_s = Seconds(t0);
  const Mem after_close = Now();
  // Reopen cold: the index (and anything else of the cache dir) out of the page cache.
  for (const auto& e : std::filesystem::directory_iterator(dir)) DropFromPageCache(e.path());
  t0 = std::chrono::steady_clock::now();
  c = BlockCache::Open(o);
  const double mount_cold_s = Seconds(t0);
  if (!c) {
    fprintf(stderr, "cache-cost: reopen: %s\n", c.error().what.c_str());
    return 1;
  }
  cache = std::move(*c);
  const auto reopened = cache->Stats();
  const Mem mounted = Now();
  cache.reset();
  t0 = std::chrono::steady_clock::now();
  c = BlockCache::Open(o);
  const double mount_warm_s = Seconds(t0);
  if (!c) return 1;
  c->reset();
  auto per_gib = [&](int64_t a, int64_t b) { return static_cast<double>(a - b) / static_cast<double>(gib); };
  printf("{\"gib\": %llu, \"block_kib\": %u, \"slots\": %llu, \"slots_filled\": %llu, "
         "\"slots_after_mount\": %llu, \"files\": %llu, \"fh_bytes\": %zu, "
         "\"heap_full\": %lld, \"anon_full\": %lld, \"heap_per_gib\": %.0f, \"anon_per_gib\": %.0f, "
         "\"heap_mounted\": %lld, \"heap_mounted_per_gib\": %.0f, \"anon_mounted_per_gib\": %.0f, "
         "\"heap_churned\": %lld, \"evictions\": %llu, "
         "\"file_rss_full\": %lld, \"heap_left_after_close\": %lld, "
         "\"fill_s\": %.2f, \"close_s\": %.3f, \"mount_cold_s\": %.3f, \"mount_warm_s\": %.3f, "
         "\"crc_ram_mounted\": %llu, \"crc_reads_full\": %llu, \"crc_writes_full\": %llu}\n",
         static_cast<unsigned long long>(gib), block >> 10, static_cast<unsigned long long>(slots),
         static_cast<unsigned long long>(filled.slots_used), static_cast<unsigned long long>(reopened.slots_used),
         static_cast<unsigned long long>(files), fh_bytes, static_cast<long long>(full.heap - base.heap),
         static_cast<long long>(full.anon - base.anon), per_gib(full.heap, base.heap),
         per_gib(full.anon, base.anon), static_cast<long long>(mounted.heap - base.heap),
         per_gib(mounted.heap, base.heap), per_gib(mounted.anon, base.anon),
         static_cast<long long>(churned.heap - base.heap), static_cast<unsigned long long>(evictions),
         static_cast<long long>(full.file - base.file), static_cast<long long>(after_close.heap - base.heap),
         fill_s, close_s, mount_cold_s, mount_warm_s,
         static_cast<unsigned long long>(reopened.checksum_ram_bytes),
         static_cast<unsigned long long>(closed.checksum_reads),
         static_cast<unsigned long long>(closed.checksum_writes));
  std::filesystem::remove_all(dir);
  // A mount time of a cache that is not full, or that kept fewer blocks than
  // it held at close, measures the wrong thing.
  if (filled.slots_used != slots) {
    fprintf(stderr, "cache-cost: the fill left %llu of %llu slots used\n",
            static_cast<unsigned long long>(filled.slots_used), static_cast<unsigned long long>(slots));
    return 1;
  }
  if (reopened.slots_used != closed.slots_used) {
    fprintf(stderr, "cache-cost: the reopened cache kept %llu of %llu blocks\n",
            static_cast<unsigned long long>(reopened.slots_used),
            static_cast<unsigned long long>(closed.slots_used));
    return 1;
  }
  return 0;
}
