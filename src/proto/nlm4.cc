#include "proto/nlm4.h"

#include <cerrno>

#include <fmt/format.h>

namespace mpnfs::proto::nlm4 {
namespace {

template <class X>
bool XdrStat(X& x, Stat& s) {
  uint32_t v = static_cast<uint32_t>(s);
  if (!x.U32(v)) return false;
  s = static_cast<Stat>(v);
  return true;
}

template <class X>
bool XdrT(X& x, Lock& l) {
  return x.Bytes(l.caller_name, kStrMax) && x.Bytes(l.fh, kFhMax) && x.Bytes(l.oh, kObjMax) &&
         x.I32(l.svid) && x.U64(l.offset) && x.U64(l.length);
}

template <class X>
bool XdrT(X& x, Holder& h) {
  return x.Bool(h.exclusive) && x.I32(h.svid) && x.Bytes(h.oh, kObjMax) && x.U64(h.offset) &&
         x.U64(h.length);
}

template <class X>
bool XdrT(X& x, TestArgs& a) {
  return x.Bytes(a.cookie, kObjMax) && x.Bool(a.exclusive) && XdrT(x, a.lock);
}

template <class X>
bool XdrT(X& x, LockArgs& a) {
  return x.Bytes(a.cookie, kObjMax) && x.Bool(a.block) && x.Bool(a.exclusive) && XdrT(x, a.lock) &&
         x.Bool(a.reclaim) && x.I32(a.state);
}

template <class X>
bool XdrT(X& x, CancelArgs& a) {
  return x.Bytes(a.cookie, kObjMax) && x.Bool(a.block) && x.Bool(a.exclusive) && XdrT(x, a.lock);
}

template <class X>
bool XdrT(X& x, UnlockArgs& a) { return x.Bytes(a.cookie, kObjMax) && XdrT(x, a.lock); }

template <class X>
bool XdrT(X& x, Res& r) { return x.Bytes(r.cookie, kObjMax) && XdrStat(x, r.stat); }

template <class X>
bool XdrT(X& x, TestRes& r) {
  if (!x.Bytes(r.cookie, kObjMax) || !XdrStat(x, r.stat)) return false;
  if (r.stat != Stat::kDenied) {
    if constexpr (X::kDecoding) r.holder = Holder{};
    return true;
  }
  return XdrT(x, r.holder);
}

template <class X>
bool XdrT(X& x, Notify& n) { return x.Bytes(n.name, kStrMax) && x.I32(n.state); }

}  // namespace

int ErrnoOf(Stat s) {
  switch (s) {
    case Stat::kGranted: return 0;
    case Stat::kDenied: return EAGAIN;
    case Stat::kDeadlock: return EDEADLK;
    case Stat::kReadOnlyFs: return EROFS;
    case Stat::kStaleFh: return ESTALE;
    case Stat::kFileTooBig: return EOVERFLOW;
    default: return ENOLCK;
  }
}

std::string StatName(Stat s) {
  static constexpr const char* kNames[] = {
      "NLM4_GRANTED", "NLM4_DENIED", "NLM4_DENIED_NOLOCKS", "NLM4_BLOCKED", "NLM4_DENIED_GRACE_PERIOD",
      "NLM4_DEADLCK", "NLM4_ROFS", "NLM4_STALE_FH", "NLM4_FBIG", "NLM4_FAILED"};
  const auto v = static_cast<uint32_t>(s);
  return v < std::size(kNames) ? kNames[v] : fmt::format("nlm4_stats {}", v);
}

bool Xdr(XdrIn& x, Lock& v) { return XdrT(x, v) && x.ok(); }
bool Xdr(XdrOut& x, Lock& v) { return XdrT(x, v) && x.ok(); }
bool Xdr(XdrIn& x, TestArgs& v) { return XdrT(x, v) && x.ok(); }
bool Xdr(XdrOut& x, TestArgs& v) { return XdrT(x, v) && x.ok(); }
bool Xdr(XdrIn& x, LockArgs& v) { return XdrT(x, v) && x.ok(); }
bool Xdr(XdrOut& x, LockArgs& v) { return XdrT(x, v) && x.ok(); }
bool Xdr(XdrIn& x, CancelArgs& v) { return XdrT(x, v) && x.ok(); }
bool Xdr(XdrOut& x, CancelArgs& v) { return XdrT(x, v) && x.ok(); }
bool Xdr(XdrIn& x, UnlockArgs& v) { return XdrT(x, v) && x.ok(); }
bool Xdr(XdrOut& x, UnlockArgs& v) { return XdrT(x, v) && x.ok(); }
bool Xdr(XdrIn& x, Res& v) { return XdrT(x, v) && x.ok(); }
bool Xdr(XdrOut& x, Res& v) { return XdrT(x, v) && x.ok(); }
bool Xdr(XdrIn& x, TestRes& v) { return XdrT(x, v) && x.ok(); }
bool Xdr(XdrOut& x, TestRes& v) { return XdrT(x, v) && x.ok(); }
bool Xdr(XdrIn& x, Notify& v) { return XdrT(x, v) && x.ok(); }
bool Xdr(XdrOut& x, Notify& v) { return XdrT(x, v) && x.ok(); }

}  // namespace mpnfs::proto::nlm4
