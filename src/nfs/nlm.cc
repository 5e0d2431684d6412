#include "nfs/nlm.h"

#include <new>

#include "engine/engine.h"
#include "engine/rpc_call.h"

namespace mpnfs::nfs {
namespace {

namespace n4 = proto::nlm4;
using engine::CallOutcome;
using engine::CallStatus;

// One NLM call: its arguments (kept: the engine may send it again) and
// what to do with the result.
template <class Args, class Res>
class Call final : public engine::RpcCall {
 public:
  Call(const char* name, n4::Proc proc) : name_(name), proc_(proc) {}

  const char* Name() const override { return name_; }
  std::optional<Program> OtherProgram() const override { return Program{n4::kProgram, n4::kVersion, proc_}; }
  bool EncodeArgs(proto::XdrOut& x) override { return n4::Xdr(x, args); }
  bool DecodeResult(proto::XdrIn& x, void* result) override {
    static_assert(sizeof(Res) <= engine::kMaxResultSize && alignof(Res) <= alignof(std::max_align_t));
    auto* r = new (result) Res;
    if (n4::Xdr(x, *r)) return true;
    r->~Res();
    return false;
  }
  void DestroyResult(void* result) override { static_cast<Res*>(result)->~Res(); }
  void Complete(const CallOutcome& o) override {
    if (o.status != CallStatus::kOk) {
      return cb(Error::Errno(o.status == CallStatus::kShutdown ? ESHUTDOWN : ENOLCK,
                             std::string(name_) + ": " + std::string(o.error)));
    }
    cb(*static_cast<Res*>(o.result));
  }

  Args args;
  Cb<Res> cb;

 private:
  const char* const name_;
  const n4::Proc proc_;
};

}  // namespace

Nlm::Nlm(engine::Engine& engine, std::string caller_name, int32_t nsm_state)
    : engine_(engine), caller_name_(std::move(caller_name)), nsm_state_(nsm_state) {}

n4::Lock Nlm::Wire(const Fh& fh, const LockOwner& o, uint64_t offset, uint64_t length) const {
  return n4::Lock{caller_name_, fh, o.oh, o.svid, offset, length};
}

void Nlm::Test(const Fh& fh, const LockOwner& o, const LockRange& r, const Cred& c, Cb<n4::TestRes> cb) {
  auto call = std::make_shared<Call<n4::TestArgs, n4::TestRes>>("NLM4_TEST", n4::kTest);
  call->args = n4::TestArgs{"", r.exclusive, Wire(fh, o, r.offset, r.length)};
  call->cb = std::move(cb);
  engine_.Submit(call, c);
}

void Nlm::Lock(const Fh& fh, const LockOwner& o, const LockRange& r, bool reclaim, const Cred& c,
               Cb<n4::Stat> cb) {
  auto call = std::make_shared<Call<n4::LockArgs, n4::Res>>("NLM4_LOCK", n4::kLock);
  call->args = n4::LockArgs{"", false, r.exclusive, Wire(fh, o, r.offset, r.length), reclaim, nsm_state_};
  call->cb = [cb = std::move(cb)](Result<n4::Res> res) {
    if (!res) return cb(res.error());
    cb(res->stat);
  };
  engine_.Submit(call, c);
}

void Nlm::Unlock(const Fh& fh, const LockOwner& o, uint64_t offset, uint64_t length, const Cred& c,
                 Cb<n4::Stat> cb) {
  auto call = std::make_shared<Call<n4::UnlockArgs, n4::Res>>("NLM4_UNLOCK", n4::kUnlock);
  call->args = n4::UnlockArgs{"", Wire(fh, o, offset, length)};
  call->cb = [cb = std::move(cb)](Result<n4::Res> res) {
    if (!res) return cb(res.error());
    cb(res->stat);
  };
  engine_.Submit(call, c);
}

}  // namespace mpnfs::nfs
