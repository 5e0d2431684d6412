// Fuzz target: READDIR and READDIRPLUS results alone (the longest and most
// nested replies); the first byte's low bit picks READDIRPLUS.
#include "proto/nfs3.h"
#include "test/fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mpnfs::proto;
  if (size == 0) return 0;
  nfs3::ReaddirRes blank;
  blank.plus = data[0] & 1;
  fuzz::DecodeStably(std::span<const char>(reinterpret_cast<const char*>(data) + 1, size - 1), blank);
  return 0;
}
