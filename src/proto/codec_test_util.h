// Helpers of the codec tests: a message encoded to bytes, a round trip
// with every truncation, and bytes laid out by hand word by word.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "proto/xdr.h"

namespace mpnfs::proto {

// A message as bytes, and a check that it decodes back to itself.
template <class T>
std::vector<char> Encode(const T& v) {
  std::vector<char> buf(1 << 20);
  XdrOut out(buf);
  T copy = v;
  EXPECT_TRUE(Xdr(out, copy));
  buf.resize(out.size());
  return buf;
}

template <class T>
void ExpectRoundTrip(const T& v, T blank = T{}) {
  const std::vector<char> bytes = Encode(v);
  ASSERT_EQ(bytes.size() % 4, 0u);
  XdrIn in(bytes);
  T got = blank;
  ASSERT_TRUE(Xdr(in, got)) << "does not decode";
  EXPECT_EQ(in.left(), 0u) << "not all of it was read";
  EXPECT_TRUE(got == v) << "decodes to something else";
  // Every truncation fails, never reads past the end (ASan watches).
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<char> cut(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(n));
    XdrIn c(cut);
    T t = blank;
    EXPECT_FALSE(Xdr(c, t)) << "a message cut to " << n << " of " << bytes.size() << " bytes decodes";
  }
}

// Bytes laid out by hand from the specification's definitions, word by word: the
// codecs' field order checked against the text, not against themselves.
struct Words {
  std::vector<char> b;
  Words& W(uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<char>(v >> s));
    return *this;
  }
  Words& H(uint64_t v) { return W(static_cast<uint32_t>(v >> 32)).W(static_cast<uint32_t>(v)); }
  Words& Str(const std::string& s) {  // length, bytes, zero padding
    W(static_cast<uint32_t>(s.size()));
    b.insert(b.end(), s.begin(), s.end());
    while (b.size() % 4) b.push_back(0);
    return *this;
  }
};

}  // namespace mpnfs::proto
