// TwoQueue: which cache slots to keep, which to give up, what to admit.
//
// Policy (2Q, Johnson & Shasha 1994, with the ghost list used for admission):
//  - A block seen for the first time enters the probation FIFO (A1in).
//  - A block hit while on probation is promoted to the main LRU (Am); hits
//    in Am move it to the front. A block is "hot" once it was used twice.
//  - Room is made from probation first while it holds more than a quarter
//    of the slots, else from the cold end of Am. A block evicted from
//    probation leaves its key on a ghost list (A1out, keys only, half as
//    many entries as there are slots); a miss on a ghost key enters Am
//    directly: it was used twice within a short time.
//  - admit=second: a first miss only records the key on the ghost list; the
//    block is cached on its second miss. One pass over a large file then
//    caches nothing at all.
// Why: a scan (a backup, a report, a full-table read) touches each block
// once. Under 2Q it can only push other once-used blocks out of probation;
// the blocks in Am, which were used at least twice, survive it. (Long
// sequential streams do not even get here: BlockCache bypasses them.)
//
// Slots are numbered 0..capacity-1. Pinned slots (being read) are skipped
// when choosing a victim.
//
// Cost. Keys are 64-bit hashes of (file, block) (BlockCache::PolicyKey):
// two keys that collide only make the policy take one block for the other
// when deciding what is hot, never what data is served. The queues are
// linked through per-slot arrays (11 bytes per slot in all, free slots
// too, in a third queue), and the ghost list is a ring of 32-bit key
// fingerprints with a count per fingerprint in an open-addressing table
// (about 20 bytes per ghost entry, at most capacity/2 of them; two keys
// with one fingerprint count as one, again only policy precision). A key
// remembered again while on the ghost list keeps one ring entry per time;
// a key taken off the ghost list (admitted hot) leaves its ring entries
// behind, and their later expiry may end a newer stay early: only policy
// precision, never correctness.
//
// Thread safety: none; BlockCache calls it under its own lock.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace mpnfs::cache {

class TwoQueue {
 public:
  // `key_of` gives the key of the block a slot in use holds (needed when
  // it is evicted from probation); without it the policy stores the keys
  // it is given, 8 bytes per slot.
  explicit TwoQueue(uint32_t capacity, bool admit_second = false,
                    std::function<uint64_t(uint32_t)> key_of = nullptr);

  // A hit on `slot` (in use).
  void Touch(uint32_t slot);
  // Whether a missed block with this key should be cached now. With
  // admit=second a first miss answers false and remembers the key.
  bool Admit(uint64_t key);
  // A free slot for `key`, evicting if needed. nullopt if every slot is
  // pinned. A pinned slot is never handed out, not even a free one (one
  // released while an operation held it). `*evicted` is set to the slot's previous user when one was evicted.
  std::optional<uint32_t> Allocate(uint64_t key, bool* evicted);
  // Puts `slot` (already holding `key`, e.g. found at start-up) in use.
  void Adopt(uint32_t slot, uint64_t key, bool hot);
  // `slot`, free and not pinned, for `key` (hot: into the main queue, as
  // the block's previous slot was). False if it is in use or pinned.
  bool Take(uint32_t slot, uint64_t key, bool hot);
  // `slot` no longer holds anything (invalidated); it becomes free, handed
  // out after the slots free before it (a copy-on-write partner, freed by
  // a commit, is thus kept as long as other free slots last).
  void Release(uint32_t slot);
  void Pin(uint32_t slot) { ++pins_[slot]; }
  void Unpin(uint32_t slot) { --pins_[slot]; }
  bool Pinned(uint32_t slot) const { return pins_[slot] != 0; }
  uint32_t Pins(uint32_t slot) const { return pins_[slot]; }
  // The same with string keys (tests), hashed.
  bool Admit(const std::string& key) { return Admit(Hash(key)); }
  std::optional<uint32_t> Allocate(const std::string& key, bool* evicted) { return Allocate(Hash(key), evicted); }
  void Adopt(uint32_t slot, const std::string& key, bool hot) { Adopt(slot, Hash(key), hot); }
  bool Ghost(const std::string& key) const { return Ghost(Hash(key)); }
  static uint64_t Hash(const std::string& key) { return std::hash<std::string>()(key); }

  uint32_t capacity() const { return capacity_; }
  uint32_t in_use() const { return used_; }
  size_t probation() const { return a1in_.size; }
  size_t main() const { return am_.size; }
  bool InMain(uint32_t slot) const { return where_[slot] == Where::kMain; }
  bool Ghost(uint64_t key) const { return GhostFind(key) != SIZE_MAX; }

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  enum class Where : uint8_t { kFree, kProbation, kMain };
  // A queue of slots linked through prev_/next_: head = newest.
  struct Queue {
    uint32_t head = kNone, tail = kNone;
    size_t size = 0;
  };
  std::optional<uint32_t> Victim();
  uint64_t KeyOf(uint32_t slot) const { return key_of_ ? key_of_(slot) : key_[slot]; }
  void Unlink(uint32_t slot);
  void PushFront(Queue& q, uint32_t slot);
  void PushBack(Queue& q, uint32_t slot);
  void Remember(uint64_t key);
  // The ghost table: open addressing, linear probing; key 0 marks empty.
  static uint32_t GhostKey(uint64_t key) {
    const uint32_t f = static_cast<uint32_t>(key ^ (key >> 32));
    return f == 0 ? 1 : f;
  }
  size_t GhostFind(uint64_t key) const;
  void GhostAdd(uint32_t fp);
  void GhostSub(uint32_t fp, bool all);
  size_t GhostFindFp(uint32_t fp) const;

  const uint32_t capacity_;
  const bool admit_second_;
  std::function<uint64_t(uint32_t)> key_of_;
  std::vector<Where> where_;
  std::vector<uint64_t> key_;  // without key_of_ only
  std::vector<uint32_t> prev_, next_;
  std::vector<uint16_t> pins_;
  Queue a1in_;  // probation (A1in)
  Queue am_;    // main LRU (Am)
  Queue free_;  // head = next to hand out
  uint32_t used_ = 0;
  // Ghost list (A1out): a ring of keys, oldest at ring_head_, and per key
  // the number of its ring entries.
  size_t ghost_limit_ = 1;
  std::vector<uint32_t> ring_;  // fingerprints
  size_t ring_head_ = 0, ring_size_ = 0;
  struct GhostEntry {
    uint32_t key = 0;  // fingerprint; 0: empty
    uint32_t count = 0;
  };
  std::vector<GhostEntry> ghost_table_;
};

}  // namespace mpnfs::cache
