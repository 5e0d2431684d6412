#include "cache/policy.h"

#include <algorithm>

namespace mpnfs::cache {
namespace {

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return x;
}

}  // namespace

TwoQueue::TwoQueue(uint32_t capacity, bool admit_second, std::function<uint64_t(uint32_t)> key_of)
    : capacity_(capacity),
      admit_second_(admit_second),
      key_of_(std::move(key_of)),
      where_(capacity, Where::kFree),
      key_(key_of_ ? 0 : capacity, 0),
      prev_(capacity, kNone),
      next_(capacity, kNone),
      pins_(capacity, 0) {
  for (uint32_t s = capacity; s > 0; --s) PushFront(free_, s - 1);  // hand out 0 first
  ghost_limit_ = std::max<size_t>(1, capacity_ / 2);
  // The ring and the table grow as keys are remembered (a cache that never
  // evicts never pays for them).
}

void TwoQueue::PushFront(Queue& q, uint32_t slot) {
  prev_[slot] = kNone;
  next_[slot] = q.head;
  if (q.head != kNone) prev_[q.head] = slot;
  q.head = slot;
  if (q.tail == kNone) q.tail = slot;
  q.size++;
}

void TwoQueue::PushBack(Queue& q, uint32_t slot) {
  next_[slot] = kNone;
  prev_[slot] = q.tail;
  if (q.tail != kNone) next_[q.tail] = slot;
  q.tail = slot;
  if (q.head == kNone) q.head = slot;
  q.size++;
}

void TwoQueue::Unlink(uint32_t slot) {
  Queue& q = where_[slot] == Where::kProbation ? a1in_ : where_[slot] == Where::kMain ? am_ : free_;
  if (prev_[slot] != kNone) next_[prev_[slot]] = next_[slot]; else q.head = next_[slot];
  if (next_[slot] != kNone) prev_[next_[slot]] = prev_[slot]; else q.tail = prev_[slot];
  prev_[slot] = next_[slot] = kNone;
  q.size--;
  where_[slot] = Where::kFree;
}

void TwoQueue::Touch(uint32_t slot) {
  if (where_[slot] == Where::kFree) return;
  Unlink(slot);
  PushFront(am_, slot);
  where_[slot] = Where::kMain;
}

size_t TwoQueue::GhostFind(uint64_t key) const { return GhostFindFp(GhostKey(key)); }

size_t TwoQueue::GhostFindFp(uint32_t key) const {
  if (ghost_table_.empty()) return SIZE_MAX;
  const size_t mask = ghost_table_.size() - 1;
  for (size_t i = Mix(key) & mask;; i = (i + 1) & mask) {
    if (ghost_table_[i].key == key) return i;
    if (ghost_table_[i].key == 0) return SIZE_MAX;
  }
}

void TwoQueue::GhostAdd(uint32_t key) {
  if (ghost_table_.empty()) {
    size_t n = 16;
    while (n < 2 * ghost_limit_) n *= 2;  // load at most 1/2
    ghost_table_.assign(n, GhostEntry{});
  }
  const size_t mask = ghost_table_.size() - 1;
  for (size_t i = Mix(key) & mask;; i = (i + 1) & mask) {
    if (ghost_table_[i].key == key) {
      ghost_table_[i].count++;
      return;
    }
    if (ghost_table_[i].key == 0) {
      ghost_table_[i] = GhostEntry{key, 1};
      return;
    }
  }
}

void TwoQueue::GhostSub(uint32_t key, bool all) {
  size_t i = GhostFindFp(key);
  if (i == SIZE_MAX) return;
  if (!all && --ghost_table_[i].count > 0) return;
  // Backward-shift deletion keeps every probe chain unbroken.
  const size_t mask = ghost_table_.size() - 1;
  ghost_table_[i] = GhostEntry{};
  for (size_t j = (i + 1) & mask; ghost_table_[j].key != 0; j = (j + 1) & mask) {
    const size_t home = Mix(ghost_table_[j].key) & mask;
    // Move j back to i if its home is not in (i, j] (cyclically).
    if (((j - home) & mask) >= ((j - i) & mask)) {
      ghost_table_[i] = ghost_table_[j];
      ghost_table_[j] = GhostEntry{};
      i = j;
    }
  }
}

void TwoQueue::Remember(uint64_t key) {
  if (ring_.empty()) ring_.assign(ghost_limit_, 0);
  if (ring_size_ == ring_.size()) {
    GhostSub(ring_[ring_head_], /*all=*/false);  // the oldest leaves
    ring_head_ = (ring_head_ + 1) % ring_.size();
    ring_size_--;
  }
  const uint32_t fp = GhostKey(key);
  ring_[(ring_head_ + ring_size_) % ring_.size()] = fp;
  ring_size_++;
  GhostAdd(fp);
}

bool TwoQueue::Admit(uint64_t key) {
  if (!admit_second_ || Ghost(key)) return true;
  Remember(key);
  return false;
}

std::optional<uint32_t> TwoQueue::Victim() {
  auto pick = [this](const Queue& q) -> std::optional<uint32_t> {
    for (uint32_t s = q.tail; s != kNone; s = prev_[s]) {
      if (pins_[s] == 0) return s;
    }
    return std::nullopt;
  };
  std::optional<uint32_t> v;
  if (a1in_.size > capacity_ / 4) v = pick(a1in_);
  if (!v) v = pick(am_);
  if (!v) v = pick(a1in_);
  return v;
}

std::optional<uint32_t> TwoQueue::Allocate(uint64_t key, bool* evicted) {
  *evicted = false;
  // A free slot still pinned (released while an operation held it, e.g. a
  // coherence drop during a write-back write) is not handed out until that
  // operation lets go: it would find its slot holding another block.
  uint32_t slot = kNone;
  for (uint32_t s = free_.head; s != kNone && slot == kNone; s = next_[s]) {
    if (pins_[s] == 0) slot = s;
  }
  if (slot == kNone) {
    auto v = Victim();
    if (!v) return std::nullopt;
    slot = *v;
    if (where_[slot] == Where::kProbation) Remember(KeyOf(slot));
    Unlink(slot);
    PushFront(free_, slot);
    --used_;
    *evicted = true;
  }
  const bool hot = Ghost(key);
  if (hot) GhostSub(GhostKey(key), /*all=*/true);
  Adopt(slot, key, hot);
  return slot;
}

void TwoQueue::Adopt(uint32_t slot, uint64_t key, bool hot) {
  if (where_[slot] == Where::kFree) ++used_;
  Unlink(slot);  // from whichever queue holds it (free slots too)
  if (!key_of_) key_[slot] = key;
  PushFront(hot ? am_ : a1in_, slot);
  where_[slot] = hot ? Where::kMain : Where::kProbation;
}

bool TwoQueue::Take(uint32_t slot, uint64_t key, bool hot) {
  if (where_[slot] != Where::kFree || pins_[slot] != 0) return false;
  Adopt(slot, key, hot);
  return true;
}

void TwoQueue::Release(uint32_t slot) {
  if (where_[slot] == Where::kFree) return;
  Unlink(slot);
  if (!key_of_) key_[slot] = 0;
  PushBack(free_, slot);
  --used_;
}

}  // namespace mpnfs::cache
