// XDR (RFC 4506) in and out of memory: the primitives every codec in this
// folder is built from.
//
// One shape, two directions. A codec is a function template over the
// stream, `template <class X> bool Xdr(X& x, T& t)`, as the classic XDR
// routines were: with an XdrOut it writes `t`, with an XdrIn it fills `t`
// in. Both streams take the same calls (U32, U64, Bool, Bytes, View, ...),
// so a type's wire shape is written once, and encode-then-decode equals
// the input by construction. XdrOut only reads what it is given (a codec
// may be handed a const object cast to non-const for encoding).
//
// Buffers. Both streams work on memory their caller owns and never
// allocate. XdrOut writes into a fixed span; XdrIn reads one and never
// copies: View() returns the bytes of an opaque or string in place, valid
// as long as the buffer. Bytes() copies into a std::string (handles, names).
//
// Bounds. Every length read from the wire is checked, before it is used,
// against the maximum the codec gives and against the bytes left. A failed
// read or write makes the stream fail for good (ok() false) and every later
// call a no-op returning false: a codec may check once, at its end. Nothing
// here aborts or throws; a malformed message is an error value. (Lengths
// are added in 64 bits: no wrap on a 32-bit size_t either.)
//
// Threads: a stream is used by one thread at a time.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace mpnfs::proto {

inline constexpr size_t Pad4(size_t n) { return (4 - n % 4) % 4; }

class XdrOut {
 public:
  static constexpr bool kDecoding = false;
  explicit XdrOut(std::span<char> buf) : buf_(buf) {}

  bool U32(const uint32_t& v) {
    if (!Room(4)) return false;
    Put32(v);
    return true;
  }
  bool I32(const int32_t& v) { return U32(static_cast<uint32_t>(v)); }
  bool U64(const uint64_t& v) { return U32(static_cast<uint32_t>(v >> 32)) && U32(static_cast<uint32_t>(v)); }
  bool Bool(const bool& b) { return U32(b ? 1u : 0u); }
  // A fixed-length opaque of `n` bytes, padded.
  bool Fixed(const void* p, size_t n) {
    if (!Room(uint64_t{n} + Pad4(n))) return false;
    if (n > 0) std::memcpy(buf_.data() + pos_, p, n);  // (an empty view may have no data pointer)
    if (Pad4(n) > 0) std::memset(buf_.data() + pos_ + n, 0, Pad4(n));
    pos_ += n + Pad4(n);
    return true;
  }
  // A variable-length opaque or string of at most `max` bytes: its length,
  // then its bytes, padded.
  bool View(const std::string_view& v, uint32_t max) {
    if (v.size() > max) return Fail();
    return U32(static_cast<uint32_t>(v.size())) && Fixed(v.data(), v.size());
  }
  bool Bytes(const std::string& s, uint32_t max) { return View(std::string_view(s), max); }
  // Only the length of a variable-length opaque whose bytes the caller
  // sends itself (WRITE's data goes from the application's buffer).
  bool LengthOnly(uint32_t n, uint32_t max) { return n <= max ? U32(n) : Fail(); }

  bool ok() const { return ok_; }
  size_t size() const { return pos_; }
  std::span<const char> bytes() const { return {buf_.data(), pos_}; }
  bool Fail() { return ok_ = false; }

 private:
  bool Room(uint64_t n) {
    if (!ok_ || uint64_t{buf_.size() - pos_} < n) return Fail();
    return true;
  }
  void Put32(uint32_t v) {
    auto* p = reinterpret_cast<unsigned char*>(buf_.data() + pos_);
    p[0] = static_cast<unsigned char>(v >> 24);
    p[1] = static_cast<unsigned char>(v >> 16);
    p[2] = static_cast<unsigned char>(v >> 8);
    p[3] = static_cast<unsigned char>(v);
    pos_ += 4;
  }

  std::span<char> buf_;
  size_t pos_ = 0;
  bool ok_ = true;
};

class XdrIn {
 public:
  static constexpr bool kDecoding = true;
  explicit XdrIn(std::span<const char> buf) : buf_(buf) {}

  bool U32(uint32_t& v) {
    if (!Have(4)) return false;
    const auto* p = reinterpret_cast<const unsigned char*>(buf_.data() + pos_);
    v = uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | uint32_t{p[3]};
    pos_ += 4;
    return true;
  }
  bool I32(int32_t& v) {
    uint32_t u = 0;
    if (!U32(u)) return false;
    v = static_cast<int32_t>(u);
    return true;
  }
  bool U64(uint64_t& v) {
    uint32_t hi = 0, lo = 0;
    if (!U32(hi) || !U32(lo)) return false;
    v = uint64_t{hi} << 32 | lo;
    return true;
  }
  // RFC 4506 booleans are 0 or 1; any other value is read as true, as
  // rpcgen's xdr_bool does (a server's sloppy word must not fail a reply).
  bool Bool(bool& b) {
    uint32_t u = 0;
    if (!U32(u)) return false;
    b = u != 0;
    return true;
  }
  bool Fixed(void* p, size_t n) {
    if (!ok_ || uint64_t{buf_.size() - pos_} < uint64_t{n} + Pad4(n)) return Fail();
    if (n > 0) std::memcpy(p, buf_.data() + pos_, n);
    pos_ += n + Pad4(n);
    return true;
  }
  // A variable-length opaque or string of at most `max` bytes, in place.
  bool View(std::string_view& v, uint32_t max) {
    uint32_t n = 0;
    if (!U32(n)) return false;
    if (n > max || uint64_t{buf_.size() - pos_} < uint64_t{n} + Pad4(n)) return Fail();
    v = std::string_view(buf_.data() + pos_, n);
    pos_ += n + Pad4(n);
    return true;
  }
  bool Bytes(std::string& s, uint32_t max) {
    std::string_view v;
    if (!View(v, max)) return false;
    s.assign(v);
    return true;
  }

  bool ok() const { return ok_; }
  size_t pos() const { return pos_; }
  size_t left() const { return buf_.size() - pos_; }
  bool Fail() { return ok_ = false; }

 private:
  bool Have(size_t n) {
    if (!ok_ || buf_.size() - pos_ < n) return Fail();
    return true;
  }

  std::span<const char> buf_;
  size_t pos_ = 0;
  bool ok_ = true;
};

// An XDR optional (`*T` in the spec: a bool, then the value if true).
template <class X, class T, class F>
bool Optional(X& x, std::optional<T>& v, F&& value) {
  bool present = v.has_value();
  if (!x.Bool(present)) return false;
  if (!present) {
    if constexpr (X::kDecoding) v.reset();
    return true;
  }
  if constexpr (X::kDecoding) v.emplace();
  return value(x, *v);
}

}  // namespace mpnfs::proto
