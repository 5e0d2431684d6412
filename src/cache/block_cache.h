// BlockCache: the local-flash cache tier between the filesystem layer and
// the NFS engine (cache_dir=, cache_mode=readonly|writethrough|writeback).
//
// What is cached. Blocks of cache_block bytes (64 KiB - 1 MiB) of regular
// files, keyed by NFS file handle and block index, in slots of one
// preallocated data file (format.h). Validity is tracked per 4 KiB page:
// a block may hold only the pages that were read or written. A page is
// served only if its CRC matches; a bad page is dropped and read from the
// server.
//
// Admission and eviction. Random I/O is cached; an access that continues a
// sequential run longer than seq_cutoff bypasses the cache in both
// directions (neither looked up nor filled), so scans and backups never
// reach it. Among what is cached, 2Q (policy.h) keeps blocks used twice
// safe from blocks used once; admit=second caches a block only on its
// second miss. Capacity is bounded by cache_size and by the free space of
// the cache filesystem at mount time (the data file is preallocated, so the
// cache never fills the disk later).
//
// Coherence (shared exports). Each file's cached pages are tied to the
// file's size, mtime and ctime ("version") they were validated against.
// Observe() is called with the attributes the server reports at open
// (close-to-open), after attribute-cache expiry and with READ replies: a
// version that is not this client's own doing drops the file's blocks. This
// client's writes are told apart by their WCC data. When they were sent one
// at a time, each WRITE's pre-op version must be the validated one or the
// post-op of our previous write; once the file's writes have all returned,
// an unexplained pre-op (another client wrote in between), or a reply
// without post-op attributes, drops the file's blocks. A reply without
// pre-op attributes (NFS-Ganesha sends none for WRITE) is taken as ours. Concurrent writes of ours
// cannot be checked that way (the server's intermediate versions are not
// all reported), so, as the Linux NFS client does, changes made while we
// had several writes in flight are taken as ours. Either way the newest
// post-op becomes the validated version when the writes settle, and a
// change by another client after that is caught at the next open,
// attribute expiry or READ reply.
//
// Races with writes. A write invalidates the pages it covers before it is
// sent (persistently: the record is rewritten at once). Data that a read
// or a write brought in is installed only if no write to the same block
// began after that read or write started, nor was in flight meanwhile
// (a per-block write counter), so an old read can never overwrite newer
// data in the cache.
//
// Threads. The engine's event loops never wait for the cache disk: pages to
// store are copied and written by one writer thread, which is also the only
// thread that writes the index (a change of a slot's record is queued, its
// index page marked, and written by the writer); merging unflushed pages
// into a READ reply (OverlayAsync) reads them on the cache's reader thread.
// Lookups (Read) and CollectDirty read the data file in the caller's thread:
// call them from FUSE or flusher threads only. The page checksums of a
// cache larger than their RAM budget are read back from the cache disk
// (crc_store.h) by the thread that needs them: the caller of Read and
// CollectDirty, the writer, the reader thread; never an event loop. All
// state is under one mutex, never held across disk I/O while the cache runs
// (slots are pinned instead; the checksums' frames held; Init() and the
// destructor, alone, hold it while loading and closing). It comes after
// the filesystem's and engine's locks (the program's lock order:
// common/mutex.h). Every file operation goes through the Disk seam (disk.h).
//
// Memory. What the cache keeps in RAM grows with its slots, about 100
// bytes per slot at 64 pages a block (under 0.4 MiB per GiB of cache at the
// default 256 KiB block; contrib/bench/COST.md): the Slot (48 bytes, its
// version interned), its three page bitmaps sized to the block (bits_), its entry in the block
// table (block_table_, open addressing over slot numbers) and its share of
// the 2Q policy's arrays (policy.h). The page CRCs (4 bytes per 4 KiB page,
// 1 MiB per GiB) are in a CrcStore: all in RAM up to its budget
// (cache_crc_ram=, by default 4 MiB or 1/32 of them), else in the file
// `crcs` of cache_dir with about the budget's worth of them in RAM
// (crc_store.h). A file's handle, version bookkeeping and
// write counters are kept once per file (FileState, with an id the slots
// name it by while they hold its blocks); write-back fields (writer's
// credentials, implied size, dirty age, copy-on-write partner and two page
// bitmaps: about 150 bytes) only for slots write-back reached (wb_). Files with nothing cached and nothing in flight are forgotten once
// there are more than 65536 of them.
//
// Durability order (write-back). What a crash may find is what index.h
// allows: each index page as the last index sync left it or as a later
// whole state. On that, the cache keeps these rules, and the crash-state
// explorer (crash_test.cc) checks them over every state a crash may leave:
//  1. Data before records, one sync for both: no record declaring a
//     write-back write's pages is written before those pages (the writer
//     thread applies the write, then writes records), and the records live
//     in the data file (index.h), so one sync makes both durable. A record
//     that reaches the disk without its pages (a crash before the sync) is
//     found at load by the pages' CRCs, and the slot's last synced record
//     is used instead (index.h). A write-back write is acknowledged once
//     its pages are in the data file ("durable at fsync", as a local
//     filesystem): a commit (Commit) then writes the records, syncs the
//     data file once, and frees old slots; it runs
//     when asked by Durable() (fsync, O_SYNC/O_DSYNC writes), Quiesce() or
//     unmount, within commit_interval (1 s) of the first write it covers,
//     and when many old slots wait for it. A crash may lose writes no
//     commit covered, never ones a Durable() call covered.
//  2. New before retired: the old slot of a block moved by copy-on-write is
//     freed only after the block's new record is synced. When a crash leaves
//     both, the record with the higher sequence number wins.
//  2a. Retired before the newest goes: the newest claim of a block is not
//     removed from the disk while an older claim's free may not be
//     durable (else a crash brings the older claim back alone, and a stale
//     dirty page is flushed over newer data). Freeing the newest then
//     writes a tombstone (its record keeps the block's name, nothing
//     valid, a newer sequence number: at load, an empty claim that
//     supersedes the older ones) and the slot is held (pinned, not handed
//     out) until an index sync covers the older frees. Old slots whose
//     block's newest claim is already gone are freed in the commit's own
//     records (a truncate of a file with such old slots waits for that
//     commit). At load, empty claims that won are freed only once the
//     claims they beat are durably freed.
//  3. Clean marks before anything that relies on them: after a flush, the
//     records marking pages clean are synced before the pages count as
//     clean (HasDirty() says yes until then), so no write sent around the
//     cache can be followed by a resurrected stale dirty page; and a
//     truncate's freeing of pages not durably clean is synced before the
//     truncate is sent (Truncating()'s callback), and unflushed writes are
//     never dropped by a truncate (they are flushed before it). An index
//     broken by a disk error takes no clean marks at all: until it is
//     emptied (once nothing is dirty), the files it may declare unflushed
//     take no write around the cache and no truncate (StaleClaims).
//  4. An index is never emptied while it holds dirty records, and one that
//     cannot be read (or is of an unknown format) is refused, not replaced.
//  5. A loaded index and data file are synced before anything is written
//     over them: what the last mount left may still be in the page cache only.
//
// Cache device trouble. An I/O error on the cache disk moves the cache from
// healthy to degraded (nothing new is cached; hits are still served and
// checked); repeated errors take it out of service (everything goes to the
// server). Every 30 s a probe write and read of a scratch file tests the
// disk; when it works again the cache is healthy again. A failed record
// write makes the whole index untrusted for the next mount: no record is
// written after it, and it is emptied (in write-back mode once the flusher,
// which drains a cache out of service, has left nothing dirty). A failed
// sync does the same (records written before it, which may declare data
// that is not on the disk, are checked at load: index.h) and fails the
// Durable() calls waiting for it:
// fsync then sends the file's writes to the server, and the flusher drains
// the rest from the data file (each page checked by its CRC).
//
// Write-back (cache_mode=writeback). A write is stored as dirty pages and
// answered once they are written to the data file; it is durable after the
// next commit (rule 1: the records that declare it written, then one sync
// of the data file for every write since the last commit), which fsync
// waits for (Durable). A dirty page that a record may declare
// (WbSlot::claimed: any record of the slot written since) is never
// overwritten in place: a write that touches one copies the block to another
// slot and the newer record wins at load (copy-on-write), so a crash leaves
// each page as the last commit left it or as a later write left it, never
// torn. A dirty page no record declares yet (written since its slot's last
// record write) is rewritten in place: a crash keeps the older claim (the
// retired slot's, or the page clean or invalid in this slot's records).
// Readers keep away meanwhile (Slot::rewriting: Read misses, the overlay
// asks for the read again, CollectDirty waits), and a reader already
// holding the slot makes the write copy instead. The slot a
// block left stays its partner once the commit frees it: the next copy of
// that block goes back there, unless the slot was given to another block
// meanwhile (freed slots are handed out last, but in a full cache any fill
// may take one), and writes only the pages changed since the block left it
// (WbSlot::delta), so a page rewritten at every commit (a database log's
// last page) costs those pages, not a whole block, each time. Dirty slots
// are pinned (never evicted). A write that covers part of a page the cache
// does not hold asks the caller for the server's page first (kNeedPages)
// and merges. The flusher (fs/flusher.h) takes dirty
// runs in file order (CollectDirty), writes them UNSTABLE, COMMITs, and
// only after an unchanged verifier marks them clean (Flushed). Dirty data
// found at start-up is flushed before the mount is offered. Reads merge
// dirty pages over server data (Overlay), and file sizes include unflushed
// writes (SizeFloor). Write-back assumes this host is the only writer of
// the export (an ownership record there enforces it: fs/owner.h).
//
// Thread safety: all public methods are thread safe.
#pragma once

