// What the statistics say of the FUSE transport (transport.h): a plain
// value, so that the statistics code needs no FUSE headers.
#pragma once

#include <cstdint>
#include <string>

namespace mpnfs::fuse {

struct TransportStats {
  std::string transport;  // "io_uring" or "device" (/dev/fuse)
  std::string why;        // why not io_uring; empty when it is
  unsigned queues = 0;    // rings built (one per possible CPU), 0 without
  unsigned depth = 0;     // entries per ring
  uint64_t ring_requests = 0;    // requests that came through a ring
  uint64_t device_requests = 0;  // through /dev/fuse (INIT, forgets, interrupts, all without rings)
};

}  // namespace mpnfs::fuse
