// Fuzz target: the NLM v4 and NSM messages the gateway decodes, the
// server's results (nlm4_testres, nlm4_res, sm_stat_res) and the calls a
// server makes to a client (GRANTED's nlm4_testargs, SM_NOTIFY's
// stat_chge). The first byte picks which.
#include "proto/nlm4.h"
#include "proto/nsm.h"
#include "test/fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mpnfs::proto;
  if (size == 0) return 0;
  const std::span<const char> b(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 5) {
    case 0: fuzz::DecodeStably(b, nlm4::TestRes{}); break;
    case 1: fuzz::DecodeStably(b, nlm4::Res{}); break;
    case 2: fuzz::DecodeStably(b, nlm4::TestArgs{}); break;
    case 3: fuzz::DecodeStably(b, nsm::StatRes{}); break;
    default: fuzz::DecodeStably(b, nsm::StatChge{}); break;
  }
  return 0;
}
