// CrcStore: the CRC-32 of every page of every cache slot (4 bytes per 4 KiB
// page: 1 MiB per GiB of cache), with a bounded part of it in RAM.
//
// Two layouts. When the whole table fits in the RAM budget (cache_crc_ram=,
// by default 4 MiB or 1/32 of the table, whichever is more), it is one flat
// anonymous mapping whose pages are touched only as slots are used, and no
// file exists. Otherwise the table lives in the file `crcs` of cache_dir,
// in frames (4 KiB: the CRCs of whole slots), of which about the budget's
// worth are in RAM at a time, chosen by CLOCK; a frame changed in RAM is
// written back to the file when it is evicted, and read back when a slot
// of it is needed again. (A frame is the CRCs of 16 slots at the default
// 256 KiB block: a cache hit whose frame is not in RAM costs one more 4 KiB
// read of the cache disk.)
//
// Nothing in it is durable: the index records (format.h) remain the only
// durable copy of the CRCs, and the table is rebuilt from them at every
// mount. The file is never synced, its old content is never read (a frame
// not written back since this mount began reads as zeros, without I/O),
// so what a crash leaves in it does not matter.
//
// Why not a shared mapping of the file (as once): a store into such a
// mapping raises SIGBUS, killing the gateway, when the cache filesystem is
// full or the disk fails a read-back, and its page faults would be
// cache-disk I/O on the engine's event loops and under the cache's lock.
// Here every read and write of the file goes through the Disk seam with
// the owner's lock released, and the file is preallocated (fallocate). A
// frame that cannot be read back fails the Hold() that needed it (errno);
// the caller treats that as a cache-disk read error of the slots whose
// CRCs it holds. A frame that cannot be written back stays in RAM, changed,
// for the rest of the mount (counted in write_errors, which the owner
// reports as a cache-disk error): no Hold() fails for another frame's
// write. The file is read and written through the page cache even with
// cache_direct (it is a thousandth of the data).
//
// Mount. The index's records are loaded in slot order, so frames beyond
// the budget are written to the file as the load fills them: one 4 KiB
// write per frame, through the page cache.
//
// Lock and threads. All state is under the owner's mutex (BlockCache::mu_),
// which Hold() is passed, held: it may release it for the file's
// I/O and to wait for another thread's read of the same frame, and retakes
// it before returning. So Hold() must not be called from an engine event
// loop; in the all-in-RAM layout it never releases the lock. Frames held
// (Holds) are never evicted; when every frame is held, busy or stuck,
// another frame is allocated beyond the budget rather than waiting, so a
// holder never waits for another holder and Hold() cannot deadlock. Frames
// are not given back: RAM stays at the most ever held at once beyond the
// budget, which callers keep small (a read's blocks, a write's, 4 frames
// or one index group for a record write, about 64 for a flusher round:
// BlockCache), plus frames stuck after failed write-backs (a disk that
// fails them takes the cache out of service soon: block_cache.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cache/aligned.h"
#include "cache/disk.h"
#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "mpnfs/result.h"

namespace mpnfs::cache {

class CrcStore {
 public:
  static constexpr char kName[] = "crcs";
  static constexpr uint64_t kMinDefaultRam = 4 << 20;
  struct Options {
    uint32_t slots = 0;
    uint32_t pages = 0;  // per slot
    uint64_t ram = 0;    // bytes of CRCs kept in RAM; 0: the default
    // Bytes per frame, a multiple of one slot's CRCs (pages * 4); 0: 4096
    // (or one slot's CRCs if more). Tests set it small to page tiny caches.
    uint32_t frame = 0;
  };
  // Bytes of the whole table, and the RAM budget Open() would use.
  static uint64_t TableBytes(uint32_t slots, uint32_t pages) { return uint64_t{slots} * pages * 4; }
  static uint64_t DefaultRam(uint32_t slots, uint32_t pages);
  // A table of zeros. Paged (the table is larger than the budget): makes
  // dir/crcs, sized and preallocated; else removes any dir/crcs left over.
  static Result<std::unique_ptr<CrcStore>> Open(Disk& disk, const std::string& dir, const Options& o);
  ~CrcStore();
  CrcStore(const CrcStore&) = delete;
  CrcStore& operator=(const CrcStore&) = delete;