#include <array>
#include <chrono>
#include <functional>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "cache/aligned.h"
#include "cache/crc_store.h"
#include "cache/disk.h"
#include "cache/format.h"
#include "cache/index.h"
#include "cache/policy.h"
#include "cache/rate_window.h"
#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "mpnfs/result.h"

namespace mpnfs::cache {

enum class CacheMode { kOff, kReadOnly, kWriteThrough, kWriteBack };

struct CacheOptions {
  std::string dir;
  uint64_t size = 1ull << 30;      // bytes
  uint32_t block = 256 << 10;      // bytes, a power of two, 64 KiB .. 1 MiB
  CacheMode mode = CacheMode::kOff;
  uint64_t seq_cutoff = 4 << 20;   // bytes; 0: never bypass
  bool admit_second = false;
  bool fill_block = false;  // fill=block: a read miss fetches and fills whole blocks (fs/ does it)
  bool direct = false;  // cache_direct: O_DIRECT on the data file
  // Write-back: the flusher starts when dirty blocks exceed dirty_high % of
  // the cache and stops at dirty_low %; a block dirty for dirty_age seconds
  // is flushed whatever the level.
  uint32_t dirty_high = 50, dirty_low = 25;
  uint32_t dirty_age_s = 30;
  bool fsync_server = false;      // wb_fsync=server: fsync waits for the server
  bool flush_on_unmount = true;   // wb_noflush clears it
  Disk* disk = nullptr;           // the file-I/O seam; nullptr: RealDisk()
  uint32_t index_per_page = 0;    // tests: records per index page (index.h); 0: all that fit
  // RAM for the page checksums (crc_store.h); 0: the default.
  uint64_t crc_ram = 0;
  uint32_t crc_frame = 0;  // tests: bytes per checksum frame (0: 4 KiB)
  // Write-back: the longest an acknowledged write waits for a commit when
  // nothing asks for one (tests set it long, to commit only when asked).
  std::chrono::milliseconds commit_interval{1000};
  // How long Open() waits for another mount to release the directory.
  std::chrono::seconds lock_wait{0};
};

struct CacheStats {
  std::string mode, state;
  uint64_t capacity_bytes = 0, used_bytes = 0, slots = 0, slots_used = 0;
  uint64_t read_hits = 0, read_misses = 0, read_bypasses = 0;
  uint64_t writes = 0, write_hits = 0, write_bypasses = 0;
  uint64_t pages_filled = 0, evictions = 0, invalidations = 0, files_dropped = 0;
  uint64_t checksum_failures = 0, device_errors = 0;
  // Page checksums beyond their RAM budget: frames read back from the cache
  // disk and written to it, and the bytes of them in RAM (crc_store.h).
  uint64_t checksum_reads = 0, checksum_writes = 0, checksum_ram_bytes = 0;
  uint64_t files_cached = 0;  // files with blocks in the cache
  // Write-back.
  uint64_t dirty_bytes = 0, dirty_blocks = 0, flushed_bytes = 0, flush_errors = 0;
  uint64_t copies = 0;       // copy-on-write of a block with dirty pages
  uint64_t copies_to_partner = 0;  // of them, back to the block's previous slot (WbSlot::partner)
  uint64_t copied_pages = 0;  // pages those copies read and wrote again (a partner holds the rest)
  uint64_t rewrites_in_place = 0;  // writes over dirty pages no record declares yet: no copy
  uint64_t tombstones = 0;   // freed slots held until an older claim's free is durable (rule 2a)
  uint64_t wb_arounds = 0;   // writes sent to the server: no room or device trouble
  double dirty_age_s = 0;        // age of the oldest unflushed write (0: none)
  uint64_t flush_rate_bps = 0;   // bytes flushed per second over the last 10 s
};

// What became of a write-back write.
struct WbOutcome {
  enum Kind {
    kStored,       // in the cache; durable once a Durable() call made after this returns
    kNeedPages,    // send again with the server's copy of these pages (base)
    kRetry,        // raced with a truncate or drop: send again
    kUnavailable,  // no room, or the cache disk failed: write to the server
  } kind = kStored;
  std::vector<uint64_t> need;  // kNeedPages: file offsets of 4 KiB pages
};

struct WbWrite {
  std::string fh;
  uint64_t off = 0;
  const char* data = nullptr;
  size_t len = 0;
  std::shared_ptr<const void> keep;  // owns `data` until done
  uint32_t uid = 0, gid = 0;
  std::vector<uint32_t> groups;
  // The server's content of pages this write covers in part (short at EOF).
  std::map<uint64_t, std::string> base;
};

struct OverlayResult {
  enum Kind { kOk, kRetry, kError } kind = kOk;
  bool replaced = false;
};

// A run of dirty pages for the flusher, read back from the cache.
struct DirtyRun {
  std::string fh;
  uint64_t off = 0;  // file offset
  std::string data;  // clipped to the file size
  uint32_t uid = 0, gid = 0;
  std::vector<uint32_t> groups;
  uint64_t block = 0, wgen = 0;
  uint32_t first_page = 0, npages = 0;
};

class BlockCache {
 public:
  // Opens (or creates) the cache in opts.dir, which must exist, be
  // writable and pass CheckCacheDir (cache_dir.h). Loads the blocks a previous mount left (a warm cache).
  static Result<std::unique_ptr<BlockCache>> Open(const CacheOptions& opts);
  // Finishes pending stores, records each file's latest validated version
  // with its blocks (so they are warm at the next mount), syncs, unlocks.
  ~BlockCache();
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  CacheMode mode() const { return opts_.mode; }
  const CacheOptions& options() const { return opts_; }
  // A random name of this cache directory, kept across mounts (fs/owner.h).
  const std::string& id() const { return id_; }
  uint64_t capacity_bytes() const { return uint64_t{nslots_} * opts_.block; }

