#include "nfs/nlm.h"

#include <memory>

#include "engine/engine.h"
#include "engine/rpc_call.h"
#include "nfs/program_call.h"

namespace mpnfs::nfs {
namespace {

namespace n4 = proto::nlm4;
using engine::CallStatus;

// Submits one NLM call; its outcome goes to `cb`: the result, or ENOLCK
// (no answer) / ESHUTDOWN (the engine stopped) with the engine's detail.
template <class Args, class Res>
void Send(engine::Engine& engine, const char* name, n4::Proc proc, Args args, const Cred& c, Cb<Res> cb) {
  auto call = std::make_shared<ProgramCall<Args, Res>>(
      name, engine::RpcCall::Program{n4::kProgram, n4::kVersion, proc}, std::move(args),
      [name, cb = std::move(cb)](CallStatus st, std::string_view error, const Res* res) {
        if (res == nullptr) {
          return cb(Error::Errno(st == CallStatus::kShutdown ? ESHUTDOWN : ENOLCK,
                                 std::string(name) + ": " + std::string(error)));
        }
        cb(*res);
      });
  engine.Submit(call, c);
}

// LOCK's and UNLOCK's callers want the status alone.
Cb<n4::Res> StatOnly(Cb<n4::Stat> cb) {
  return [cb = std::move(cb)](Result<n4::Res> res) {
    if (!res) return cb(res.error());
    cb(res->stat);
  };
}

}  // namespace

Nlm::Nlm(engine::Engine& engine, std::string caller_name, int32_t nsm_state)
    : engine_(engine), caller_name_(std::move(caller_name)), nsm_state_(nsm_state) {}

n4::Lock Nlm::Wire(const Fh& fh, const LockOwner& o, uint64_t offset, uint64_t length) const {
  return n4::Lock{caller_name_, fh, o.oh, o.svid, offset, length};
}

void Nlm::Test(const Fh& fh, const LockOwner& o, const LockRange& r, const Cred& c, Cb<n4::TestRes> cb) {
  Send<n4::TestArgs, n4::TestRes>(engine_, "NLM4_TEST", n4::kTest,
                                  n4::TestArgs{"", r.exclusive, Wire(fh, o, r.offset, r.length)}, c, std::move(cb));
}

void Nlm::Lock(const Fh& fh, const LockOwner& o, const LockRange& r, bool reclaim, const Cred& c,
               Cb<n4::Stat> cb) {
  Send<n4::LockArgs, n4::Res>(engine_, "NLM4_LOCK", n4::kLock,
                              n4::LockArgs{"", false, r.exclusive, Wire(fh, o, r.offset, r.length), reclaim, nsm_state_},
                              c, StatOnly(std::move(cb)));
}

void Nlm::Unlock(const Fh& fh, const LockOwner& o, uint64_t offset, uint64_t length, const Cred& c,
                 Cb<n4::Stat> cb) {
  Send<n4::UnlockArgs, n4::Res>(engine_, "NLM4_UNLOCK", n4::kUnlock, n4::UnlockArgs{"", Wire(fh, o, offset, length)},
                                c, StatOnly(std::move(cb)));
}

}  // namespace mpnfs::nfs
