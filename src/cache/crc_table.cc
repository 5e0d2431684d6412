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
  void* p = MAP_FAILED;
  int fd = open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0 && ftruncate(fd, static_cast<off_t>(t->bytes_)) == 0) {
    p = mmap(nullptr, t->bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  const int err = errno;
  if (p != MAP_FAILED) {
    t->file_backed_ = true;
    t->fd_ = fd;  // (for PageOut)
  } else {
    if (fd >= 0) close(fd);
    Log("cache")->warn("cache_dir {}: no file for the page checksum table ({}); keeping it in memory "
                       "({} MiB)", dir, std::strerror(err), t->bytes_ >> 20);
    p = mmap(nullptr, t->bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
  }
  t->base_ = static_cast<uint32_t*>(p);
  return t;
}

CrcTable::~CrcTable() {
  if (base_) munmap(base_, bytes_);
  if (fd_ >= 0) close(fd_);
}

uint64_t CrcTable::Resident() const {
  std::vector<unsigned char> vec(bytes_ / 4096);
  if (mincore(base_, bytes_, vec.data()) != 0) return bytes_;
  uint64_t n = 0;
  for (unsigned char c : vec) n += c & 1;
  return n * 4096;
}

bool CrcTable::PageOut() {
  if (!file_backed_) return false;
  return msync(base_, bytes_, MS_SYNC) == 0 && madvise(base_, bytes_, MADV_DONTNEED) == 0 &&
         posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED) == 0;
}

}  // namespace mpnfs::cache