  // --- coherence
  // The server says `fh` is at version `v` now.
  void Observe(const std::string& fh, const FileVersion& v);
  // Forget every block of `fh`, dirty pages included: it is gone from the
  // server (ESTALE). Reads already in flight will not store what they bring
  // back.
  void Drop(const std::string& fh);
  // Drop(fh), but only of what was unflushed when `stamp` was taken (from
  // DirtyWriters): the file was judged gone by asking the writers listed
  // then; blocks written since (another user's writes, acknowledged
  // meanwhile) were not asked about and stay, to be asked about again.
  enum class DropResult {
    kDropped,  // everything
    kPartial,  // what was asked about; blocks written since kept
    kNothing,  // nothing asked about is left unflushed (dropped or flushed meanwhile)
  };
  DropResult DropAsOf(const std::string& fh, uint64_t stamp);
  // This client truncates `fh` (after flushing it): forget its blocks. If
  // the file holds unflushed writes (they came after that flush) or stale
  // claims, nothing is forgotten and false is returned: flush again, then
  // call again (a write acknowledged before the truncate must reach the
  // server before it; a flush fails while stale claims stay).
  // Otherwise `then` runs once the forgetting is durable where it must be
  // (pages whose clean marks were not yet durable were freed: after the
  // index sync, on the writer thread; else at once, in the caller's
  // thread): send the truncate from there. Until TruncateDone() no read
  // fills the file's pages: one that reaches the server before the SETATTR
  // brings back the data the truncate cuts (and its reply's attributes would
  // make the forgotten file "had" again).
  bool Truncating(const std::string& fh, std::function<void()> then);
  // The SETATTR of a Truncating() that returned true was answered (or
  // failed): reads started before now never fill.
  void TruncateDone(const std::string& fh);
  // This client changed attributes only (chmod, utimes, ...): if `before`
  // is the validated version, `after` becomes it and nothing is dropped.
  void OwnChange(const std::string& fh, const FileVersion& before, const FileVersion& after);

