// What every fuzz target checks of a decoder: whatever the bytes, it never
// reads out of bounds (ASan), never hits undefined behaviour (UBSan), never
// aborts; and what decodes encodes back to bytes that decode to the same.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "proto/nfs3.h"
#include "proto/xdr.h"

namespace mpnfs::proto::fuzz {

template <class T>
void DecodeStably(std::span<const char> bytes, const T& blank) {
  XdrIn in(bytes);
  T got = blank;
  if (!Xdr(in, got)) return;
  std::vector<char> buf(in.pos() + 64);
  XdrOut out(buf);
  T copy = got;
  if (!Xdr(out, copy)) __builtin_trap();  // a decoded message must encode
  XdrIn again(out.bytes());
  T got2 = blank;
  if (!Xdr(again, got2) || !(got2 == got)) __builtin_trap();
}

// Calls f with a blank of the NFSv3 result that fuzz_nfs3_results' first
// byte selects (also how test/fuzz/captured/fuzz_nfs3_results is read).
template <class F>
void WithNfs3Result(uint8_t selector, F&& f) {
  using namespace nfs3;
  switch (selector % 16) {
    case 0: f(GetattrRes{}); break;
    case 1: f(WccRes{}); break;
    case 2: f(LookupRes{}); break;
    case 3: f(AccessRes{}); break;
    case 4: f(ReadlinkRes{}); break;
    case 5: f(ReadRes{}); break;
    case 6: f(WriteRes{}); break;
    case 7: f(CommitRes{}); break;
    case 8: f(NewObjectRes{}); break;
    case 9: f(RenameRes{}); break;
    case 10: f(LinkRes{}); break;
    case 11: f(FsstatRes{}); break;
    case 12: f(FsinfoRes{}); break;
    case 13: f(PathconfRes{}); break;
    default: {
      ReaddirRes blank;
      blank.plus = selector % 16 == 15;  // 14: READDIR, 15: READDIRPLUS
      f(blank);
      break;
    }
  }
}

}  // namespace mpnfs::proto::fuzz
