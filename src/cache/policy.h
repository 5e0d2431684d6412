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
// Thread safety: none; BlockCache calls it under its own lock.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace mpnfs::cache {

class TwoQueue {
 public:
  explicit TwoQueue(uint32_t capacity, bool admit_second = false);

  // A hit on `slot` (in use).
  void Touch(uint32_t slot);
  // Whether a missed block with this key should be cached now. With
  // admit=second a first miss answers false and remembers the key.
  bool Admit(const std::string& key);
  // A free slot for `key`, evicting if needed. nullopt if every slot is
  // pinned. `*evicted` is set to the slot's previous user when one was evicted.
  std::optional<uint32_t> Allocate(const std::string& key, bool* evicted);
  // Puts `slot` (already holding `key`, e.g. found at start-up) in use.
  void Adopt(uint32_t slot, const std::string& key, bool hot);
  // `slot` no longer holds anything (invalidated); it becomes free.
  void Release(uint32_t slot);
  void Pin(uint32_t slot) { ++pins_[slot]; }
  void Unpin(uint32_t slot) { --pins_[slot]; }

  uint32_t capacity() const { return capacity_; }
  uint32_t in_use() const { return used_; }
  size_t probation() const { return a1in_.size(); }
  size_t main() const { return am_.size(); }
  bool InMain(uint32_t slot) const { return where_[slot] == Where::kMain; }
  bool Ghost(const std::string& key) const { return ghost_index_.count(key) != 0; }

 private:
  enum class Where : uint8_t { kFree, kProbation, kMain };
  std::optional<uint32_t> Victim();
  void Unlink(uint32_t slot);
  void Remember(const std::string& key);

  const uint32_t capacity_;
  const bool admit_second_;
  std::vector<Where> where_;
  std::vector<std::string> key_;
  std::vector<std::list<uint32_t>::iterator> pos_;
  std::vector<uint16_t> pins_;
  std::list<uint32_t> a1in_;  // front = newest
  std::list<uint32_t> am_;    // front = most recently used
  std::vector<uint32_t> free_;  // may hold stale entries; where_ decides
  uint32_t used_ = 0;
  std::list<std::string> ghost_;  // front = newest
  std::unordered_map<std::string, std::list<std::string>::iterator> ghost_index_;
};

}  // namespace mpnfs::cache
