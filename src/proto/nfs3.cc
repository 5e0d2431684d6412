#include "proto/nfs3.h"

#include <cerrno>
#include <cstring>

namespace mpnfs::proto::nfs3 {
namespace {

using nfs::Attr;
using nfs::Fh;
using nfs::Ftype;
using nfs::SetAttr;
using nfs::Time;
using nfs::Wcc;

template <class X>
bool Xdr(X& x, Time& t) { return x.U32(t.sec) && x.U32(t.nsec); }

template <class X>
bool FhX(X& x, Fh& fh) { return x.Bytes(fh, kFhMax); }

// A name: not empty, no NUL and no '/' (the kernel could not be given it
// as it is: a directory entry named so is a malformed reply).
template <class X>
bool Name(X& x, std::string& s) {
  if (!x.Bytes(s, kNameMax)) return false;
  if (s.empty() || s.find('\0') != std::string::npos || s.find('/') != std::string::npos) return x.Fail();
  return true;
}

// 8 opaque bytes (verifiers), as memory holds them.
template <class X>
bool Verf(X& x, uint64_t& v) { return x.Fixed(&v, sizeof v); }

template <class X>
bool Type(X& x, Ftype& t) {
  // RFC 1813 ftype3 numbers: NF3REG = 1 ... NF3FIFO = 7 (kNone is 0). An
  // unknown type reads as kNone: one odd attribute must not fail a whole
  // directory page.
  uint32_t v = static_cast<uint32_t>(t);
  if (!x.U32(v)) return false;
  t = v >= 1 && v <= 7 ? static_cast<Ftype>(v) : Ftype::kNone;
  return true;
}

template <class X>
bool Xdr(X& x, Attr& a) {
  if (!Type(x, a.type) || !x.U32(a.mode) || !x.U32(a.nlink) || !x.U32(a.uid) || !x.U32(a.gid) ||
      !x.U64(a.size) || !x.U64(a.used) || !x.U32(a.rdev_major) || !x.U32(a.rdev_minor) || !x.U64(a.fsid) ||
      !x.U64(a.fileid) || !Xdr(x, a.atime) || !Xdr(x, a.mtime) || !Xdr(x, a.ctime)) {
    return false;
  }
  if constexpr (X::kDecoding) a.mode &= 07777;  // (the type is `type`'s)
  return true;
}

template <class X>
bool PostOp(X& x, std::optional<Attr>& a) {
  return Optional(x, a, [](X& x, Attr& v) { return Xdr(x, v); });
}

template <class X>
bool PostOpFh(X& x, std::optional<Fh>& fh) {
  return Optional(x, fh, [](X& x, Fh& v) { return FhX(x, v); });
}

template <class X>
bool Xdr(X& x, Wcc& w) {
  return Optional(x, w.before,
                  [](X& x, Wcc::Before& b) { return x.U64(b.size) && Xdr(x, b.mtime) && Xdr(x, b.ctime); }) &&
         PostOp(x, w.after);
}

template <class X, class T>
bool SetIt(X& x, std::optional<T>& v) {
  return Optional(x, v, [](X& x, T& t) {
    if constexpr (sizeof(T) == 8) {
      return x.U64(t);
    } else {
      return x.U32(t);
    }
  });
}

template <class X>
bool TimeHow(X& x, SetAttr::TimeHow& how, Time& t) {
  using How = SetAttr::TimeHow;
  uint32_t v = how == How::kServer ? 1 : how == How::kClient ? 2 : 0;
  if (!x.U32(v)) return false;
  if (v > 2) return x.Fail();
  how = v == 1 ? How::kServer : v == 2 ? How::kClient : How::kDontChange;
  return how != How::kClient || Xdr(x, t);
}

template <class X>
bool Xdr(X& x, SetAttr& s) {
  if constexpr (X::kDecoding) s = SetAttr{};
  return SetIt(x, s.mode) && SetIt(x, s.uid) && SetIt(x, s.gid) && SetIt(x, s.size) &&
         TimeHow(x, s.atime_how, s.atime) && TimeHow(x, s.mtime_how, s.mtime);
}

template <class X>
bool DirOp(X& x, Fh& dir, std::string& name) { return FhX(x, dir) && Name(x, name); }

// nfsstat3, then the resok body (`ok`) or the resfail body (`fail`).
template <class X, class Ok, class Fail>
bool Res(X& x, uint32_t& status, Ok&& ok, Fail&& fail) {
  if (!x.U32(status)) return false;
  return status == kOk ? ok() : fail();
}

// --- arguments

template <class X>
bool XdrT(X& x, FhArgs& a) { return FhX(x, a.fh); }

template <class X>
bool XdrT(X& x, SetattrArgs& a) {
  return FhX(x, a.fh) && Xdr(x, a.sa) && Optional(x, a.guard, [](X& x, Time& t) { return Xdr(x, t); });
}

template <class X>
bool XdrT(X& x, DirOpArgs& a) { return DirOp(x, a.dir, a.name); }

template <class X>
bool XdrT(X& x, AccessArgs& a) { return FhX(x, a.fh) && x.U32(a.access); }

template <class X>
bool XdrT(X& x, ReadArgs& a) { return FhX(x, a.fh) && x.U64(a.off) && x.U32(a.count); }

template <class X>
bool StableX(X& x, Stable& s) {
  // An unknown stable_how reads as UNSTABLE: the data is then committed.
  uint32_t v = static_cast<uint32_t>(s);
  if (!x.U32(v)) return false;
  s = v <= 2 ? static_cast<Stable>(v) : Stable::kUnstable;
  return true;
}

template <class X>
bool XdrT(X& x, WriteArgs& a) {
  return FhX(x, a.fh) && x.U64(a.off) && x.U32(a.count) && StableX(x, a.stable) && x.View(a.data, UINT32_MAX);
}

template <class X>
bool XdrT(X& x, CommitArgs& a) { return FhX(x, a.fh) && x.U64(a.off) && x.U32(a.count); }

template <class X>
bool XdrT(X& x, CreateArgs& a) {
  using M = nfs::CreateMode;
  uint32_t how = a.mode == M::kGuarded ? 1 : a.mode == M::kExclusive ? 2 : 0;
  if (!DirOp(x, a.dir, a.name) || !x.U32(how)) return false;
  if (how > 2) return x.Fail();
  a.mode = how == 1 ? M::kGuarded : how == 2 ? M::kExclusive : M::kUnchecked;
  return how == 2 ? Verf(x, a.verf) : Xdr(x, a.sa);
}

template <class X>
bool XdrT(X& x, MkdirArgs& a) { return DirOp(x, a.dir, a.name) && Xdr(x, a.sa); }

template <class X>
bool XdrT(X& x, SymlinkArgs& a) {
  return DirOp(x, a.dir, a.name) && Xdr(x, a.sa) && x.Bytes(a.target, kPathMax);
}

template <class X>
bool XdrT(X& x, MknodArgs& a) {
  if (!DirOp(x, a.dir, a.name) || !Type(x, a.type)) return false;
  switch (a.type) {
    case Ftype::kChr:
    case Ftype::kBlk:
      return Xdr(x, a.sa) && x.U32(a.major) && x.U32(a.minor);
    case Ftype::kSock:
    case Ftype::kFifo:
      return Xdr(x, a.sa);
    default:
      return true;
  }
}

template <class X>
bool XdrT(X& x, RenameArgs& a) { return DirOp(x, a.from_dir, a.from) && DirOp(x, a.to_dir, a.to); }

template <class X>
bool XdrT(X& x, LinkArgs& a) { return FhX(x, a.fh) && DirOp(x, a.dir, a.name); }

template <class X>
bool XdrT(X& x, ReaddirArgs& a) {
  if (!FhX(x, a.dir) || !x.U64(a.cookie) || !Verf(x, a.verf)) return false;
  return a.plus ? x.U32(a.dircount) && x.U32(a.count) : x.U32(a.count);
}

// --- results

template <class X>
bool XdrT(X& x, GetattrRes& r) {
  return Res(x, r.status, [&] { return Xdr(x, r.attr); }, [] { return true; });
}

template <class X>
bool XdrT(X& x, WccRes& r) {
  return Res(x, r.status, [&] { return Xdr(x, r.wcc); }, [&] { return Xdr(x, r.wcc); });
}

template <class X>
bool XdrT(X& x, LookupRes& r) {
  return Res(
      x, r.status, [&] { return FhX(x, r.ok.fh) && PostOp(x, r.ok.attr) && PostOp(x, r.ok.dir); },
      [&] { return PostOp(x, r.ok.dir); });
}

template <class X>
bool XdrT(X& x, AccessRes& r) {
  return Res(
      x, r.status, [&] { return PostOp(x, r.ok.attr) && x.U32(r.ok.access); },
      [&] { return PostOp(x, r.ok.attr); });
}

template <class X>
bool XdrT(X& x, ReadlinkRes& r) {
  return Res(
      x, r.status, [&] { return PostOp(x, r.attr) && x.View(r.path, kPathMax); }, [&] { return PostOp(x, r.attr); });
}

template <class X>
bool XdrT(X& x, ReadRes& r) {
  return Res(
      x, r.status,
      [&] { return PostOp(x, r.attr) && x.U32(r.count) && x.Bool(r.eof) && x.View(r.data, UINT32_MAX); },
      [&] { return PostOp(x, r.attr); });
}

template <class X>
bool XdrT(X& x, WriteRes& r) {
  return Res(
      x, r.status,
      [&] { return Xdr(x, r.wcc) && x.U32(r.count) && StableX(x, r.committed) && Verf(x, r.verf); },
      [&] { return Xdr(x, r.wcc); });
}

template <class X>
bool XdrT(X& x, CommitRes& r) {
  return Res(x, r.status, [&] { return Xdr(x, r.wcc) && Verf(x, r.verf); }, [&] { return Xdr(x, r.wcc); });
}

template <class X>
bool XdrT(X& x, NewObjectRes& r) {
  return Res(
      x, r.status, [&] { return PostOpFh(x, r.ok.fh) && PostOp(x, r.ok.attr) && Xdr(x, r.ok.dir); },
      [&] { return Xdr(x, r.ok.dir); });
}

template <class X>
bool XdrT(X& x, RenameRes& r) {
  auto both = [&] { return Xdr(x, r.wcc.from) && Xdr(x, r.wcc.to); };
  return Res(x, r.status, both, both);
}

template <class X>
bool XdrT(X& x, LinkRes& r) {
  auto both = [&] { return PostOp(x, r.ok.attr) && Xdr(x, r.ok.dir); };
  return Res(x, r.status, both, both);
}

// One entry of a list; `plus`: READDIRPLUS's attributes and handle follow.
template <class X>
bool Entry(X& x, nfs::DirEntry& e, bool plus) {
  if (!x.U64(e.fileid) || !Name(x, e.name) || !x.U64(e.cookie)) return false;
  return !plus || (PostOp(x, e.attr) && PostOpFh(x, e.fh));
}

template <class X>
bool XdrT(X& x, ReaddirRes& r) {
  auto ok = [&] {
    nfs::DirPage& p = r.page;
    if (!PostOp(x, p.dir) || !Verf(x, p.verf)) return false;
    if constexpr (X::kDecoding) {
      p.entries.clear();
      bool follows = false;
      // Iterative: one entry per round, each consuming bytes of the message.
      while (x.Bool(follows) && follows) {
        p.entries.emplace_back();
        if (!Entry(x, p.entries.back(), r.plus)) return false;
      }
      if (!x.ok()) return false;
    } else {
      for (auto& e : p.entries) {
        if (!x.Bool(true) || !Entry(x, e, r.plus)) return false;
      }
      if (!x.Bool(false)) return false;
    }
    return x.Bool(p.eof);
  };
  return Res(x, r.status, ok, [&] { return PostOp(x, r.page.dir); });
}

template <class X>
bool XdrT(X& x, FsstatRes& r) {
  auto& s = r.ok;
  return Res(
      x, r.status,
      [&] {
        return PostOp(x, r.attr) && x.U64(s.tbytes) && x.U64(s.fbytes) && x.U64(s.abytes) && x.U64(s.tfiles) &&
               x.U64(s.ffiles) && x.U64(s.afiles) && x.U32(r.invarsec);
      },
      [&] { return PostOp(x, r.attr); });
}

template <class X>
bool XdrT(X& x, FsinfoRes& r) {
  auto& i = r.ok;
  return Res(
      x, r.status,
      [&] {
        return PostOp(x, r.attr) && x.U32(i.rtmax) && x.U32(i.rtpref) && x.U32(r.rtmult) && x.U32(i.wtmax) &&
               x.U32(i.wtpref) && x.U32(r.wtmult) && x.U32(i.dtpref) && x.U64(i.maxfilesize) &&
               Xdr(x, i.time_delta) && x.U32(r.properties);
      },
      [&] { return PostOp(x, r.attr); });
}

template <class X>
bool XdrT(X& x, PathconfRes& r) {
  return Res(
      x, r.status,
      [&] {
        return PostOp(x, r.attr) && x.U32(r.ok.linkmax) && x.U32(r.ok.name_max) && x.Bool(r.no_trunc) &&
               x.Bool(r.chown_restricted) && x.Bool(r.case_insensitive) && x.Bool(r.case_preserving);
      },
      [&] { return PostOp(x, r.attr); });
}

}  // namespace

int ErrnoOf(uint32_t status) {
  // (RFC 1813 took its numbers from BSD's errno: several differ from Linux's.)
  switch (status) {
    case kOk: return 0;
    case 1: return EPERM;
    case 2: return ENOENT;
    case 5: return EIO;
    case 6: return ENXIO;
    case 13: return EACCES;
    case 17: return EEXIST;
    case 18: return EXDEV;
    case 19: return ENODEV;
    case 20: return ENOTDIR;
    case 21: return EISDIR;
    case 22: return EINVAL;
    case 27: return EFBIG;
    case 28: return ENOSPC;
    case 30: return EROFS;
    case 31: return EMLINK;
    case 63: return ENAMETOOLONG;
    case 66: return ENOTEMPTY;
    case 69: return EDQUOT;
    case 70: return ESTALE;
    case 71: return EREMOTE;
    case 10001: return EIO;         // BADHANDLE
    case 10002: return EIO;         // NOT_SYNC
    case 10003: return EIO;         // BAD_COOKIE
    case 10004: return EOPNOTSUPP;  // NOTSUPP
    case 10005: return EIO;         // TOOSMALL
    case 10006: return EIO;         // SERVERFAULT
    case 10007: return EINVAL;      // BADTYPE
    case kErrJukebox: return EAGAIN;
    default: return EIO;
  }
}

std::string StatusName(uint32_t status) {
  switch (status) {
    case kOk: return "NFS3_OK";
    case 1: return "NFS3ERR_PERM";
    case 2: return "NFS3ERR_NOENT";
    case 5: return "NFS3ERR_IO";
    case 6: return "NFS3ERR_NXIO";
    case 13: return "NFS3ERR_ACCES";
    case 17: return "NFS3ERR_EXIST";
    case 18: return "NFS3ERR_XDEV";
    case 19: return "NFS3ERR_NODEV";
    case 20: return "NFS3ERR_NOTDIR";
    case 21: return "NFS3ERR_ISDIR";
    case 22: return "NFS3ERR_INVAL";
    case 27: return "NFS3ERR_FBIG";
    case 28: return "NFS3ERR_NOSPC";
    case 30: return "NFS3ERR_ROFS";
    case 31: return "NFS3ERR_MLINK";
    case 63: return "NFS3ERR_NAMETOOLONG";
    case 66: return "NFS3ERR_NOTEMPTY";
    case 69: return "NFS3ERR_DQUOT";
    case 70: return "NFS3ERR_STALE";
    case 71: return "NFS3ERR_REMOTE";
    case 10001: return "NFS3ERR_BADHANDLE";
    case 10002: return "NFS3ERR_NOT_SYNC";
    case 10003: return "NFS3ERR_BAD_COOKIE";
    case 10004: return "NFS3ERR_NOTSUPP";
    case 10005: return "NFS3ERR_TOOSMALL";
    case 10006: return "NFS3ERR_SERVERFAULT";
    case 10007: return "NFS3ERR_BADTYPE";
    case kErrJukebox: return "NFS3ERR_JUKEBOX";
    default: return "NFS3 status " + std::to_string(status);
  }
}

bool EncodeWriteHead(XdrOut& x, const WriteArgs& a) {
  auto& w = const_cast<WriteArgs&>(a);  // (XdrOut only reads)
  return FhX(x, w.fh) && x.U64(w.off) && x.U32(w.count) && StableX(x, w.stable) &&
         x.LengthOnly(static_cast<uint32_t>(a.data.size()), UINT32_MAX);
}

#define MPNFS_NFS3_DEFINE(T)                                \
  bool Xdr(XdrIn& x, T& v) { return XdrT(x, v) && x.ok(); } \
  bool Xdr(XdrOut& x, T& v) { return XdrT(x, v) && x.ok(); }
MPNFS_NFS3_MESSAGES(MPNFS_NFS3_DEFINE)
#undef MPNFS_NFS3_DEFINE

}  // namespace mpnfs::proto::nfs3
