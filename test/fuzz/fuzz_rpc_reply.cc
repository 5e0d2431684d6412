// Fuzz target: an ONC RPC reply header (and a call header).
#include "proto/rpc.h"
#include "test/fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mpnfs::proto;
  const std::span<const char> bytes(reinterpret_cast<const char*>(data), size);
  fuzz::DecodeStably(bytes, ReplyHeader{});
  fuzz::DecodeStably(bytes, CallHeader{});
  return 0;
}
