// CrcTable: the CRC-32 of every page of every cache slot, in one flat
// anonymous mapping (no allocation per slot; pages of it are touched only as
// slots are used). At 4 bytes per 4 KiB page it is 1 MiB of RAM per GiB of
// cache, more than everything else together (about 0.4 MiB per GiB).
//
// It was once a shared mapping of an unnamed file in cache_dir, so that the
// kernel could write it out and drop it. That was withdrawn: a store to a
// page of such a file raises SIGBUS (the gateway dies) when the cache
// filesystem is full, and so does a read-back the disk fails; and its page
// faults are cache-disk I/O on the engine's event loops and under the
// cache's lock. Keeping the CRCs out of RAM safely would need reads and
// writes through the Disk seam (errors reported, off the loops): not done.
//
// Nothing in it is durable or trusted across mounts: the index records
// (format.h) remain the only durable copy of the CRCs, and the table is
// rebuilt from them at every mount.
//
// Thread safety: none; BlockCache reads and writes it under its lock.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace mpnfs::cache {

class CrcTable {
 public:
  // A zeroed table of `slots` x `pages` CRCs (`dir`: unused, see above).
  static std::unique_ptr<CrcTable> Open(const std::string& dir, uint32_t slots, uint32_t pages);
  ~CrcTable();
  CrcTable(const CrcTable&) = delete;
  CrcTable& operator=(const CrcTable&) = delete;

  uint32_t* at(uint32_t slot) { return base_ + uint64_t{slot} * pages_; }
  const uint32_t* at(uint32_t slot) const { return base_ + uint64_t{slot} * pages_; }
  uint64_t bytes() const { return bytes_; }

 private:
  CrcTable() = default;
  uint32_t* base_ = nullptr;
  uint64_t bytes_ = 0;
  uint32_t pages_ = 0;
};

}  // namespace mpnfs::cache