  // --- admission
  // Notes a read (write false) or a write; true if it continues a
  // sequential run of its kind past seq_cutoff (then the access must bypass
  // the cache). Reads and writes are separate streams: a file written in
  // order and then read back is two scans, and the writing's run must not
  // crowd out the reading's.
  bool Sequential(const std::string& fh, uint64_t off, size_t len, bool write);

  // --- reads
  // The bytes of [off, off+len) if every page of it is cached and sound;
  // nullopt is a miss. Counts a hit or a miss.
  std::optional<std::string> Read(const std::string& fh, uint64_t off, size_t len);
  // Call before reading a missed range from the server; pass the result to Fill.
  uint64_t ReadStart(const std::string& fh);
  // Data the server returned for [off, off+len), read since `token`.
  void Fill(const std::string& fh, uint64_t token, uint64_t off, const char* data, size_t len);
  void NoteBypass(bool write);

  // --- writes
  // Invalidates [off, off+len) before a write is sent (dirty pages are
  // left alone); the token goes to WriteDone. The flusher passes
  // invalidate=false: its writes carry what the cache holds.
  uint64_t WriteStart(const std::string& fh, uint64_t off, size_t len, bool invalidate = true);
  // The write returned. `data` is stored (writethrough, `admit`) if it
  // succeeded and nothing newer raced it. before/after: its WCC versions.
  void WriteDone(const std::string& fh, uint64_t token, uint64_t off, const char* data, size_t len,
                 bool ok, bool admit, const std::optional<FileVersion>& before,
                 const std::optional<FileVersion>& after);

  // --- write-back
  // Stores the write as dirty pages; `done` runs on the cache's writer
  // thread once they are in the data file (durable at the next commit:
  // Durable()), or with why not.
  void WriteBack(WbWrite w, std::function<void(WbOutcome)> done);
  // Whether [off, off+len) holds dirty pages (such a write must not bypass),
  // or the file has stale claims (below): a write must not bypass either.
  bool HasDirty(const std::string& fh, uint64_t off, size_t len);
  // Whether the index, broken by a disk error and not emptied yet, may
  // still declare pages of `fh` ("": of any file) unflushed that were
  // flushed since (their clean marks could not be written): a restart would
  // send them again, over whatever was written to the server after them.
  // Such a file takes no write around the cache and no truncate (Truncating
  // says "flush again") until the index is emptied, which takes every
  // file's pages flushed (EmptyBrokenIndex).
  bool StaleClaims(const std::string& fh);
  // Tries to empty a broken index that declares nothing unflushed any more
  // (disk I/O: the flusher's thread). StaleClaims answers the result.
  void EmptyBrokenIndex();
  // The users whose writes `fh` holds not yet durably on the server, each
  // once (uid, gid, groups: as the flusher will send them); empty if none.
  struct Writer {
    uint32_t uid = 0, gid = 0;
    std::vector<uint32_t> groups;
    bool operator==(const Writer&) const = default;
  };
  // `*stamp` (if given): now, for DropAsOf (blocks written later have a
  // newer write generation).
  std::vector<Writer> DirtyWriters(const std::string& fh, uint64_t* stamp = nullptr);
  // The file's size as this client's unflushed writes make it (0: none).
  uint64_t SizeFloor(const std::string& fh);
  // `server` is what the server returned for [off, off+want), read since
  // `token`. If this client's unflushed pages must show in it, or unflushed
  // writes make the file longer than the server says, the merged bytes go
  // to *out (replaced = true). kRetry: a write or flush raced the read;
  // read again. kError: an unflushed page could not be read back (EIO).
  OverlayResult Overlay(const std::string& fh, uint64_t token, uint64_t off, std::string_view server,
                        size_t want, std::string* out);
  // The same for an engine event loop, which must not wait for the cache
  // disk: if unflushed pages must be read back, `server` is copied and the
  // work moves to the cache's reader thread, where `done` then runs (the
  // cache stays alive until it has); otherwise `done` runs at once. `done`
  // gets the outcome and the bytes to return (valid during the call).
  static void OverlayAsync(std::shared_ptr<BlockCache> cache, const std::string& fh, uint64_t token,
                           uint64_t off, std::string_view server, size_t want,
                           std::function<void(OverlayResult, std::string_view)> done);
  struct DirtyLevel {
    uint64_t blocks = 0, slots = 0;
    std::chrono::steady_clock::duration oldest{};
    bool urgent = false;  // the cache is degraded or out: flush everything
  };
  DirtyLevel Dirty() const;
  // Dirty runs in (file, offset) order, at most about `max_bytes`, only of
  // `fh` if not empty, only of blocks dirty since before `older_than`, none
  // of the files in `skip`. `*failed` (if given) is set when some dirty
  // pages could not be read back (a cache-disk error, of their data or of
  // their checksums): they stay dirty, so an empty result does not then
  // mean that nothing is left to flush.
  std::vector<DirtyRun> CollectDirty(uint64_t max_bytes, const std::string& fh,
                                     std::chrono::steady_clock::time_point older_than,
                                     const std::set<std::string>* skip = nullptr, bool* failed = nullptr);
  // The runs are on the server (COMMIT with their WRITE's verifier): clean
  // unless written again meanwhile. Returns once the clean marks are
  // durable (it waits for the writer thread: never call it from an engine
  // event loop).
  void Flushed(const std::vector<DirtyRun>& runs);
  void NoteFlushError();
  // fsync (write-back): every write-back write to `fh` acknowledged before
  // this call is made durable in the cache (a commit, which covers every
  // file's), then `done(true)` runs (on the writer thread, or at once in the
  // caller's if none of the file's writes waits for a commit).
  // done(false): the cache could not make them durable (a failed sync, a
  // broken index): they are only in memory and the data file, and the
  // caller must get them to the server (flush the file) before it answers.
  void Durable(const std::string& fh, std::function<void(bool)> done);
  // After Durable(false) and a flush of `fh` to the server: true if some
  // of its unflushed writes could not be sent (a page that failed its
  // checksum, so was dropped, since the last call; or pages still dirty,
  // which the flush could not read): fsync must then fail (EIO).
  bool TakeLost(const std::string& fh);
  // Online detach: WriteBack() answers kUnavailable from now on (until Resume).
  void StopWriteBack();
  void ResumeWriteBack();

