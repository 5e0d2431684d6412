// fs::LockRanges: the byte ranges one lock owner holds on one file, kept
// as POSIX keeps them (and as an NLM server does): a lock over a range
// replaces whatever the owner held there (an upgrade, a downgrade, a
// split), an unlock cuts the range out of what it held, and adjacent
// ranges of one type merge. Ends are exclusive; kToEnd: the lock reaches
// past any size the file may have (a length of 0 in fcntl and NLM).
//
// The lock layer (fs/locks.h) keeps one per owner and file with what the
// server granted, so that it can ask for the same locks again after the
// server restarts. Not thread safe: its owner's mutex guards it.
#pragma once

#include <cstdint>
#include <iterator>
#include <map>
#include <vector>

namespace mpnfs::fs {

class LockRanges {
 public:
  static constexpr uint64_t kToEnd = UINT64_MAX;

  struct Range {
    uint64_t start = 0;
    uint64_t end = 0;  // exclusive; kToEnd: no end
    bool exclusive = false;
    bool operator==(const Range&) const = default;
  };

  // fcntl's and NLM's (offset, length) as an end.
  static uint64_t EndOf(uint64_t start, uint64_t length) {
    return length == 0 || length > kToEnd - start ? kToEnd : start + length;
  }
  // And back: NLM's length for [start, end).
  static uint64_t LengthOf(const Range& r) { return r.end == kToEnd ? 0 : r.end - r.start; }

  // A lock (`unlock` false) of [start, end), or an unlock of it.
  void Apply(uint64_t start, uint64_t end, bool exclusive, bool unlock) {
    if (start >= end) return;
    Cut(start, end);
    if (unlock) return;
    auto it = ranges_.emplace(start, Piece{end, exclusive}).first;
    // Merge with the neighbours of the same type that touch it.
    if (auto next = std::next(it); next != ranges_.end() && next->first == end && next->second.exclusive == exclusive) {
      it->second.end = next->second.end;
      ranges_.erase(next);
    }
    if (it != ranges_.begin()) {
      auto prev = std::prev(it);
      if (prev->second.end == start && prev->second.exclusive == exclusive) {
        prev->second.end = it->second.end;
        ranges_.erase(it);
      }
    }
  }

  bool empty() const { return ranges_.empty(); }

  // In order of their starts.
  std::vector<Range> All() const {
    std::vector<Range> out;
    out.reserve(ranges_.size());
    for (const auto& [start, p] : ranges_) out.push_back(Range{start, p.end, p.exclusive});
    return out;
  }

 private:
  struct Piece {
    uint64_t end;
    bool exclusive;
  };

  // Removes [start, end) from every range, keeping what lies outside it.
  void Cut(uint64_t start, uint64_t end) {
    auto it = ranges_.lower_bound(start);
    if (it != ranges_.begin()) {
      auto prev = std::prev(it);
      if (prev->second.end > start) {
        const Piece was = prev->second;
        prev->second.end = start;
        if (was.end > end) ranges_.emplace(end, was);
      }
    }
    while (it != ranges_.end() && it->first < end) {
      const Piece was = it->second;
      it = ranges_.erase(it);
      if (was.end > end) {
        ranges_.emplace(end, was);
        break;
      }
    }
  }

  std::map<uint64_t, Piece> ranges_;  // start: the rest
};

}  // namespace mpnfs::fs
