// The SSD cache's view of NFS attributes: a file version (size, mtime, ctime).
#pragma once

#include "cache/format.h"
#include "nfs/types.h"

namespace mpnfs::fs {

inline int64_t Ns(const nfs::Time& t) { return int64_t{t.sec} * 1000000000 + t.nsec; }
inline cache::FileVersion Version(const nfs::Attr& a) {
  return cache::FileVersion{a.size, Ns(a.mtime), Ns(a.ctime)};
}
inline cache::FileVersion Version(const nfs::Wcc::Before& b) {
  return cache::FileVersion{b.size, Ns(b.mtime), Ns(b.ctime)};
}

}  // namespace mpnfs::fs
