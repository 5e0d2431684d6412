// Fuzz target: the MOUNT v3 and PORTMAP GETPORT results (the first byte's
// low bit picks which).
#include "proto/mount3.h"
#include "test/fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mpnfs::proto;
  if (size == 0) return 0;
  const std::span<const char> b(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 1) {
    fuzz::DecodeStably(b, mount3::MntRes{});
  } else {
    fuzz::DecodeStably(b, portmap::GetportRes{});
  }
  return 0;
}
