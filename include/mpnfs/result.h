// Result<T>: a value or an Error carrying the errno the kernel will see.
//
// The whole gateway reports failures this way instead of throwing: a failure
// travels from the NFS reply (or the engine's timeout) up to the FUSE reply
// unchanged, so the errno the application sees is decided where the failure
// is understood, together with a message for the log.
//
// Thread safety: plain values; no shared state.
#pragma once

#include <cerrno>
#include <string>
#include <utility>
#include <variant>

namespace mpnfs {

struct Error {
  int err = EIO;     // positive errno reported to the caller
  std::string what;  // context for logs and command-line messages

  static Error Errno(int e, std::string what = {}) { return Error{e, std::move(what)}; }
};

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T v) : v_(std::move(v)) {}          // NOLINT: implicit by design
  Result(Error e) : v_(std::move(e)) {}      // NOLINT: implicit by design

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

// Result<void> equivalent.
struct Ok {};
using Status = Result<Ok>;

}  // namespace mpnfs
