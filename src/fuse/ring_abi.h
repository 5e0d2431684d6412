// The kernel's FUSE-over-io_uring interface (Linux 6.14 and later; the
// kernel's include/uapi/linux/fuse.h). Debian 12's kernel headers and
// libfuse 3.14 predate it, so its definitions are stated here; they are ABI
// and must match the kernel's byte for byte (the static_asserts below).
//
// How a request travels (fs/fuse/dev_uring.c):
// - Each ring entry is two buffers registered with the kernel: a header
//   block (ReqHeader) and a payload buffer of at least the connection's
//   largest request (max_write, here 1 MiB).
// - A request arrives as the completion of the entry's REGISTER or
//   COMMIT_AND_FETCH command: its fuse_in_header in `in_out`, its first
//   argument (the per-opcode header, e.g. fuse_write_in; empty for LOOKUP)
//   in `op_in`, the remaining arguments (names, WRITE data) in the payload,
//   payload_sz bytes of it. fuse_in_header.len counts all three.
// - The reply goes back in place: fuse_out_header in `in_out`, the reply's
//   arguments in the payload, payload_sz set; then COMMIT_AND_FETCH with the
//   request's commit_id, which also hands the entry back for the next one.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mpnfs::fuse::ring_abi {

// FUSE_INIT flag (bit 41: flags2 bit 9): the daemon will serve requests
// through io_uring. The kernel offers it only while fuse.enable_uring is set.
constexpr uint64_t kOverIoUring = uint64_t{1} << 41;

constexpr size_t kInOutHeaderSize = 128;
constexpr size_t kOpInOutSize = 128;

struct EntInOut {
  uint64_t flags;
  uint64_t commit_id;  // to be quoted in the reply's COMMIT_AND_FETCH
  uint32_t payload_sz;
  uint32_t padding;
  uint64_t reserved;
};

struct ReqHeader {
  char in_out[kInOutHeaderSize];  // fuse_in_header / fuse_out_header
  char op_in[kOpInOutSize];       // the per-opcode header
  EntInOut ent_in_out;
};

// IORING_OP_URING_CMD command numbers (sqe->cmd_op).
constexpr uint32_t kCmdRegister = 1;
constexpr uint32_t kCmdCommitAndFetch = 2;

// In the 80-byte command area of a 128-byte SQE (IORING_SETUP_SQE128).
struct CmdReq {
  uint64_t flags;
  uint64_t commit_id;
  uint16_t qid;
  uint8_t padding[6];
};

static_assert(sizeof(EntInOut) == 32);
static_assert(sizeof(ReqHeader) == 288);
static_assert(sizeof(CmdReq) == 24);

}  // namespace mpnfs::fuse::ring_abi
