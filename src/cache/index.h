// Index: the cache's journal of slot records (format.h), and the only code
// that reads or writes the `index` file of a cache directory or the record
// pages in its data file.
//
// Layout. The `index` file is one header page, written once, when the index
// is made: format version, geometry (block bytes, slots, record bytes) and
// a random 64-bit name of this index. It is built as `index.tmp`, synced,
// renamed into place and the directory synced, so an index either exists
// whole or not at all. The records live in the data file, after the slots
// (from RegionOffset()), in groups: a group is one 4 KiB page holding
// per_page() records, and each group has two copies, one in each half of
// the region (group g's copy c at RegionOffset() + (g + c * groups) pages).
// A page copy carries a magic, the index's name (a page of an earlier
// index, left in the data file, is never written as far as this one is
// concerned), a sequence number, the sequence number of the newest page
// covered by a completed Sync() when it was written (`synced`), and a CRC of
// the whole page: a torn page fails its CRC and the other copy is used. A
// group whose two copies are both damaged fails the load (the index is
// then refused, not trusted). The region's last page (the mark) holds no
// records, only a `synced`: Mark() writes it when the cache is idle after
// a sync, every 10 s under steady commits, and at unmount, so that the
// last sync's pages are known synced without another group write.
//
// Placement. A group's two copies alternate only across a Sync(): while the
// group's last write is unsynced, later writes of it go over that same copy,
// so the other copy always holds the group as the last Sync() left it. A
// crash therefore leaves each group as the last sync left it or as one of the
// states written since, whole; never older than the last sync, never torn.
// Neighbouring groups never share a 4 KiB sector.
//
// One sync for data and records. Sync() is the data file's sync: it makes
// durable both the record pages and the slot data written before it, so a
// write-back commit costs one sync of the cache disk. A record may therefore
// reach the disk before the data it declares. At Load(), a page copy newer
// than every `synced` found on the disk may be such a one: each of its
// records that declares dirty pages is checked against the data (every
// dirty page's CRC), and a record that fails is replaced by the same
// slot's record in the group's other copy, which holds the slot as the last
// sync left it (its pages were synced with it). The group is then written
// again, with the records chosen, over the copy that failed, and synced,
// before Load() returns: a later load never trusts the failed copy. A
// page copy at or below a `synced` value was written before a sync that
// completed, with every data write that preceded it: its records are
// trusted (a CRC failure there is damage, found when the page is read).
// The cache (block_cache.h) writes a record declaring dirty pages only
// after their data, and never rewrites a page a record it wrote declares
// dirty (copy-on-write), so a copy below `synced` never declares data that
// is not on the disk. A check that fails means "not synced", unless each
// failing page was declared dirty with the same CRC by the other copy too:
// that page was synced before, and its mismatch is damage, left for the
// read or the flush to find and report. (A page first declared in the last
// sync and damaged before a later page or the mark recorded that sync
// looks unsynced: the older record is used. The mark narrows that window
// to the last 10 s of steady commits, or to none after an idle second or
// an unmount.)
//
// Records within a group keep their own sequence numbers (set by the cache
// when a slot's state changes): when a crash leaves two slots claiming one
// block, the higher sequence wins.
//
// Durability. WriteGroup() makes a state visible to a crash from then on;
// Sync() makes every WriteGroup() before it, and every data write before it,
// durable. The order rules of the cache (block_cache.h) are built from
// these two. Every sync of the data file after Open() must be this Sync().
//
// Thread safety: none; BlockCache calls it from one thread at a time. The
// data file may meanwhile be read and written elsewhere, at other offsets.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cache/aligned.h"
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
  // Converts an index of format 3 (records in the index file) in `dir`, if
  // there is one, to this format, keeping every record: the data file
  // (dir/data) is grown to DataFileBytes(), the records are written into
  // it and synced, then the new header replaces the old index. A crash
  // leaves the old index or the new one. Nothing to do: Ok.
  static Status Upgrade(Disk& disk, const std::string& dir);
  // Makes a new, empty index (replacing any) with a new name. The data file
  // must be DataFileBytes() long already; its record region need not be
  // cleared.
  static Status Create(Disk& disk, const std::string& dir, const Geometry& g);
  // `data`: the data file, DataFileBytes() long, kept open by the caller
  // for the Index's lifetime.
  static Result<std::unique_ptr<Index>> Open(Disk& disk, const std::string& dir, const Geometry& g,
                                             File* data);
  // Where the record region starts in the data file, its length, and the
  // data file's whole length.
  static uint64_t RegionOffset(const Geometry& g) { return uint64_t{g.slots} * g.block; }
  static uint64_t RegionBytes(const Geometry& g);
  static uint64_t DataFileBytes(const Geometry& g) { return RegionOffset(g) + RegionBytes(g); }

  const Geometry& geometry() const { return g_; }
  uint32_t per_page() const { return per_page_; }
  uint32_t GroupOf(uint32_t slot) const { return slot / per_page_; }
  uint32_t groups() const { return (g_.slots + per_page_ - 1) / per_page_; }

  // Syncs the data file, then reads every group, calling fn(slot, record)
  // for each slot whose chosen record is in use (fh not empty), after
  // checking the records a crash may have kept without their data (above).
  // An I/O error fails the load.
  Status Load(const std::function<void(uint32_t, Record&&)>& fn);
  // Records the last Load() replaced by an older one (their data did not
  // reach the disk).
  uint64_t fallbacks() const { return fallbacks_; }
  // Writes group `group` holding `records` (one per slot of the group, in
  // slot order). False with errno set on failure.
  bool WriteGroup(uint32_t group, const std::vector<Record>& records);
  // Syncs the data file: records and data written before it are durable.
  bool Sync();
  // Whether the mark is behind the last sync; writes it and syncs.
  bool MarkBehind() const { return marked_ < synced_; }
  bool Mark();
  // Empties the index (after a failed write, when it holds nothing dirty):
  // the next mount starts with an empty cache. If the index file cannot be
  // truncated, it is removed (and the directory synced) instead.
  bool Discard();

 private:
  Index(std::unique_ptr<File> header, File* data, const Geometry& g, uint64_t name, Disk& disk,
        std::string dir);
  uint64_t CopyOffset(uint32_t group, int copy) const;
  uint64_t MarkOffset() const;
  char* StartPage();  // page_, cleared, with this index's page head
  // The dirty pages `r` declares in `slot` that do not hold the CRC `r` gives.
  Result<PageBits> Mismatches(uint32_t slot, const Record& r);
  bool Whole(const char* page) const;  // magic and CRC right (any index's page)
  bool Ours(const char* page) const;   // format, geometry and name of this index
  bool Sound(const char* page) const;  // a page copy of this index, whole
  // Load's choice for one group from its two copies (records to *recs),
  // raising *seen (the newest `synced`) and seq_ by its sound copies:
  // kLater if its records must be checked and `final` is false (the newest
  // `synced` on the disk is not known yet).
  enum class Choice { kEmpty, kTrusted, kRewrite, kLater };
  Result<Choice> Choose(uint32_t group, const char* const copy[2], uint64_t* seen, bool final,
                        std::vector<Record>* recs);

  std::unique_ptr<File> header_;
  File* data_;
  Disk& disk_;
  const std::string dir_;
  Geometry g_;
  uint64_t name_ = 0;
  uint32_t record_bytes_ = 0, per_page_ = 0;
  uint64_t seq_ = 1;
  uint64_t synced_ = 0;  // pages up to this sequence number are durable
  uint64_t marked_ = 0;  // the mark says so up to here
  uint64_t last_group_seq_ = 0;  // of the last group page written
  uint64_t fallbacks_ = 0;
  AlignedBuf page_;      // for O_DIRECT: one aligned page
  std::vector<uint8_t> durable_copy_;  // per group: the copy the last sync left
  std::vector<uint8_t> pending_;       // per group: written since the last sync
  std::vector<uint32_t> pending_list_;
};

}  // namespace mpnfs::cache
