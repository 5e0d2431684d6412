#include "proto/nsm.h"

namespace mpnfs::proto::nsm {
namespace {

template <class X>
bool XdrT(X& x, SmName& v) { return x.Bytes(v.mon_name, kStrMax); }

template <class X>
bool XdrT(X& x, MyId& v) {
  return x.Bytes(v.my_name, kStrMax) && x.I32(v.my_prog) && x.I32(v.my_vers) && x.I32(v.my_proc);
}

template <class X>
bool XdrT(X& x, MonId& v) { return x.Bytes(v.mon_name, kStrMax) && XdrT(x, v.my_id); }

template <class X>
bool XdrT(X& x, Mon& v) { return XdrT(x, v.mon_id) && x.Fixed(v.priv.data(), v.priv.size()); }

template <class X>
bool XdrT(X& x, StatChge& v) { return x.Bytes(v.mon_name, kStrMax) && x.I32(v.state); }

template <class X>
bool XdrT(X& x, StatRes& v) { return x.U32(v.res_stat) && x.I32(v.state); }

template <class X>
bool XdrT(X& x, State& v) { return x.I32(v.state); }

}  // namespace

bool Xdr(XdrIn& x, Void&) { return x.ok(); }
bool Xdr(XdrOut& x, Void&) { return x.ok(); }
bool Xdr(XdrIn& x, SmName& v) { return XdrT(x, v) && x.ok(); }
bool Xdr(XdrOut& x, SmName& v) { return XdrT(x, v) && x.ok(); }
bool Xdr(XdrIn& x, MyId& v) { return XdrT(x, v) && x.ok(); }
bool Xdr(XdrOut& x, MyId& v) { return XdrT(x, v) && x.ok(); }
bool Xdr(XdrIn& x, MonId& v) { return XdrT(x, v) && x.ok(); }
bool Xdr(XdrOut& x, MonId& v) { return XdrT(x, v) && x.ok(); }
bool Xdr(XdrIn& x, Mon& v) { return XdrT(x, v) && x.ok(); }
bool Xdr(XdrOut& x, Mon& v) { return XdrT(x, v) && x.ok(); }
bool Xdr(XdrIn& x, StatChge& v) { return XdrT(x, v) && x.ok(); }
bool Xdr(XdrOut& x, StatChge& v) { return XdrT(x, v) && x.ok(); }
bool Xdr(XdrIn& x, StatRes& v) { return XdrT(x, v) && x.ok(); }
bool Xdr(XdrOut& x, StatRes& v) { return XdrT(x, v) && x.ok(); }
bool Xdr(XdrIn& x, State& v) { return XdrT(x, v) && x.ok(); }
bool Xdr(XdrOut& x, State& v) { return XdrT(x, v) && x.ok(); }

}  // namespace mpnfs::proto::nsm
