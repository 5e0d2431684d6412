// SplitRange: cuts [off, off+len) into pieces of at most `max` bytes, the
// way a large FUSE read or write becomes several concurrent NFS calls of at
// most rsize / wsize. Pieces are aligned to `max` boundaries after the first,
// so that a sequential stream's calls line up with the server's blocks.
#pragma once

#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <vector>

namespace mpnfs::fs {

struct Piece {
  uint64_t off;     // file offset
  size_t buf_off;   // offset inside the caller's buffer
  size_t len;
};

inline std::vector<Piece> SplitRange(uint64_t off, size_t len, size_t max) {
  std::vector<Piece> out;
  if (max == 0) max = len ? len : 1;
  size_t done = 0;
  while (done < len) {
    uint64_t pos = off + done;
    size_t room = max - static_cast<size_t>(pos % max);
    size_t n = std::min(room, len - done);
    out.push_back(Piece{pos, done, n});
    done += n;
  }
  return out;
}

// The piece size for a request of `len` bytes when `ways` idle connections
// can carry it at once: a large read or write is cut so that each of them
// gets a share (a single O_DIRECT stream then uses the aggregate bandwidth), but
// no piece is smaller than `min` (per-call overhead) nor larger than `max`
// (rsize / wsize).
inline size_t StripePiece(size_t len, int ways, size_t max, size_t min = 128 << 10) {
  if (ways <= 1 || len <= min) return max;
  size_t per = (len + static_cast<size_t>(ways) - 1) / static_cast<size_t>(ways);
  per = (per + 4095) & ~size_t{4095};
  return std::min(max, std::max(per, min));
}

}  // namespace mpnfs::fs
