#include "fs/write_order.h"

#include <algorithm>

namespace mpnfs::fs {

template <class Fn>
void WriteOrder::Overlapping(uint64_t off, uint64_t end, Fn fn) const {
  if (end <= off) return;
  const uint64_t lo = off > max_len_ ? off - max_len_ : 0;
  for (auto it = by_off_.lower_bound(lo); it != by_off_.end() && it->first < end; ++it) {
    const Entry& e = by_seq_.at(it->second);
    if (e.end > off) fn(it->second, e);
  }
  for (Seq t : tails_) {
    const Entry& e = by_seq_.at(t);
    if (e.off < end) fn(t, e);
  }
}

bool WriteOrder::Admit(uint64_t off, uint64_t len, Start start, Seq* seq) {
  const bool now = AdmitEntry(off, off + len, false, std::move(start), seq);
  max_len_ = std::max(max_len_, len);
  return now;
}

bool WriteOrder::AdmitTail(uint64_t off, Start start, Seq* seq) {
  return AdmitEntry(off, UINT64_MAX, true, std::move(start), seq);
}

bool WriteOrder::AdmitEntry(uint64_t off, uint64_t end, bool tail, Start start, Seq* seq) {
  const Seq s = next_seq_++;
  *seq = s;
  Entry e;
  e.off = off;
  e.end = end;
  e.tail = tail;
  std::vector<Seq> earlier;
  Overlapping(e.off, e.end, [&](Seq other, const Entry&) { earlier.push_back(other); });
  for (Seq o : earlier) by_seq_.at(o).dependents.push_back(s);
  e.blockers = static_cast<int>(earlier.size());
  const bool now = e.blockers == 0;
  if (!now) e.start = std::move(start);
  by_seq_.emplace(s, std::move(e));
  if (tail) {
    tails_.push_back(s);
  } else {
    by_off_.emplace(off, s);
  }
  return now;
}

std::vector<std::function<void()>> WriteOrder::Finish(Seq seq) {
  std::vector<std::function<void()>> run;
  auto it = by_seq_.find(seq);
  if (it == by_seq_.end()) return run;
  Entry e = std::move(it->second);
  by_seq_.erase(it);
  if (e.tail) {
    tails_.erase(std::find(tails_.begin(), tails_.end(), seq));
  }
  for (auto [o, end] = by_off_.equal_range(e.off); !e.tail && o != end; ++o) {
    if (o->second == seq) {
      by_off_.erase(o);
      break;
    }
  }
  // Dependents were admitted later, so seq order is admission order.
  std::sort(e.dependents.begin(), e.dependents.end());
  for (Seq d : e.dependents) {
    auto dit = by_seq_.find(d);
    if (dit == by_seq_.end()) continue;
    if (--dit->second.blockers == 0 && dit->second.start) {
      run.push_back([start = std::move(dit->second.start), d] { start(d); });
      dit->second.start = nullptr;
    }
  }
  if (by_seq_.empty()) max_len_ = 0;
  return run;
}

bool WriteOrder::WriteOverlaps(uint64_t off, uint64_t len) const {
  const uint64_t end = len > UINT64_MAX - off ? UINT64_MAX : off + len;
  if (end <= off) return false;
  const uint64_t lo = off > max_len_ ? off - max_len_ : 0;
  for (auto it = by_off_.lower_bound(lo); it != by_off_.end() && it->first < end; ++it) {
    if (by_seq_.at(it->second).end > off) return true;
  }
  return false;
}

size_t WriteOrder::waiting() const {
  size_t n = 0;
  for (const auto& [s, e] : by_seq_) n += e.blockers > 0;
  return n;
}

std::vector<std::pair<uint64_t, uint64_t>> SubtractRanges(
    uint64_t off, uint64_t len, std::vector<std::pair<uint64_t, uint64_t>> holes) {
  std::sort(holes.begin(), holes.end());
  std::vector<std::pair<uint64_t, uint64_t>> out;
  uint64_t pos = off;
  const uint64_t end = off + len;
  for (const auto& [hoff, hlen] : holes) {
    const uint64_t hend = hoff + hlen;
    if (hend <= pos || hlen == 0) continue;
    if (hoff >= end) break;
    if (hoff > pos) out.emplace_back(pos, hoff - pos);
    pos = std::max(pos, hend);
    if (pos >= end) break;
  }
  if (pos < end) out.emplace_back(pos, end - pos);
  return out;
}

}  // namespace mpnfs::fs
