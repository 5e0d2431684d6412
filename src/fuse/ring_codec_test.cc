#include "fuse/ring_codec.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace mpnfs::fuse {
namespace {

// A ring entry's two buffers, the payload with kRingPrefix bytes before it.
struct Slot {
  explicit Slot(size_t cap) : area(kRingPrefix + cap, '\xee'), cap(cap) {}
  char* payload() { return area.data() + kRingPrefix; }
  ring_abi::ReqHeader hdr{};
  std::vector<char> area;
  size_t cap;
};

void PutRequest(Slot& s, uint32_t opcode, uint64_t unique, const void* op, size_t op_size,
                const std::string& payload) {
  fuse_in_header in{};
  in.opcode = opcode;
  in.unique = unique;
  in.nodeid = 7;
  in.len = static_cast<uint32_t>(sizeof(in) + op_size + payload.size());
  memcpy(s.hdr.in_out, &in, sizeof(in));
  if (op_size > 0) memcpy(s.hdr.op_in, op, op_size);
  if (!payload.empty()) memcpy(s.payload(), payload.data(), payload.size());
  s.hdr.ent_in_out.payload_sz = static_cast<uint32_t>(payload.size());
  s.hdr.ent_in_out.commit_id = unique;
}

TEST(RingCodecTest, AWriteIsLaidOutAsTheDeviceDeliversItWithItsDataWhereTheKernelPutIt) {
  Slot s(1 << 20);
  fuse_write_in w{};
  w.fh = 42;
  w.offset = 8192;
  w.size = 4096;
  const std::string data(4096, 'x');
  PutRequest(s, FUSE_WRITE, 99, &w, sizeof(w), data);

  auto r = ComposeRequest(s.hdr, s.payload(), s.cap);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->size, sizeof(fuse_in_header) + sizeof(w) + data.size());
  // The payload is not moved: the header and fuse_write_in end where it starts.
  EXPECT_EQ(r->data + sizeof(fuse_in_header) + sizeof(w), s.payload());
  fuse_in_header in;
  memcpy(&in, r->data, sizeof(in));
  EXPECT_EQ(in.opcode, FUSE_WRITE);
  EXPECT_EQ(in.unique, 99u);
  EXPECT_EQ(in.len, r->size);
  fuse_write_in got;
  memcpy(&got, r->data + sizeof(in), sizeof(got));
  EXPECT_EQ(got.fh, 42u);
  EXPECT_EQ(got.offset, 8192u);
  EXPECT_EQ(std::string(r->data + sizeof(in) + sizeof(got), data.size()), data);
}

TEST(RingCodecTest, ALookupHasNoPerOpcodeHeaderAndItsNameInThePayload) {
  Slot s(8192);
  const std::string name("some-file", 10);  // with its NUL
  PutRequest(s, FUSE_LOOKUP, 5, nullptr, 0, name);
  auto r = ComposeRequest(s.hdr, s.payload(), s.cap);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->size, sizeof(fuse_in_header) + name.size());
  EXPECT_EQ(std::string(r->data + sizeof(fuse_in_header), name.size()), name);
}

TEST(RingCodecTest, LengthsThatDoNotAddUpAreRefused) {
  Slot s(8192);
  fuse_read_in rd{};
  PutRequest(s, FUSE_READ, 1, &rd, sizeof(rd), "");
  fuse_in_header in;
  memcpy(&in, s.hdr.in_out, sizeof(in));

  // fuse_in_header.len shorter than the header and payload it came with.
  s.hdr.ent_in_out.payload_sz = 64;
  in.len = sizeof(in) + 10;
  memcpy(s.hdr.in_out, &in, sizeof(in));
  EXPECT_FALSE(ComposeRequest(s.hdr, s.payload(), s.cap).has_value());

  // A per-opcode header over the 128 bytes the ring has for it.
  s.hdr.ent_in_out.payload_sz = 0;
  in.len = sizeof(in) + ring_abi::kOpInOutSize + 1;
  memcpy(s.hdr.in_out, &in, sizeof(in));
  EXPECT_FALSE(ComposeRequest(s.hdr, s.payload(), s.cap).has_value());

  // A payload over the buffer.
  s.hdr.ent_in_out.payload_sz = 8193;
  in.len = sizeof(in) + 8193;
  memcpy(s.hdr.in_out, &in, sizeof(in));
  EXPECT_FALSE(ComposeRequest(s.hdr, s.payload(), s.cap).has_value());
}

TEST(RingCodecTest, AReplyGoesToTheHeaderAndItsArgumentsOneAfterAnotherIntoThePayload) {
  Slot s(8192);
  fuse_out_header out{};
  out.unique = 77;
  fuse_attr_out attr{};
  attr.attr.ino = 3;
  const std::string extra = "tail";
  iovec iov[3] = {{&out, sizeof(out)}, {&attr, sizeof(attr)}, {const_cast<char*>(extra.data()), extra.size()}};
  ASSERT_TRUE(PackReply(iov, 3, &s.hdr, s.payload(), s.cap));

  fuse_out_header got;
  memcpy(&got, s.hdr.in_out, sizeof(got));
  EXPECT_EQ(got.unique, 77u);
  EXPECT_EQ(got.error, 0);
  EXPECT_EQ(got.len, sizeof(out) + sizeof(attr) + extra.size());
  EXPECT_EQ(s.hdr.ent_in_out.payload_sz, sizeof(attr) + extra.size());
  fuse_attr_out a;
  memcpy(&a, s.payload(), sizeof(a));
  EXPECT_EQ(a.attr.ino, 3u);
  EXPECT_EQ(std::string(s.payload() + sizeof(attr), extra.size()), extra);
}

TEST(RingCodecTest, AnErrorReplyHasNoPayload) {
  Slot s(8192);
  fuse_out_header out{};
  out.unique = 8;
  out.error = -ENOENT;
  iovec iov{&out, sizeof(out)};
  ASSERT_TRUE(PackReply(&iov, 1, &s.hdr, s.payload(), s.cap));
  fuse_out_header got;
  memcpy(&got, s.hdr.in_out, sizeof(got));
  EXPECT_EQ(got.error, -ENOENT);
  EXPECT_EQ(s.hdr.ent_in_out.payload_sz, 0u);
}

TEST(RingCodecTest, AReplyLargerThanThePayloadBufferGoesBackAsEio) {
  Slot s(8192);
  fuse_out_header out{};
  out.unique = 9;
  std::vector<char> big(8193, 'b');
  iovec iov[2] = {{&out, sizeof(out)}, {big.data(), big.size()}};
  EXPECT_FALSE(PackReply(iov, 2, &s.hdr, s.payload(), s.cap));
  fuse_out_header got;
  memcpy(&got, s.hdr.in_out, sizeof(got));
  EXPECT_EQ(got.unique, 9u);
  EXPECT_EQ(got.error, -EIO);
  EXPECT_EQ(got.len, sizeof(out));
  EXPECT_EQ(s.hdr.ent_in_out.payload_sz, 0u);
  EXPECT_EQ(s.payload()[0], '\xee');  // nothing of it was copied
}

}  // namespace
}  // namespace mpnfs::fuse