  // Forgets every clean cached block (online "drop"); returns how many.
  uint64_t DropAll();

  CacheStats Stats() const;
  // Waits until every queued store has been written (tests, unmount),
  // and, if `commit`, every write-back write made durable.
  void Quiesce(bool commit = true);

 private:
  static constexpr uint32_t kNoFile = UINT32_MAX, kNoSlot = UINT32_MAX, kNoVersion = UINT32_MAX;
  // Per slot (48 bytes, plus its page bitmaps in bits_, its CRCs in
  // crcs_, one entry of the block table and the policy's share): what the
  // slot holds. Fields of the file it holds live in the file's FileState,
  // fields only write-back uses in wb_.
  struct Slot {
    uint64_t block = 0;
    uint64_t rec_seq = 0;  // of the record's last change (the newest claim wins)
    uint32_t version = kNoVersion;  // what the pages were validated against: versions_
    uint32_t file = kNoFile;                   // FileState::id; kNoFile: free
    uint32_t next = kNoSlot, prev = kNoSlot;   // the file's other slots
    uint32_t gen = 0;    // bumped when the slot is given to another block
    uint32_t inval = 0;  // bumped when pages are invalidated
    bool dirty_pin = false;  // pinned in the policy while any page is dirty or cleaning
    bool listed = false;     // on the file's list (a block's old slot, moved by
                             // copy-on-write, is not, until it is freed)
    bool rewriting = false;  // the writer is rewriting dirty pages in place:
                             // readers keep away (PrepareWb)
  };
  // Write-back fields of a slot, for slots a write-back write reached (and
  // slots loaded with dirty pages), until the slot is freed.
  struct WbSlot {
    uint64_t wgen = 0;     // a new counter_ value at each write-back write (kept by copies)
    uint64_t fsize = 0;    // the end of the data write-back writes put in this block
    uint32_t uid = 0, gid = 0;
    std::vector<uint32_t> groups;
    std::chrono::steady_clock::time_point dirty_since;
    // Copy-on-write partner: the slot this one was copied from, once a
    // commit freed it (partner_gen: its gen then; a slot given to anything
    // since has another). `delta`: pages whose data here may differ from
    // the partner's (written or filled since the copy). The partner's
    // other pages hold, in the data file, exactly what this slot holds, so
    // the next copy-on-write of this block goes back to the partner and
    // writes only the delta and the new pages (PrepareWb).
    uint32_t partner = kNoSlot;
    uint32_t partner_gen = 0;
    PageBits delta{};
    // Pages a record of this slot written since it got its block may
    // declare dirty (every record write adds the dirty pages it wrote).
    // A dirty page not in it is declared by no record a crash may keep,
    // so it may be rewritten in place (PrepareWb).
    PageBits claimed{};
    PageBits rewriting{};  // pages being rewritten in place now (Slot::rewriting)
  };
  // A slot's page bitmaps (bits_): valid; dirty; flushed, clean mark not
  // durable yet (still "dirty" to HasDirty).
  enum BitKind { kValidBits, kDirtyBits, kCleaningBits, kBitKinds };
  struct BlockWrites {
    uint64_t last_begin = 0;
    int inflight = 0;
    // Write-back changes (writes into the cache, flushes): which pages they
    // touched, all of them; `last_begin` is the newest one's counter.
    PageBits pages{};
    bool all_pages = false;  // a write sent to the server: any page
  };
  struct FileState {
    bool have = false;
    bool verified = false;  // blocks loaded from disk checked against `validated`
    FileVersion validated;
    // This client's writes: counters for the fill rules, WCC bookkeeping.
    uint64_t write_counter = 0, pruned_upto = 0;
    std::map<uint64_t, BlockWrites> writes;
    int writes_inflight = 0;
    int truncates_inflight = 0;  // Truncating() .. TruncateDone(): no fills
    int burst_concurrency = 0;  // most writes in flight at once since the last settle
    std::set<int64_t> own_ctimes;
    std::multiset<int64_t> pending_pre;
    std::optional<FileVersion> newest_after;
    bool unexplained = false;
    // Sequential detection (Sequential()), for reads and for writes apart:
    // two runs each, so that a stream's stragglers or a second stream in the
    // file do not restart a stream's.
    struct SeqRun {
      uint64_t next = 0, length = 0;  // length 0: unused
      uint64_t used = 0;             // SeqRuns::tick of the last access it took
      uint64_t jumped = 0;           // ... of the last jump ahead (a hole made)
      // Ground before `next` that a jump ahead skipped and no request has
      // covered yet, as disjoint [first, second) intervals (empty: first ==
      // second); when a fifth opens, the lowest is forgotten.
      std::array<std::pair<uint64_t, uint64_t>, 4> holes{};
    };
    struct SeqRuns {
      std::array<SeqRun, 2> runs{};
      uint64_t tick = 0;  // accesses of this kind so far
    };
    std::array<SeqRuns, 2> seq{};  // [0] reads, [1] writes
    uint64_t wb_size = 0;  // write-back: the size unflushed writes imply
    uint64_t wb_commit = 0;  // write-back: the commit that makes its last write durable
    bool lost = false;       // an unflushed page was dropped (bad checksum): TakeLost
    // The slots holding blocks of the file: an id while there are any (the
    // slots name the file by it), their number, and a list through them.
    const std::string* fh = nullptr;  // the key of this entry in files_
    uint32_t id = kNoFile;
    uint32_t nslots = 0;  // slots naming the file (listed or not)
    uint32_t head = kNoSlot;
  };
  struct Job {
    uint32_t slot;
    uint64_t gen, inval;
    uint32_t first_page;
    AlignedBuf data;  // whole pages
    // Write-back jobs carry this instead (slot unused).
    std::shared_ptr<WbWrite> wb;
    std::function<void(WbOutcome)> done;
    // Barrier jobs: every queued record is written and the index synced,
    // then this runs (on the writer thread).
    std::function<void()> barrier;
  };
  // One block of a write-back write, between its steps (see WriterWb).
  struct WbPart {
    uint64_t block;
    uint32_t from = UINT32_MAX;  // the slot holding the block now, if any
    uint32_t to = 0;             // where the new pages go (== from: in place)
    uint64_t from_gen = 0;
    uint64_t to_gen = 0;         // `to`'s gen once allocated (a drop meanwhile bumps it)
    bool allocated = false;      // `to` was taken for this write
    bool to_partner = false;     // `to` is `from`'s copy-on-write partner
    bool rewriting = false;      // in place over dirty pages (Slot::rewriting set)
    bool pinned_from = false;
    uint32_t p0 = 0, np = 0;     // pages the write touches
    AlignedBuf image;            // pages [img0, img0 + image/kPage) of `to`
    uint32_t img0 = 0;
    PageBits copied{};           // pages of `from` carried into `to` (read and written)
    PageBits reuse{};            // pages of `from` that `to` (its partner) holds already
    std::vector<uint32_t> crc;   // of image pages
  };
  enum class Health { kHealthy, kDegraded, kOut };
  struct OverlayPlan {
    struct Piece {
      uint32_t slot;
      uint64_t gen, block;
      uint32_t page;
      uint32_t crc;
    };
    std::vector<Piece> pieces;  // pinned until RunOverlay
    size_t len = 0;
  };
  // The reader thread's queue. It lives as long as the thread, which may
  // outlive the cache: the last task of a detached cache may destroy it.
  class Reader {
   public:
    void Post(std::function<void()> task);
    void Stop();  // the thread ends once the queue is empty
    void Main();
   private:
    Mutex mu_;
    CondVar cv_;
    std::deque<std::function<void()>> tasks_ GUARDED_BY(mu_);
    bool stop_ GUARDED_BY(mu_) = false;
  };

