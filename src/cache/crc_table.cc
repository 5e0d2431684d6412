#include "cache/crc_table.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "common/log.h"

namespace mpnfs::cache {

std::unique_ptr<CrcTable> CrcTable::Open(const std::string& dir, uint32_t slots, uint32_t pages) {
  std::unique_ptr<CrcTable> t(new CrcTable());
  t->pages_ = pages;
  const uint64_t want = uint64_t{slots} * pages * sizeof(uint32_t);
  t->bytes_ = (want + 4095) / 4096 * 4096;
  if (t->bytes_ == 0) t->bytes_ = 4096;
  (void)dir;
  // Anonymous memory, not a file in cache_dir: a shared mapping of a file
  // raises SIGBUS (killing the gateway) when its filesystem is full or its
  // disk fails a read-back, and its page faults would be cache-disk I/O on
  // the event loops and under the cache's lock. See the header.
  void* p = mmap(nullptr, t->bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  t->base_ = static_cast<uint32_t*>(p);
  return t;
}

CrcTable::~CrcTable() {
  if (base_) munmap(base_, bytes_);
}

}  // namespace mpnfs::cache
