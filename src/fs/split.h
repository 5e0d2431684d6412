// SplitRange: cuts [off, off+len) into pieces of at most `max` bytes, the
// way a large FUSE read or write becomes several concurrent NFS calls of at
// most rsize / wsize. Pieces are aligned to `max` boundaries after the first,
// so that a sequential stream's calls line up with the server's blocks.
#pragma once

#include <cstddef>
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

}  // namespace mpnfs::fs
