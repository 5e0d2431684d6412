#include "proto/rpc.h"

#include <fmt/format.h>

namespace mpnfs::proto {
namespace {

template <class X>
bool Xdr(X& x, AuthSys& a) {
  if (!x.U32(a.stamp) || !x.Bytes(a.machine, 255) || !x.U32(a.uid) || !x.U32(a.gid)) return false;
  uint32_t n = static_cast<uint32_t>(a.groups.size());
  if (!x.U32(n)) return false;
  if (n > kMaxAuthGroups) return x.Fail();
  if constexpr (X::kDecoding) a.groups.assign(n, 0);
  for (uint32_t& g : a.groups) {
    if (!x.U32(g)) return false;
  }
  return true;
}

// An opaque_auth whose body the codec does not care about (a reply's
// verifier): skipped on decoding, written empty (AUTH_NONE) on encoding.
bool SkipAuth(XdrIn& x) {
  uint32_t flavor = 0;
  std::string_view body;
  return x.U32(flavor) && x.View(body, kMaxAuthBytes);
}
bool SkipAuth(XdrOut& x) { return x.U32(kAuthNone) && x.U32(0); }

}  // namespace

template <class X>
bool Xdr(X& x, CallHeader& h) {
  uint32_t type = kMsgCall, rpcvers = kRpcVersion;
  if (!x.U32(h.xid) || !x.U32(type) || !x.U32(rpcvers) || !x.U32(h.prog) || !x.U32(h.vers) || !x.U32(h.proc)) {
    return false;
  }
  if (type != kMsgCall || rpcvers != kRpcVersion) return x.Fail();
  uint32_t flavor = h.auth_sys ? kAuthSys : kAuthNone;
  if (!x.U32(flavor)) return false;
  if constexpr (X::kDecoding) {
    std::string_view body;
    if (!x.View(body, kMaxAuthBytes)) return false;
    h.auth_sys = flavor == kAuthSys;
    if (h.auth_sys) {
      XdrIn in(std::span<const char>(body.data(), body.size()));
      if (!Xdr(in, h.cred)) return x.Fail();
    } else {
      h.cred = AuthSys{};
    }
  } else {
    if (h.auth_sys) {
      // The body's length first: encoded into the room after the word.
      char body[kMaxAuthBytes];
      XdrOut out(body);
      if (!Xdr(out, h.cred)) return x.Fail();
      if (!x.View(std::string_view(body, out.size()), kMaxAuthBytes)) return false;
    } else if (!x.U32(0)) {
      return false;
    }
  }
  // The verifier: AUTH_NONE.
  uint32_t vflavor = kAuthNone;
  std::string_view vbody;
  if (!x.U32(vflavor) || !x.View(vbody, kMaxAuthBytes)) return false;
  return x.ok();
}

template <class X>
bool Xdr(X& x, ReplyHeader& h) {
  uint32_t type = kMsgReply, stat = h.accepted ? kMsgAccepted : kMsgDenied;
  if (!x.U32(h.xid) || !x.U32(type) || !x.U32(stat)) return false;
  if (type != kMsgReply || (stat != kMsgAccepted && stat != kMsgDenied)) return x.Fail();
  h.accepted = stat == kMsgAccepted;
  if (h.accepted) {
    uint32_t a = static_cast<uint32_t>(h.accept);
    if (!SkipAuth(x) || !x.U32(a)) return false;
    if (a > static_cast<uint32_t>(AcceptStat::kSystemErr)) return x.Fail();
    h.accept = static_cast<AcceptStat>(a);
    if (h.accept == AcceptStat::kProgMismatch) return x.U32(h.low) && x.U32(h.high);
    return x.ok();
  }
  uint32_t r = static_cast<uint32_t>(h.reject);
  if (!x.U32(r)) return false;
  if (r > static_cast<uint32_t>(RejectStat::kAuthError)) return x.Fail();
  h.reject = static_cast<RejectStat>(r);
  if (h.reject == RejectStat::kRpcMismatch) return x.U32(h.low) && x.U32(h.high);
  return x.U32(h.auth_stat);
}

template bool Xdr(XdrIn&, CallHeader&);
template bool Xdr(XdrOut&, CallHeader&);
template bool Xdr(XdrIn&, ReplyHeader&);
template bool Xdr(XdrOut&, ReplyHeader&);

std::string Describe(const ReplyHeader& h) {
  if (h.accepted) {
    switch (h.accept) {
      case AcceptStat::kSuccess: return "success";
      case AcceptStat::kProgUnavail: return "program unavailable (PROG_UNAVAIL)";
      case AcceptStat::kProgMismatch:
        return fmt::format("program version mismatch (PROG_MISMATCH: versions {} to {} served)", h.low, h.high);
      case AcceptStat::kProcUnavail: return "procedure unavailable (PROC_UNAVAIL)";
      case AcceptStat::kGarbageArgs: return "garbage arguments (GARBAGE_ARGS)";
      case AcceptStat::kSystemErr: return "system error (SYSTEM_ERR)";
    }
  }
  if (h.reject == RejectStat::kRpcMismatch) {
    return fmt::format("RPC version mismatch (RPC_MISMATCH: versions {} to {})", h.low, h.high);
  }
  static constexpr const char* kAuth[] = {
      "authenticated (AUTH_OK)", "bad credentials (AUTH_BADCRED)", "credentials rejected (AUTH_REJECTEDCRED)",
      "bad verifier (AUTH_BADVERF)", "verifier rejected (AUTH_REJECTEDVERF)", "authentication too weak (AUTH_TOOWEAK)",
      "bad response verifier (AUTH_INVALIDRESP)", "authentication failed (AUTH_FAILED)"};
  return h.auth_stat < std::size(kAuth) ? fmt::format("denied: {}", kAuth[h.auth_stat])
                                        : fmt::format("denied: authentication error {}", h.auth_stat);
}

}  // namespace mpnfs::proto
