#include "cache/policy.h"

#include <algorithm>

namespace mpnfs::cache {

TwoQueue::TwoQueue(uint32_t capacity, bool admit_second)
    : capacity_(capacity),
      admit_second_(admit_second),
      where_(capacity, Where::kFree),
      key_(capacity),
      pos_(capacity),
      pins_(capacity, 0) {
  free_.reserve(capacity);
  for (uint32_t s = capacity; s > 0; --s) free_.push_back(s - 1);  // hand out 0 first
}

void TwoQueue::Unlink(uint32_t slot) {
  if (where_[slot] == Where::kProbation) a1in_.erase(pos_[slot]);
  if (where_[slot] == Where::kMain) am_.erase(pos_[slot]);
  where_[slot] = Where::kFree;
}

void TwoQueue::Touch(uint32_t slot) {
  if (where_[slot] == Where::kFree) return;
  Unlink(slot);
  am_.push_front(slot);
  pos_[slot] = am_.begin();
  where_[slot] = Where::kMain;
}

void TwoQueue::Remember(const std::string& key) {
  if (auto it = ghost_index_.find(key); it != ghost_index_.end()) {
    ghost_.erase(it->second);
    ghost_index_.erase(it);
  }
  ghost_.push_front(key);
  ghost_index_[key] = ghost_.begin();
  const size_t limit = std::max<size_t>(1, capacity_ / 2);
  while (ghost_.size() > limit) {
    ghost_index_.erase(ghost_.back());
    ghost_.pop_back();
  }
}

bool TwoQueue::Admit(const std::string& key) {
  if (!admit_second_ || Ghost(key)) return true;
  Remember(key);
  return false;
}

std::optional<uint32_t> TwoQueue::Victim() {
  auto pick = [this](std::list<uint32_t>& q) -> std::optional<uint32_t> {
    for (auto it = q.rbegin(); it != q.rend(); ++it) {
      if (pins_[*it] == 0) return *it;
    }
    return std::nullopt;
  };
  std::optional<uint32_t> v;
  if (a1in_.size() > capacity_ / 4) v = pick(a1in_);
  if (!v) v = pick(am_);
  if (!v) v = pick(a1in_);
  return v;
}

std::optional<uint32_t> TwoQueue::Allocate(const std::string& key, bool* evicted) {
  *evicted = false;
  uint32_t slot;
  // free_ may hold stale entries (slots adopted since): skip them.
  while (!free_.empty() && where_[free_.back()] != Where::kFree) free_.pop_back();
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else {
    auto v = Victim();
    if (!v) return std::nullopt;
    slot = *v;
    if (where_[slot] == Where::kProbation) Remember(key_[slot]);
    Unlink(slot);
    --used_;
    *evicted = true;
  }
  const bool hot = Ghost(key);
  if (hot) {
    ghost_.erase(ghost_index_[key]);
    ghost_index_.erase(key);
  }
  Adopt(slot, key, hot);
  return slot;
}

void TwoQueue::Adopt(uint32_t slot, const std::string& key, bool hot) {
  if (where_[slot] != Where::kFree) {
    Unlink(slot);
  } else {
    ++used_;  // its entry in free_, if any, is skipped later
  }
  key_[slot] = key;
  auto& q = hot ? am_ : a1in_;
  q.push_front(slot);
  pos_[slot] = q.begin();
  where_[slot] = hot ? Where::kMain : Where::kProbation;
}

void TwoQueue::Release(uint32_t slot) {
  if (where_[slot] == Where::kFree) return;
  Unlink(slot);
  key_[slot].clear();
  free_.push_back(slot);
  --used_;
}

}  // namespace mpnfs::cache
