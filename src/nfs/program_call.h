// ProgramCall: one call of a program other than NFSv3 (MOUNT, PORTMAP,
// NSM: nfs/mount3.h; NLM: nfs/nlm.h) as an engine::RpcCall.
//
// It keeps its arguments (the engine may send the call again) and codes
// them and its result with the program's own codec from proto/ (the Xdr
// overloads of the argument and result types, found by argument-dependent
// lookup). Its outcome goes to `done`, exactly once, on the engine loop
// thread that ends the call (must not block): the status, the engine's
// detail for a failure, and the decoded result for kOk (null otherwise;
// valid only during `done`: it points into the receive buffer).
//
// Thread safety: as engine::RpcCall.
#pragma once

#include <cstddef>
#include <functional>
#include <new>
#include <optional>
#include <string_view>
#include <utility>

#include "engine/rpc_call.h"
#include "proto/xdr.h"

namespace mpnfs::nfs {

template <class Args, class Res>
class ProgramCall final : public engine::RpcCall {
 public:
  using Done = std::function<void(engine::CallStatus, std::string_view error, const Res* res)>;

  ProgramCall(const char* name, Program program, Args args, Done done)
      : name_(name), program_(program), args_(std::move(args)), done_(std::move(done)) {}

  const char* Name() const override { return name_; }
  std::optional<Program> OtherProgram() const override { return program_; }
  bool EncodeArgs(proto::XdrOut& x) override {
    return Xdr(x, args_);
  }
  bool DecodeResult(proto::XdrIn& x, void* result) override {
    static_assert(sizeof(Res) <= engine::kMaxResultSize && alignof(Res) <= alignof(std::max_align_t));
    auto* r = new (result) Res;
    if (Xdr(x, *r)) return true;
    r->~Res();
    return false;
  }
  void DestroyResult(void* result) override { static_cast<Res*>(result)->~Res(); }
  void Complete(const engine::CallOutcome& o) override {
    done_(o.status, o.error, o.status == engine::CallStatus::kOk ? static_cast<const Res*>(o.result) : nullptr);
  }

 private:
  const char* const name_;
  const Program program_;
  Args args_;  // (the codecs' encoders take their value by reference)
  const Done done_;
};

}  // namespace mpnfs::nfs
