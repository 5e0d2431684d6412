// The on-disk format of the block cache (version 4).
//
// A cache directory holds:
//   data    the slots, slot i at i * block bytes, then the index's record
//           pages (index.h); preallocated (fallocate)
//   index   one header page: format version, geometry and a random name of
//           this index, which its record pages carry (index.h)
//   id      a random name of the cache, kept across mounts (fs/owner.h)
//   lock    flock()ed by the mount that uses the directory
//
// A record says which file and block a slot holds, which 4 KiB pages of it
// are valid, which of those are dirty (written here, not yet on the server:
// cache_mode=writeback), the CRC-32 of each valid page, the file's size,
// mtime and ctime that the pages were validated against, and for dirty
// pages the file size they imply and the user (uid, gid, supplementary
// groups) who wrote them: the flusher writes as that user. A record carries
// the sequence number of the change that made it (the newest claim to a
// block wins) and its own CRC. Page data and the records that declare it
// share the data file and are made durable by one sync; a record that a
// crash may have kept without its pages is told apart by their CRCs when
// the index is loaded (index.h), and page CRCs are checked on every read,
// so a crash can lose cached clean pages and unsynced writes but never
// serve wrong ones.
//
// Format 3 kept the record pages in the index file; it is converted on the
// first mount (Index::Upgrade). Records themselves are unchanged
// (kRecordVersion).
//
// Thread safety: plain functions on values.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mpnfs::cache {

constexpr uint32_t kFormatVersion = 4;  // of the index (index.h)
constexpr uint16_t kRecordVersion = 3;  // of a record (unchanged since format 3)
constexpr uint32_t kPage = 4096;
constexpr uint32_t kMaxPages = 256;  // 1 MiB blocks at most
constexpr size_t kMaxFh = 64;
constexpr size_t kMaxGroups = 16;  // AUTH_SYS

using PageBits = std::array<uint64_t, kMaxPages / 64>;

inline bool TestBit(const PageBits& b, uint32_t i) { return (b[i / 64] >> (i % 64)) & 1; }
inline void SetBit(PageBits& b, uint32_t i) { b[i / 64] |= uint64_t{1} << (i % 64); }
inline void ClearBit(PageBits& b, uint32_t i) { b[i / 64] &= ~(uint64_t{1} << (i % 64)); }
inline bool AnyBit(const PageBits& b) {
  for (auto w : b) {
    if (w != 0) return true;
  }
  return false;
}

// A view of a page bitmap stored elsewhere (a cache slot's, sized to its
// block: one word per 64 pages). Assigning to it copies bits into it.
class BitsRef {
 public:
  BitsRef(uint64_t* w, uint32_t n) : w_(w), n_(n) {}
  BitsRef(const BitsRef&) = default;
  const BitsRef& operator=(const BitsRef& o) const {
    for (uint32_t i = 0; i < n_; ++i) w_[i] = i < o.n_ ? o.w_[i] : 0;
    return *this;
  }
  const BitsRef& operator=(const PageBits& b) const {
    for (uint32_t i = 0; i < n_; ++i) w_[i] = b[i];
    return *this;
  }
  operator PageBits() const {
    PageBits b{};
    for (uint32_t i = 0; i < n_; ++i) b[i] = w_[i];
    return b;
  }
  void Clear() const {
    for (uint32_t i = 0; i < n_; ++i) w_[i] = 0;
  }
  uint64_t* begin() const { return w_; }
  uint64_t* end() const { return w_ + n_; }
  size_t size() const { return n_; }
  uint64_t& operator[](size_t i) const { return w_[i]; }

 private:
  uint64_t* w_;
  uint32_t n_;
};
inline bool TestBit(const BitsRef& b, uint32_t i) { return (b[i / 64] >> (i % 64)) & 1; }
inline void SetBit(const BitsRef& b, uint32_t i) { b[i / 64] |= uint64_t{1} << (i % 64); }
inline void ClearBit(const BitsRef& b, uint32_t i) { b[i / 64] &= ~(uint64_t{1} << (i % 64)); }
inline bool AnyBit(const BitsRef& b) {
  for (auto w : b) {
    if (w != 0) return true;
  }
  return false;
}

// The change attributes cached pages are validated against.
struct FileVersion {
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
  bool operator==(const FileVersion&) const = default;
};

struct Record {
  uint64_t seq = 0;
  std::string fh;          // empty: the slot is free
  uint64_t block = 0;      // block index within the file
  PageBits valid{};
  PageBits dirty{};           // a subset of valid
  FileVersion version;
  uint64_t fsize = 0;         // dirty pages: the file size they imply
  uint32_t uid = 0, gid = 0;  // dirty pages: who wrote them
  std::vector<uint32_t> groups;  // and their supplementary groups (at most kMaxGroups)
  std::vector<uint32_t> crc;  // one per page of the block
};

// Bytes of one record copy for a block of `pages` pages.
uint32_t RecordBytes(uint32_t pages);

// Encodes into exactly RecordBytes(pages) bytes.
std::string EncodeRecord(const Record& r, uint32_t pages);
// nullopt for a torn, foreign or empty copy.
std::optional<Record> DecodeRecord(std::string_view bytes, uint32_t pages);

uint32_t Crc(const char* data, size_t len);

}  // namespace mpnfs::cache
