#include "fuse/ring_codec.h"

#include <cerrno>
#include <cstring>

namespace mpnfs::fuse {

std::optional<ComposedRequest> ComposeRequest(const ring_abi::ReqHeader& h, char* payload,
                                              size_t payload_cap) {
  fuse_in_header in;
  memcpy(&in, h.in_out, sizeof(in));
  const size_t psz = h.ent_in_out.payload_sz;
  if (psz > payload_cap || in.len < sizeof(in) + psz) return std::nullopt;
  const size_t op_size = in.len - sizeof(in) - psz;
  if (op_size > ring_abi::kOpInOutSize) return std::nullopt;
  char* start = payload - op_size - sizeof(in);
  memcpy(start, &in, sizeof(in));
  memcpy(start + sizeof(in), h.op_in, op_size);
  return ComposedRequest{start, in.len};
}

bool PackReply(const iovec* iov, int count, ring_abi::ReqHeader* h, char* payload,
               size_t payload_cap) {
  fuse_out_header out;
  memcpy(&out, iov[0].iov_base, sizeof(out));
  size_t len = 0;
  bool fits = true;
  for (int i = 1; i < count; ++i) {
    if (iov[i].iov_len > payload_cap - len) {
      fits = false;
      break;
    }
    if (iov[i].iov_len > 0) memcpy(payload + len, iov[i].iov_base, iov[i].iov_len);
    len += iov[i].iov_len;
  }
  if (!fits) {
    out.error = -EIO;
    len = 0;
  }
  out.len = static_cast<uint32_t>(sizeof(out) + len);
  memcpy(h->in_out, &out, sizeof(out));
  h->ent_in_out.payload_sz = static_cast<uint32_t>(len);
  return fits;
}

}  // namespace mpnfs::fuse
