// Fuzz target: each NFSv3 result the client decodes. The first byte picks
// the procedure (fuzz::WithNfs3Result); the rest is the result.
#include "test/fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mpnfs::proto;
  if (size == 0) return 0;
  const std::span<const char> b(reinterpret_cast<const char*>(data) + 1, size - 1);
  fuzz::WithNfs3Result(data[0], [&](const auto& blank) { fuzz::DecodeStably(b, blank); });
  return 0;
}
