// Index: the cache's journal of slot records (format.h), and the only code
// that reads or writes the `index` file of a cache directory.
//
// Layout. Page 0 is a header written once, when the file is made: format
// version and geometry (block bytes, slots, record bytes). The file is
// built as `index.tmp`, synced, renamed into place and the directory synced,
// so an index either exists whole with its geometry or not at all. Records
// follow in groups: a group is one 4 KiB index page holding per_page()
// records, and each group has two copies, one in each half of the file
// (group g's copy c at page 1 + g + c * groups). A page copy carries a magic,
// a sequence number and a CRC of the whole page: a torn page fails its CRC
// and the other copy is used. A group whose two copies are both damaged
// fails the load (the index is then refused, not trusted).
//
// Placement. A group's two copies alternate only across a Sync(): while the
// group's last write is unsynced, later writes of it go over that same copy,
// so the other copy always holds the group as the last Sync() left it. A
// crash therefore leaves each group as the last sync left it or as one of the
// states written since, whole; never older than the last sync, never torn.
// Neighbouring groups never share a 4 KiB sector.
//
// Records within a group keep their own sequence numbers (set by the cache
// when a slot's state changes): when a crash leaves two slots claiming one
// block, the higher sequence wins.
//
// Durability. WriteGroup() makes a state visible to a crash from then on;
// Sync() makes every WriteGroup() before it durable. The order rules of the
// cache (block_cache.h) are built from these two.
//
// Thread safety: none; BlockCache calls it from one thread at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cache/disk.h"
#include "cache/format.h"
#include "mpnfs/result.h"

namespace mpnfs::cache {

struct Geometry {
  uint32_t block = 0;  // bytes
  uint32_t slots = 0;
  // Records per index page; 0: as many as fit. (Tests set 1 or 2 so that
  // the records of a moved block land in different pages.)
  uint32_t per_page = 0;
  bool operator==(const Geometry&) const = default;
  uint32_t pages() const { return block / kPage; }
};

class Index {
 public:
  static constexpr char kName[] = "index";
  // The geometry of dir/index: nullopt if there is no index or it is empty;
  // an error if it exists but is not an index of this format (or unreadable).
  static Result<std::optional<Geometry>> Probe(Disk& disk, const std::string& dir);
  // Makes a new, empty index (replacing any) as described above.
  static Status Create(Disk& disk, const std::string& dir, const Geometry& g);
  static Result<std::unique_ptr<Index>> Open(Disk& disk, const std::string& dir, const Geometry& g);
  static uint64_t FileBytes(const Geometry& g);

  const Geometry& geometry() const { return g_; }
  uint32_t per_page() const { return per_page_; }
  uint32_t GroupOf(uint32_t slot) const { return slot / per_page_; }
  uint32_t groups() const { return (g_.slots + per_page_ - 1) / per_page_; }

  // Reads every group, calling fn(slot, record) for each slot whose newest
  // sound record is in use (fh not empty). An I/O error fails the load.
  Status Load(const std::function<void(uint32_t, Record&&)>& fn);
  // Writes group `group` holding `records` (one per slot of the group, in
  // slot order). False with errno set on failure.
  bool WriteGroup(uint32_t group, const std::vector<Record>& records);
  bool Sync();
  // Empties the index (after a failed write, when it holds nothing dirty):
  // the next mount starts with an empty cache.
  bool Discard();

 private:
  Index(std::unique_ptr<File> file, const Geometry& g);
  uint64_t CopyOffset(uint32_t group, int copy) const;

  std::unique_ptr<File> file_;
  Geometry g_;
  uint32_t record_bytes_ = 0, per_page_ = 0;
  uint64_t seq_ = 1;
  std::vector<uint8_t> durable_copy_;  // per group: the copy the last sync left
  std::vector<uint8_t> pending_;       // per group: written since the last sync
  std::vector<uint32_t> pending_list_;
};

}  // namespace mpnfs::cache