  bool paged() const { return file_ != nullptr; }
  uint64_t budget() const { return budget_; }

  // Frames held in RAM for one caller, released when it is destroyed or
  // Release()d: under the owner's lock (declare it after the lock).
  class Holds {
   public:
    explicit Holds(CrcStore& s) : s_(&s) {}
    ~Holds() { Release(); }
    Holds(const Holds&) = delete;
    Holds& operator=(const Holds&) = delete;
    void Release();

   private:
    friend class CrcStore;
    CrcStore* s_;
    std::vector<uint32_t> frames_;
  };
  enum class Got {
    kHeld,      // resident and held; the lock was never released
    kRelocked,  // resident and held, but the lock was released meanwhile
    kFailed,    // a read or write of the file failed (errno); the lock may have been released
  };
  // Makes `slot`'s CRCs resident and holds them for h's life.
  Got Hold(Mutex& mu, uint32_t slot, Holds& h) REQUIRES(mu);
  // The frame that holds `slot`'s CRCs (slots of one frame share it).
  uint32_t FrameOf(uint32_t slot) const { return slot / slots_per_frame_; }
  // Whether `slot`'s CRCs are in RAM now.
  bool Resident(uint32_t slot) const;
  // The CRCs of a resident slot (held, or the all-in-RAM layout).
  const uint32_t* Get(uint32_t slot) const;
  // The same for changing them: marks the frame for writing back.
  uint32_t* Mut(uint32_t slot);

  struct Counters {
    uint64_t reads = 0, writes = 0;  // frames read from and written to the file
    uint64_t write_errors = 0;       // frames that could not be written back (kept in RAM)
    uint64_t frames = 0;             // frames in RAM now (paged layout)
    uint64_t ram_bytes = 0;          // bytes of CRCs in RAM (at most: the mapping's size when not paged)
  };
  Counters counters() const;
  uint64_t write_errors() const { return counters_.write_errors; }

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  enum class State : uint8_t { kFree, kLoading, kReady, kWriting };
  struct Frame {
    char* data = nullptr;   // frame_bytes_, in a slab
    uint32_t page = kNone;  // the table page (frame-sized) it holds
    uint32_t pins = 0;
    State state = State::kFree;
    bool dirty = false;  // changed since read or last written back
    bool ref = false;    // CLOCK: used since the hand last passed
    bool stuck = false;  // its write-back failed: kept in RAM for this mount
  };
  CrcStore() = default;
  uint32_t* SlotIn(Frame& f, uint32_t slot) const {
    return reinterpret_cast<uint32_t*>(f.data) + size_t{slot % slots_per_frame_} * pages_;
  }
  // A frame to load a page into, taken out of the CLOCK (state kLoading,
  // page unset); writes a dirty victim back first, with the lock released
  // (one that fails stays, stuck); a new frame when none can be taken.
  uint32_t Victim(Mutex& mu, bool* relocked) REQUIRES(mu);
  uint32_t* Mut2(uint32_t slot, bool dirty);

  // All-in-RAM layout.
  uint32_t* base_ = nullptr;
  uint64_t map_bytes_ = 0;
  // Paged layout.
  std::unique_ptr<File> file_;
  uint32_t pages_ = 0;  // CRCs per slot
  uint32_t slots_per_frame_ = 1;
  uint32_t frame_bytes_ = 0;
  uint64_t budget_ = 0;
  uint32_t max_frames_ = 0;          // the budget, in frames
  std::vector<uint32_t> frame_of_;   // per table page: its frame, kNone
  std::vector<bool> on_disk_;        // per table page: written to the file this mount
  std::vector<std::unique_ptr<Frame>> frames_;
  std::vector<AlignedBuf> slabs_;  // frames' memory, 64 frames a slab (within the budget)
  char* slab_next_ = nullptr;
  uint32_t slab_left_ = 0;
  uint32_t hand_ = 0;
  CondVar cv_;  // a frame finished loading
  Counters counters_;
};

}  // namespace mpnfs::cache