  explicit BlockCache(CacheOptions opts);
  Result<bool> Init();
  Status OpenFiles();
  Status LoadIndex() REQUIRES(mu_);
  static std::string Key(const std::string& fh, uint64_t block);
  static uint64_t PolicyKey(const std::string& fh, uint64_t block);
  uint32_t pages() const { return opts_.block / kPage; }
  uint32_t words() const { return (pages() + 63) / 64; }

  // Per-slot storage outside Slot.
  uint32_t SlotNo(const Slot& sl) const REQUIRES(mu_) { return static_cast<uint32_t>(&sl - slots_.data()); }
  BitsRef Bits(const Slot& sl, BitKind k) const REQUIRES(mu_) {
    return BitsRef(const_cast<uint64_t*>(bits_.data()) + (size_t{SlotNo(sl)} * kBitKinds + k) * words(), words());
  }
  BitsRef Valid(const Slot& sl) const REQUIRES(mu_) { return Bits(sl, kValidBits); }
  BitsRef DirtyBits(const Slot& sl) const REQUIRES(mu_) { return Bits(sl, kDirtyBits); }
  BitsRef Cleaning(const Slot& sl) const REQUIRES(mu_) { return Bits(sl, kCleaningBits); }
  // A slot's page CRCs: resident ones only (held by HoldCrcs). Mut marks
  // them changed.
  const uint32_t* PageCrcs(const Slot& sl) const REQUIRES(mu_) { return crcs_->Get(SlotNo(sl)); }
  uint32_t* MutCrcs(const Slot& sl) REQUIRES(mu_) { return crcs_->Mut(SlotNo(sl)); }
  // Holds the CRCs of `slots` in RAM for h's life (crc_store.h). May release
  // mu_ for cache-disk I/O: kRelocked then (what the lock guarded may
  // have changed: look again). kFailed: a read or write of the checksum
  // file failed (counted as a device error; errno kept).
  CrcStore::Got HoldCrcs(const std::vector<uint32_t>& slots, CrcStore::Holds& h) REQUIRES(mu_);
  WbSlot& Wb(uint32_t s) REQUIRES(mu_) { return wb_[s]; }
  // Slot versions are interned (the slots of a file mostly share one).
  const FileVersion& VersionOf(const Slot& sl) const REQUIRES(mu_);
  void SetVersion(Slot& sl, const FileVersion& v) REQUIRES(mu_);
  void ReleaseVersion(Slot& sl) REQUIRES(mu_);
  const WbSlot& WbOf(uint32_t s) const REQUIRES(mu_);
  // The file a slot in use holds.
  const std::string& Fh(const Slot& sl) const REQUIRES(mu_) { return *file_ids_[sl.file]->fh; }
  FileState& FileOf(const Slot& sl) const REQUIRES(mu_) { return *file_ids_[sl.file]; }
  // Gives free slot `s` to block `block` of `f` (an entry of files_); the
  // file keeps its id while any slot names it. List/Unlist: on the file's
  // list of slots or not (SlotsOf).
  void Attach(uint32_t s, FileState& f, uint64_t block) REQUIRES(mu_);
  void List(uint32_t s) REQUIRES(mu_);
  void Unlist(uint32_t s) REQUIRES(mu_);
  // The slots on a file's list.
  std::vector<uint32_t> SlotsOf(const FileState& f) const REQUIRES(mu_);
  // The block table (block_table_): open addressing over slot numbers,
  // keyed by the slot's (file, block), linear probing.
  uint32_t Lookup(uint32_t file, uint64_t block) const REQUIRES(mu_);
  uint32_t Lookup(const std::string& fh, uint64_t block) const REQUIRES(mu_);
  void TableSet(uint32_t s) REQUIRES(mu_);    // s becomes its block's slot
  void TableErase(uint32_t s) REQUIRES(mu_);  // if s is its block's slot
  size_t TableHome(uint32_t file, uint64_t block) const REQUIRES(mu_);

