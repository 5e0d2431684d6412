#include "cache/crc_store.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace mpnfs::cache {

uint64_t CrcStore::DefaultRam(uint32_t slots, uint32_t pages) {
  return std::max<uint64_t>(kMinDefaultRam, TableBytes(slots, pages) / 32);
}

Result<std::unique_ptr<CrcStore>> CrcStore::Open(Disk& disk, const std::string& dir, const Options& o) {
  std::unique_ptr<CrcStore> s(new CrcStore());
  const uint32_t slot_bytes = o.pages * 4;
  if (o.slots == 0 || o.pages == 0) return Error::Errno(EINVAL, "empty checksum table");
  s->pages_ = o.pages;
  const uint64_t table = TableBytes(o.slots, o.pages);
  const uint64_t ram = o.ram != 0 ? o.ram : DefaultRam(o.slots, o.pages);
  const std::string path = dir + "/" + kName;
  if (table <= ram) {
    s->slots_per_frame_ = UINT32_MAX;  // (one frame: FrameOf is 0 for all)
    s->budget_ = table;
    s->map_bytes_ = std::max<uint64_t>(4096, (table + 4095) / 4096 * 4096);
    // Anonymous memory: pages of it cost RAM only once a slot's CRCs are set.
    void* p = mmap(nullptr, s->map_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return Error::Errno(errno, "mapping the page checksum table: " + std::string(std::strerror(errno)));
    s->base_ = static_cast<uint32_t*>(p);
    if (disk.Exists(path)) disk.Remove(path);  // a paged table's file, from a larger cache
    return s;
  }
  uint32_t frame = o.frame != 0 ? o.frame : std::max<uint32_t>(4096, slot_bytes);
  if (frame % slot_bytes != 0) return Error::Errno(EINVAL, "checksum frame not a multiple of a slot's checksums");
  s->frame_bytes_ = frame;
  s->slots_per_frame_ = frame / slot_bytes;
  const uint32_t npages = (o.slots + s->slots_per_frame_ - 1) / s->slots_per_frame_;
  const uint64_t bytes = uint64_t{npages} * frame;
  auto file = disk.Open(path, Disk::kCreate);  // (buffered: see the header)
  if (!file) return Error::Errno(file.error().err, "cache checksum file " + file.error().what);
  // Its old content is never read (on_disk_), so it need not be cleared;
  // preallocated, so that writing frames back never meets a full disk.
  if (!(*file)->Truncate(bytes) || !(*file)->Allocate(bytes)) {
    return Error::Errno(errno, "sizing the cache checksum file " + path + ": " + std::strerror(errno));
  }
  s->file_ = std::move(*file);
  s->max_frames_ = static_cast<uint32_t>(std::max<uint64_t>(2, ram / frame));
  s->budget_ = uint64_t{s->max_frames_} * frame;
  s->frame_of_.assign(npages, kNone);
  s->on_disk_.assign(npages, false);
  return s;
}

CrcStore::~CrcStore() {
  if (base_) munmap(base_, map_bytes_);
}

void CrcStore::Holds::Release() {
  for (uint32_t f : frames_) s_->frames_[f]->pins--;
  frames_.clear();
}

bool CrcStore::Resident(uint32_t slot) const {
  if (!paged()) return true;
  const uint32_t f = frame_of_[FrameOf(slot)];
  return f != kNone && (frames_[f]->state == State::kReady || frames_[f]->state == State::kWriting);
}

const uint32_t* CrcStore::Get(uint32_t slot) const {
  return const_cast<CrcStore*>(this)->Mut2(slot, false);
}

uint32_t* CrcStore::Mut(uint32_t slot) { return Mut2(slot, true); }

uint32_t* CrcStore::Mut2(uint32_t slot, bool dirty) {
  if (!paged()) return base_ + uint64_t{slot} * pages_;
  const uint32_t fi = frame_of_[FrameOf(slot)];
  if (fi == kNone) std::abort();  // not resident: a caller skipped Hold()
  Frame& f = *frames_[fi];
  if (f.state != State::kReady && f.state != State::kWriting) std::abort();
  f.ref = true;
  f.dirty = f.dirty || dirty;
  return SlotIn(f, slot);
}

CrcStore::Got CrcStore::Hold(Mutex& mu, uint32_t slot, Holds& h) {
  if (!paged()) return Got::kHeld;
  bool relocked = false;
  const uint32_t page = FrameOf(slot);
  for (;;) {
    if (const uint32_t fi = frame_of_[page]; fi != kNone) {
      Frame& f = *frames_[fi];
      if (f.state == State::kLoading) {
        cv_.Wait(mu);  // another thread reads it
        relocked = true;
        continue;
      }
      f.pins++;
      f.ref = true;
      h.frames_.push_back(fi);
      return relocked ? Got::kRelocked : Got::kHeld;
    }
    const uint32_t v = Victim(mu, &relocked);  // (always a frame)
    Frame& f = *frames_[v];
    if (frame_of_[page] != kNone) {
      f.state = State::kFree;  // brought in by another thread meanwhile
      continue;
    }
    f.page = page;
    f.dirty = false;
    f.ref = true;
    frame_of_[page] = v;
    if (!on_disk_[page]) {
      std::memset(f.data, 0, frame_bytes_);
    } else {
      f.state = State::kLoading;
      mu.Unlock();
      const bool ok = file_->ReadAt(f.data, frame_bytes_, uint64_t{page} * frame_bytes_);
      const int err = errno;
      mu.Lock();
      relocked = true;
      if (!ok) {
        frame_of_[page] = kNone;
        f.page = kNone;
        f.state = State::kFree;
        cv_.SignalAll();
        errno = err;
        return Got::kFailed;
      }
      counters_.reads++;
    }
    f.state = State::kReady;
    cv_.SignalAll();
    f.pins++;
    h.frames_.push_back(v);
    return relocked ? Got::kRelocked : Got::kHeld;
  }
}

uint32_t CrcStore::Victim(Mutex& mu, bool* relocked) {
  auto fresh = [this] {
    if (slab_left_ == 0) {
      const uint32_t n = frames_.size() < max_frames_
                             ? std::min<uint32_t>(64, max_frames_ - static_cast<uint32_t>(frames_.size()))
                             : 1;
      slabs_.emplace_back(size_t{n} * frame_bytes_);
      slab_next_ = slabs_.back().data();
      slab_left_ = n;
    }
    auto f = std::make_unique<Frame>();
    f->data = slab_next_;
    slab_next_ += frame_bytes_;
    slab_left_--;
    f->state = State::kLoading;  // reserved for the caller
    frames_.push_back(std::move(f));
    return static_cast<uint32_t>(frames_.size() - 1);
  };
  if (frames_.size() < max_frames_) return fresh();
  AlignedBuf copy;
  for (;;) {
    const size_t n = frames_.size();
    bool wrote = false;
    for (size_t step = 0; step < 2 * n && !wrote; ++step) {
      const uint32_t fi = hand_;
      hand_ = static_cast<uint32_t>((hand_ + 1) % n);
      Frame& f = *frames_[fi];
      if (f.state == State::kFree) {
        f.state = State::kLoading;
        return fi;
      }
      if (f.state != State::kReady || f.pins > 0 || f.stuck) continue;
      if (f.ref) {
        f.ref = false;
        continue;
      }
      if (!f.dirty) {
        frame_of_[f.page] = kNone;
        f.page = kNone;
        f.state = State::kLoading;
        return fi;
      }
      // Written back first, from a copy, with the lock released: the frame
      // stays usable meanwhile (held, read, changed: then it is kept).
      copy.resize(frame_bytes_);
      std::memcpy(copy.data(), f.data, frame_bytes_);
      const uint32_t page = f.page;
      f.dirty = false;
      f.state = State::kWriting;
      mu.Unlock();
      const bool ok = file_->WriteAt(copy.data(), frame_bytes_, uint64_t{page} * frame_bytes_);
      const int err = errno;
      mu.Lock();
      *relocked = true;
      f.state = State::kReady;
      if (!ok) {
        // Kept, changed, for the rest of the mount; the caller needs some
        // other frame, not this one (the owner reports write_errors).
        f.dirty = true;
        f.stuck = true;
        counters_.write_errors++;
        errno = err;
        wrote = true;  // (the lock was released: look again)
        continue;
      }
      counters_.writes++;
      on_disk_[page] = true;
      if (f.pins == 0 && !f.dirty && !f.ref) {
        frame_of_[page] = kNone;
        f.page = kNone;
        f.state = State::kLoading;
        return fi;
      }
      wrote = true;  // used meanwhile: look again (frames_ may have grown)
    }
    // Every frame held or busy: one more beyond the budget (see the header).
    if (!wrote) return fresh();
  }
}

CrcStore::Counters CrcStore::counters() const {
  Counters c = counters_;
  c.frames = frames_.size();
  c.ram_bytes = paged() ? uint64_t{frame_bytes_} * frames_.size() : map_bytes_;
  return c;
}

}  // namespace mpnfs::cache
