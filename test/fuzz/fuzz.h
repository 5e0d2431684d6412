// What every fuzz target checks of a decoder: whatever the bytes, it never
// reads out of bounds (ASan), never hits undefined behaviour (UBSan), never
// aborts; and what decodes encodes back to bytes that decode to the same.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

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

}  // namespace mpnfs::proto::fuzz
