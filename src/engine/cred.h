// Cred: the AUTH_SYS identity a request is sent with (uid, gid, up to 16
// supplementary groups, as RFC 5531 allows). Each FUSE request carries its
// caller's Cred down to the wire so the server enforces permissions per user.
#pragma once

#include <cstdint>
#include <vector>

namespace mpnfs::engine {

struct Cred {
  static constexpr size_t kMaxGroups = 16;  // AUTH_SYS limit

  uint32_t uid = 0;
  uint32_t gid = 0;
  std::vector<uint32_t> groups;

  bool operator==(const Cred&) const = default;
};

}  // namespace mpnfs::engine
