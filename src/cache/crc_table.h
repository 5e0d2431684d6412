// CrcTable: the CRC-32 of every page of every cache slot, kept out of the
// heap. At 4 bytes per 4 KiB page it is 1 MiB per GiB of cache, twice the
// RAM budget of everything else; so it lives in a shared mapping of an
// unnamed file in the cache directory (O_TMPFILE): the kernel keeps the
// pages in use in the page cache and may write the others out and drop
// them, as it does with the data file's pages.
//
// Nothing in it is durable or trusted across mounts: the index records
// (format.h) remain the only durable copy of the CRCs, the table is rebuilt
// from them at every mount and vanishes with the mapping. It is therefore
// outside the durability rules of block_cache.h and outside the Disk seam.
// Where the directory cannot hold such a file, anonymous memory is used
// instead (then the CRCs do count as RAM).
//
// Thread safety: none; BlockCache reads and writes it under its lock.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace mpnfs::cache {

class CrcTable {
 public:
  // A zeroed table of `slots` x `pages` CRCs, backed by a file in `dir`.
  static std::unique_ptr<CrcTable> Open(const std::string& dir, uint32_t slots, uint32_t pages);
  ~CrcTable();
  CrcTable(const CrcTable&) = delete;
  CrcTable& operator=(const CrcTable&) = delete;

  uint32_t* at(uint32_t slot) { return base_ + uint64_t{slot} * pages_; }
  const uint32_t* at(uint32_t slot) const { return base_ + uint64_t{slot} * pages_; }
  bool file_backed() const { return file_backed_; }
  uint64_t bytes() const { return bytes_; }
  // Bytes of the table in memory now (page cache or anonymous).
  uint64_t Resident() const;
  // Writes the table to its file and drops it from memory, as the kernel
  // does under memory pressure (tests, benchmarks). False if anonymous.
  bool PageOut();

 private:
  CrcTable() = default;
  int fd_ = -1;
  uint32_t* base_ = nullptr;
  uint64_t bytes_ = 0;
  uint32_t pages_ = 0;
  bool file_backed_ = false;
};

}  // namespace mpnfs::cache