  FileState& State(const std::string& fh) REQUIRES(mu_);
  // Frees a slot; true if it is held (rule 2a: tombstoned, pinned, and its
  // record queued even when `persist` is false).
  bool FreeSlot(uint32_t s, bool persist) REQUIRES(mu_);
  // policy_->Allocate, freeing the slot it evicts; one that must be held
  // (FreeSlot) is left and another taken.
  std::optional<uint32_t> AllocateSlot(uint64_t key) REQUIRES(mu_);
  // Frees the old slot of a moved block (a commit), noted as an older
  // claim until its free is durable (rule 2a).
  void RetireFree(uint32_t s) REQUIRES(mu_);
  void DropLocked(FileState& f) REQUIRES(mu_);
  // Frees every slot of the file; true if one held pages not durably clean.
  bool ForgetFile(FileState& f) REQUIRES(mu_);
  // A slot with dirty pages keeps only those (true); else false.
  bool KeepDirtyOnly(uint32_t s) REQUIRES(mu_);
  // The slot's record changed: queues it for the writer (no I/O here).
  void Persist(uint32_t s) REQUIRES(mu_);
  // Writer thread (or no writer running): writes the queued records, and
  // syncs the index if `sync`; false if that failed (the index is then
  // broken). Unlocks mu_ meanwhile.
  bool WriteRecords(bool sync) REQUIRES(mu_);
  // Waits until everything queued before is durable (a barrier job).
  void Barrier() REQUIRES(mu_);
  void DiscardBrokenIndex() REQUIRES(mu_);
  bool Dirtyish(const Slot& slot) const REQUIRES(mu_);
  // Queues stores of the whole pages of [off, off+len) whose block passes `allowed`.
  template <class Allowed>
  void StoreLocked(const std::string& fh, FileState& f, uint64_t off, const char* data, size_t len,
                   Allowed allowed, bool count_write_hits) REQUIRES(mu_);
  void Settle(FileState& f) REQUIRES(mu_);
  // Overlay's two halves: what must be read (pins it; no I/O), then the reads.
  std::optional<OverlayResult> PlanOverlay(const std::string& fh, uint64_t token, uint64_t off,
                                           size_t have, size_t want, OverlayPlan* plan);
  OverlayResult RunOverlay(const OverlayPlan& plan, uint64_t off, std::string_view server,
                           std::string* out);
  void DeviceError(const char* what, int err) REQUIRES(mu_);
  void WriterMain();
  void WriteFill(Job& job) REQUIRES(mu_);
  // Write-back writes acknowledged but not durable yet: data written since
  // the last data sync, records not yet written, old slots not yet freed.
  struct OlderFree {
    uint32_t slot;
    uint64_t after;  // batches_ when it was queued: a later batch writes it
  };
  bool FreeDurable(const OlderFree& o) const REQUIRES(mu_);
  // A valid page found damaged on disk (the caller ruled out a race with an
  // invalidation) is dropped; an unflushed write it held is lost and
  // reported to fsync. True if the page was dirty.
  bool DropDamagedPage(uint32_t s, uint32_t p) REQUIRES(mu_);
  // A record write or a sync failed: the index is broken (the next mount
  // must not trust it; emptied once nothing dirty is left), the cache out.
  void IndexFailed(const char* what, int err) REQUIRES(mu_);
  // Writes and syncs the index's mark (index.h). Writer thread.
  void WriteMark() REQUIRES(mu_);
  // After an index sync: drops durable older frees, releases tombstones.
  void SettleTombs() REQUIRES(mu_);
  bool WbPending() const REQUIRES(mu_) { return wb_unsynced_ || !wb_persist_.empty() || !wb_retire_.empty(); }
  // Makes every applied write-back write durable (their records written,
  // then one sync of the data file for data and records, then old slots of
  // moved blocks freed) and answers the Durable() waiters; false if that
  // failed (the index is then broken and the cache out). Writer thread, or
  // no writer.
  bool Commit() REQUIRES(mu_);
  // Processes a batch of write-back jobs (group commit).
  void WriterWb(std::vector<Job>& batch) REQUIRES(mu_);
  // Steps 1-2 of one write-back write; false with `out` set if it cannot go on.
  // `batch_pins`: pins the batch's earlier writes hold, per slot.
  bool PrepareWb(const WbWrite& w, std::vector<WbPart>& parts, WbOutcome& out,
                 const std::unordered_map<uint32_t, uint32_t>& batch_pins) REQUIRES(mu_);
  void UndoWb(std::vector<WbPart>& parts) REQUIRES(mu_);
  // Whether page p of slot s is being rewritten in place.
  bool Rewriting(uint32_t s, uint32_t p) const REQUIRES(mu_);
  void SetDirtyPin(uint32_t s) REQUIRES(mu_);
  // A change of the block's server data by this client (write or flush):
  // reads sent before it must not fill the block.
  void NoteChange(FileState& f, uint64_t block, uint32_t p0, uint32_t np) REQUIRES(mu_);
  static bool Changed(const FileState& f, uint64_t block, uint64_t token);
  static bool PageChanged(const FileState& f, uint64_t block, uint32_t page, uint64_t token);
  uint64_t LogicalSize(const FileState& f) const { return std::max(f.have ? f.validated.size : 0, f.wb_size); }
  bool Probe();

  CacheOptions opts_;  // set before Init() returns; block/size may follow the files found
  Disk& disk_;
  uint32_t nslots_ = 0;
  std::unique_ptr<File> data_;
  std::unique_ptr<Index> journal_;  // written by the writer thread only (once it runs)
  int lock_fd_ = -1;

