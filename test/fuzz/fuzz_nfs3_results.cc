// Fuzz target: each NFSv3 result the client decodes. The first byte picks
// the procedure; the rest is the result.
#include "proto/nfs3.h"
#include "test/fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mpnfs::proto;
  using namespace mpnfs::proto::nfs3;
  if (size == 0) return 0;
  const std::span<const char> b(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 16) {
    case 0: fuzz::DecodeStably(b, GetattrRes{}); break;
    case 1: fuzz::DecodeStably(b, WccRes{}); break;
    case 2: fuzz::DecodeStably(b, LookupRes{}); break;
    case 3: fuzz::DecodeStably(b, AccessRes{}); break;
    case 4: fuzz::DecodeStably(b, ReadlinkRes{}); break;
    case 5: fuzz::DecodeStably(b, ReadRes{}); break;
    case 6: fuzz::DecodeStably(b, WriteRes{}); break;
    case 7: fuzz::DecodeStably(b, CommitRes{}); break;
    case 8: fuzz::DecodeStably(b, NewObjectRes{}); break;
    case 9: fuzz::DecodeStably(b, RenameRes{}); break;
    case 10: fuzz::DecodeStably(b, LinkRes{}); break;
    case 11: fuzz::DecodeStably(b, FsstatRes{}); break;
    case 12: fuzz::DecodeStably(b, FsinfoRes{}); break;
    case 13: fuzz::DecodeStably(b, PathconfRes{}); break;
    default: {
      ReaddirRes plus;
      plus.plus = data[0] % 16 == 15;
      fuzz::DecodeStably(b, plus);
      break;
    }
  }
  return 0;
}
