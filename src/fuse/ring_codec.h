// Between a ring entry's buffers (ring_abi.h) and the byte layout libfuse's
// request decoder and reply encoder use (/dev/fuse's). Pure functions: no
// ring, no kernel; the transport (transport.h) calls them.
#pragma once

#include <linux/fuse.h>
#include <sys/uio.h>

#include <cstddef>
#include <optional>

#include "fuse/ring_abi.h"

namespace mpnfs::fuse {

// Bytes every payload buffer has in front of it, in the same allocation:
// room for the fuse_in_header and the per-opcode header, which
// ComposeRequest places right before the payload so that the request is
// contiguous without copying the payload (1 MiB for a large WRITE).
constexpr size_t kRingPrefix = 4096;
static_assert(kRingPrefix >= sizeof(fuse_in_header) + ring_abi::kOpInOutSize);

struct ComposedRequest {
  const char* data;
  size_t size;
};

// The request the kernel put in `h` and `payload` (payload_cap bytes, with
// kRingPrefix writable bytes before it), laid out as /dev/fuse delivers it:
// fuse_in_header, the per-opcode header, the payload. Nullopt when the
// kernel's lengths do not add up (fuse_in_header.len smaller than the
// header and payload, a per-opcode header over its 128 bytes, a payload
// over the buffer), which no request from a working kernel has.
std::optional<ComposedRequest> ComposeRequest(const ring_abi::ReqHeader& h, char* payload,
                                              size_t payload_cap);

// Puts a reply as libfuse writes it to /dev/fuse (iov[0] the
// fuse_out_header, the rest its arguments) into an entry: the header into
// h->in_out, the arguments one after another into the payload, their sum
// into payload_sz. A reply larger than payload_cap (none is: the kernel
// sized the buffer for the largest) goes back as EIO, and false is returned.
bool PackReply(const iovec* iov, int count, ring_abi::ReqHeader* h, char* payload,
               size_t payload_cap);

}  // namespace mpnfs::fuse
