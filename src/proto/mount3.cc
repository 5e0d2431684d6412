#include "proto/mount3.h"

#include <cerrno>

#include <fmt/format.h>

namespace mpnfs::proto {
namespace mount3 {
namespace {

template <class X>
bool XdrT(X& x, MntArgs& a) { return x.Bytes(a.path, 1024) && x.ok(); }

template <class X>
bool XdrT(X& x, MntRes& r) {
  if (!x.U32(r.status)) return false;
  if (r.status != kOk) return x.ok();
  if (!x.Bytes(r.fh, 64)) return false;
  uint32_t n = static_cast<uint32_t>(r.flavors.size());
  if (!x.U32(n)) return false;
  if (n > 16) return x.Fail();
  if constexpr (X::kDecoding) r.flavors.assign(n, 0);
  for (uint32_t& f : r.flavors) {
    if (!x.U32(f)) return false;
  }
  return x.ok();
}

}  // namespace

bool Xdr(XdrIn& x, MntArgs& a) { return XdrT(x, a); }
bool Xdr(XdrOut& x, MntArgs& a) { return XdrT(x, a); }
bool Xdr(XdrIn& x, MntRes& r) { return XdrT(x, r); }
bool Xdr(XdrOut& x, MntRes& r) { return XdrT(x, r); }

int ErrnoOf(uint32_t status) {
  switch (status) {
    case 1: return EPERM;
    case 2: return ENOENT;
    case 13: return EACCES;
    case 20: return ENOTDIR;
    case 22: return EINVAL;
    case 63: return ENAMETOOLONG;
    case 10004: return EOPNOTSUPP;
    default: return EIO;
  }
}

std::string Explain(uint32_t status) {
  switch (status) {
    case 2: return "the server does not export this path (no such export)";
    // NFS-Ganesha answers ACCES for a path it does not export at all.
    case 13: return "not exported to this client, or access denied by the export list";
    case 1: return "not permitted by the server";
    case 20: return "export path is not a directory";
    case 22: return "the server finds the export path invalid";
    case 63: return "export path too long";
    case 10004: return "the MOUNT operation is not supported by the server";
    case 10006: return "the server failed (MNT3ERR_SERVERFAULT)";
    default: return fmt::format("MOUNT failed (mountstat3 {})", status);
  }
}

}  // namespace mount3

namespace portmap {
namespace {
template <class X>
bool XdrT(X& x, GetportArgs& a) { return x.U32(a.prog) && x.U32(a.vers) && x.U32(a.prot) && x.U32(a.port); }
}  // namespace
bool Xdr(XdrIn& x, GetportArgs& a) { return XdrT(x, a); }
bool Xdr(XdrOut& x, GetportArgs& a) { return XdrT(x, a); }
bool Xdr(XdrIn& x, GetportRes& r) { return x.U32(r.port); }
bool Xdr(XdrOut& x, GetportRes& r) { return x.U32(r.port); }
}  // namespace portmap

}  // namespace mpnfs::proto