  mutable Mutex mu_;
  CondVar cv_;       // writer: work or stop
  CondVar idle_cv_;  // Quiesce(): queue drained
  CondVar rewrite_cv_;  // a Slot::rewriting was cleared
  std::vector<Slot> slots_ GUARDED_BY(mu_);
  std::vector<uint64_t> bits_ GUARDED_BY(mu_);  // kBitKinds bitmaps of words() words per slot
  std::unique_ptr<CrcStore> crcs_;  // its state under mu_ (crc_store.h)
  uint64_t crc_write_errors_ GUARDED_BY(mu_) = 0;  // of crcs_, reported already
  std::unordered_map<uint32_t, WbSlot> wb_ GUARDED_BY(mu_);
  struct VersionHash {
    size_t operator()(const FileVersion& v) const {
      return std::hash<uint64_t>()(v.size * 31 + static_cast<uint64_t>(v.mtime_ns) * 17 +
                                   static_cast<uint64_t>(v.ctime_ns));
    }
  };
  struct VersionEntry {
    FileVersion v;
    uint32_t refs = 0;  // slots using it
  };
  std::vector<VersionEntry> versions_ GUARDED_BY(mu_);
  std::vector<uint32_t> free_versions_ GUARDED_BY(mu_);
  std::unordered_map<FileVersion, uint32_t, VersionHash> version_ids_ GUARDED_BY(mu_);
  std::unique_ptr<TwoQueue> policy_ GUARDED_BY(mu_);
  std::vector<uint32_t> block_table_ GUARDED_BY(mu_);  // kNoSlot: empty
  std::unordered_map<std::string, FileState> files_ GUARDED_BY(mu_);
  std::vector<FileState*> file_ids_ GUARDED_BY(mu_);  // by FileState::id
  std::vector<uint32_t> free_file_ids_ GUARDED_BY(mu_);
  size_t prune_at_ GUARDED_BY(mu_) = 65536;  // files_ size that triggers forgetting idle files
  // Write counters of all files: tokens of a file forgotten and seen again
  // can never look newer than its writes.
  uint64_t counter_ GUARDED_BY(mu_) = 0;
  std::deque<Job> jobs_ GUARDED_BY(mu_);
  // Durable at fsync (write-back): see "Durability order".
  struct Retire {
    uint32_t slot;
    uint32_t gen;
    uint32_t to, to_gen;  // the slot the block moved to (its partner-to-be)
  };
  std::chrono::steady_clock::time_point last_sync_ GUARDED_BY(mu_);  // of the data file (records)
  std::chrono::steady_clock::time_point last_mark_ GUARDED_BY(mu_);
  bool wb_unsynced_ GUARDED_BY(mu_) = false;  // write-back data applied since the last sync
  std::vector<uint32_t> wb_persist_ GUARDED_BY(mu_);  // slots whose records wait for the commit
  std::vector<Retire> wb_retire_ GUARDED_BY(mu_);     // old slots of moved blocks (pinned till then)
  std::chrono::steady_clock::time_point commit_due_ GUARDED_BY(mu_);
  bool commit_asked_ GUARDED_BY(mu_) = false;          // Quiesce()
  uint64_t commits_ GUARDED_BY(mu_) = 0;               // commits ended (FileState::wb_commit)
  std::vector<std::function<void(bool)>> durable_waiters_ GUARDED_BY(mu_);
  bool writing_ GUARDED_BY(mu_) = false;
  bool stop_ GUARDED_BY(mu_) = false;
  bool wb_stopped_ GUARDED_BY(mu_) = false;
  bool index_broken_ GUARDED_BY(mu_) = false;  // a record write failed: write no more
  bool index_discarded_ GUARDED_BY(mu_) = false;
  // The files the broken index may declare unflushed pages of (StaleClaims):
  // those with dirty pages when it broke, and those whose claims were freed
  // by records not yet synced then (unsettled_frees_: file -> the record
  // batch that makes the free durable). Cleared when it is emptied.
  std::unordered_set<std::string> broken_claims_ GUARDED_BY(mu_);
  std::unordered_map<std::string, uint64_t> unsettled_frees_ GUARDED_BY(mu_);
  bool discard_warned_ GUARDED_BY(mu_) = false;
  std::set<uint32_t> queued_groups_ GUARDED_BY(mu_);  // index pages to write
  // Rule 2a. Record writes are numbered (batches); an index page written in
  // batch b is durable once synced_batch_ >= b.
  uint64_t batches_ GUARDED_BY(mu_) = 0;
  uint64_t synced_batch_ GUARDED_BY(mu_) = 0;
  std::vector<uint64_t> group_batch_ GUARDED_BY(mu_);  // by index page: the batch that last wrote it
  // Blocks whose older claim was freed while a newer slot holds them, until
  // that free is durable (by Key()).
  std::unordered_map<std::string, std::vector<OlderFree>> older_frees_ GUARDED_BY(mu_);
  struct Tomb {
    std::string fh;
    uint64_t block;
    std::vector<OlderFree> waits;  // held until these are durable
  };
  std::unordered_map<uint32_t, Tomb> tombs_ GUARDED_BY(mu_);  // freed newest claims held (pinned)
  std::vector<uint32_t> load_empties_ GUARDED_BY(mu_);  // empty claims that won at load: freed second
  uint64_t seq_ GUARDED_BY(mu_) = 1;
  Health health_ GUARDED_BY(mu_) = Health::kHealthy;
  uint64_t used_pages_ GUARDED_BY(mu_) = 0;
  uint64_t dirty_slots_ GUARDED_BY(mu_) = 0;
  std::set<uint32_t> dirty_set_ GUARDED_BY(mu_);
  std::string id_;
  CacheStats stats_ GUARDED_BY(mu_);
  RateWindow flush_window_ GUARDED_BY(mu_);
  std::thread writer_;
  std::shared_ptr<Reader> reader_ = std::make_shared<Reader>();
  std::thread reader_thread_;
};

}  // namespace mpnfs::cache
