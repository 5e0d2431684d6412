// NFSv3 (RFC 1813): the arguments and results of the procedures the
// gateway uses, as wire shapes over the gateway's own types (nfs/types.h).
//
// Each procedure has an argument struct and a result struct, and one codec
// for each, `Xdr(X&, T&)` (proto/xdr.h: the same shape encodes and
// decodes). A result holds the nfsstat3 and what the reply carries for that
// status: the resok body when it is NFS3_OK, else the resfail body (the
// attributes or wcc data a failure carries, in the same members).
//
// Decoded in place: READ's data, READLINK's path and WRITE's data (in the
// arguments) are views into the message buffer, valid as long as it is.
// Everything else is copied into the structs (handles, names, directory
// entries). A directory list is decoded iteratively, one entry at a time,
// and each entry takes at least 24 bytes of the message, so its length is
// bounded by the message's.
//
// Bounds: handles 64 bytes (NFS3_FHSIZE), names 1024 bytes, paths 4096
// bytes, a READ's data no more than its count word says; attributes with
// an unknown file type or time_how, and booleans other than 0 and 1, are
// malformed. Threads: none (plain functions).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "nfs/types.h"
#include "proto/xdr.h"

namespace mpnfs::proto::nfs3 {

inline constexpr uint32_t kProgram = 100003;
inline constexpr uint32_t kVersion = 3;
inline constexpr uint32_t kFhMax = 64;
inline constexpr uint32_t kNameMax = 1024;
inline constexpr uint32_t kPathMax = 4096;
inline constexpr uint32_t kOk = 0;
inline constexpr uint32_t kErrJukebox = 10008;  // "busy, try again later"

// nfsstat3 as an errno (as the Linux client maps it; NOTSUPP is
// EOPNOTSUPP, JUKEBOX EAGAIN, BADTYPE EINVAL, the other codes without an
// errno EIO), and its RFC 1813 name ("NFS3ERR_NOENT"; "NFS3 status N" for
// a number RFC 1813 does not define).
int ErrnoOf(uint32_t status);
std::string StatusName(uint32_t status);

enum class Stable : uint32_t { kUnstable = 0, kDataSync = 1, kFileSync = 2 };

// --- arguments
struct FhArgs {  // GETATTR, READLINK, FSSTAT, FSINFO, PATHCONF
  nfs::Fh fh;
  bool operator==(const FhArgs&) const = default;
};
struct SetattrArgs {
  nfs::Fh fh;
  nfs::SetAttr sa;
  std::optional<nfs::Time> guard;  // sattrguard3: the ctime the object must have
  bool operator==(const SetattrArgs&) const = default;
};
struct DirOpArgs {  // LOOKUP, REMOVE, RMDIR
  nfs::Fh dir;
  std::string name;
  bool operator==(const DirOpArgs&) const = default;
};
struct AccessArgs {
  nfs::Fh fh;
  uint32_t access = 0;
  bool operator==(const AccessArgs&) const = default;
};
struct ReadArgs {
  nfs::Fh fh;
  uint64_t off = 0;
  uint32_t count = 0;
  bool operator==(const ReadArgs&) const = default;
};
struct WriteArgs {
  nfs::Fh fh;
  uint64_t off = 0;
  uint32_t count = 0;
  Stable stable = Stable::kUnstable;
  std::string_view data;  // in place
  bool operator==(const WriteArgs&) const = default;
};
// WRITE's arguments up to and including the data's length word: the data
// itself goes from the caller's buffer (no copy), then its padding.
bool EncodeWriteHead(XdrOut& x, const WriteArgs& a);
struct CommitArgs {
  nfs::Fh fh;
  uint64_t off = 0;
  uint32_t count = 0;
  bool operator==(const CommitArgs&) const = default;
};
struct CreateArgs {
  nfs::Fh dir;
  std::string name;
  nfs::CreateMode mode = nfs::CreateMode::kUnchecked;
  nfs::SetAttr sa;    // UNCHECKED, GUARDED
  uint64_t verf = 0;  // EXCLUSIVE (8 opaque bytes, as memory holds them)
  bool operator==(const CreateArgs&) const = default;
};
struct MkdirArgs {
  nfs::Fh dir;
  std::string name;
  nfs::SetAttr sa;
  bool operator==(const MkdirArgs&) const = default;
};
struct SymlinkArgs {
  nfs::Fh dir;
  std::string name;
  nfs::SetAttr sa;
  std::string target;
  bool operator==(const SymlinkArgs&) const = default;
};
struct MknodArgs {
  nfs::Fh dir;
  std::string name;
  nfs::Ftype type = nfs::Ftype::kFifo;
  nfs::SetAttr sa;                // CHR, BLK, SOCK, FIFO
  uint32_t major = 0, minor = 0;  // CHR, BLK
  bool operator==(const MknodArgs&) const = default;
};
struct RenameArgs {
  nfs::Fh from_dir;
  std::string from;
  nfs::Fh to_dir;
  std::string to;
  bool operator==(const RenameArgs&) const = default;
};
struct LinkArgs {
  nfs::Fh fh;
  nfs::Fh dir;
  std::string name;
  bool operator==(const LinkArgs&) const = default;
};
struct ReaddirArgs {  // READDIR (plus = false: `dircount` unused) and READDIRPLUS
  bool plus = false;
  nfs::Fh dir;
  uint64_t cookie = 0, verf = 0;
  uint32_t dircount = 0, count = 0;  // count: READDIR's count, READDIRPLUS's maxcount
  bool operator==(const ReaddirArgs&) const = default;
};

// --- results
struct GetattrRes {
  uint32_t status = kOk;
  nfs::Attr attr;
  bool operator==(const GetattrRes&) const = default;
};
struct WccRes {  // SETATTR, REMOVE, RMDIR
  uint32_t status = kOk;
  nfs::Wcc wcc;
  bool operator==(const WccRes&) const = default;
};
struct LookupRes {
  uint32_t status = kOk;
  nfs::LookupReply ok;  // failed: only `dir`
  bool operator==(const LookupRes&) const = default;
};
struct AccessRes {
  uint32_t status = kOk;
  nfs::AccessReply ok;  // failed: only `attr`
  bool operator==(const AccessRes&) const = default;
};
struct ReadlinkRes {
  uint32_t status = kOk;
  std::optional<nfs::Attr> attr;
  std::string_view path;  // in place
  bool operator==(const ReadlinkRes&) const = default;
};
struct ReadRes {
  uint32_t status = kOk;
  std::optional<nfs::Attr> attr;
  uint32_t count = 0;
  bool eof = false;
  std::string_view data;  // in place
  bool operator==(const ReadRes&) const = default;
};
struct WriteRes {
  uint32_t status = kOk;
  nfs::Wcc wcc;
  uint32_t count = 0;
  Stable committed = Stable::kUnstable;
  uint64_t verf = 0;
  bool operator==(const WriteRes&) const = default;
};
struct CommitRes {
  uint32_t status = kOk;
  nfs::Wcc wcc;
  uint64_t verf = 0;
  bool operator==(const CommitRes&) const = default;
};
struct NewObjectRes {  // CREATE, MKDIR, SYMLINK, MKNOD
  uint32_t status = kOk;
  nfs::NewObject ok;  // failed: only `dir`
  bool operator==(const NewObjectRes&) const = default;
};
struct RenameRes {
  uint32_t status = kOk;
  nfs::RenameReply wcc;
  bool operator==(const RenameRes&) const = default;
};
struct LinkRes {
  uint32_t status = kOk;
  nfs::LinkReply ok;
  bool operator==(const LinkRes&) const = default;
};
struct ReaddirRes {  // READDIR (plus = false: no attributes or handles) and READDIRPLUS
  bool plus = false;  // set before decoding: which procedure answered
  uint32_t status = kOk;
  nfs::DirPage page;  // failed: only `dir`
  bool operator==(const ReaddirRes&) const = default;
};
struct FsstatRes {
  uint32_t status = kOk;
  std::optional<nfs::Attr> attr;
  nfs::FsStat ok;
  uint32_t invarsec = 0;
  bool operator==(const FsstatRes&) const = default;
};
struct FsinfoRes {
  uint32_t status = kOk;
  std::optional<nfs::Attr> attr;
  nfs::FsInfo ok;
  uint32_t rtmult = 0, wtmult = 0, properties = 0;
  bool operator==(const FsinfoRes&) const = default;
};
struct PathconfRes {
  uint32_t status = kOk;
  std::optional<nfs::Attr> attr;
  nfs::PathConf ok;
  bool no_trunc = true, chown_restricted = true, case_insensitive = false, case_preserving = true;
  bool operator==(const PathconfRes&) const = default;
};

// Every struct above; one codec for each, for XdrIn and XdrOut (nfs3.cc).
#define MPNFS_NFS3_MESSAGES(X)                                                                         \
  X(FhArgs) X(SetattrArgs) X(DirOpArgs) X(AccessArgs) X(ReadArgs) X(WriteArgs) X(CommitArgs) X(CreateArgs) \
  X(MkdirArgs) X(SymlinkArgs) X(MknodArgs) X(RenameArgs) X(LinkArgs) X(ReaddirArgs) X(GetattrRes) X(WccRes) \
  X(LookupRes) X(AccessRes) X(ReadlinkRes) X(ReadRes) X(WriteRes) X(CommitRes) X(NewObjectRes) X(RenameRes) \
  X(LinkRes) X(ReaddirRes) X(FsstatRes) X(FsinfoRes) X(PathconfRes)
#define MPNFS_NFS3_DECLARE(T) \
  bool Xdr(XdrIn& x, T& v);   \
  bool Xdr(XdrOut& x, T& v);
MPNFS_NFS3_MESSAGES(MPNFS_NFS3_DECLARE)
#undef MPNFS_NFS3_DECLARE

// NULL: no arguments, no result.
struct NullArgs {
  bool operator==(const NullArgs&) const = default;
};
struct NullRes {
  uint32_t status = kOk;
  bool operator==(const NullRes&) const = default;
};
inline bool Xdr(XdrIn&, NullArgs&) { return true; }
inline bool Xdr(XdrOut&, NullArgs&) { return true; }
inline bool Xdr(XdrIn&, NullRes&) { return true; }
inline bool Xdr(XdrOut&, NullRes&) { return true; }

// --- what a call needs of its messages beyond their shape (nfs/nfs3.cc's
// one call template asks these, each procedure's own rules overload them)
// What the call encodes: all of its arguments, but WRITE's data (sent
// after them from the caller's buffer: PayloadOf).
template <class A>
bool EncodeArgs(XdrOut& x, A& a) { return Xdr(x, a); }
inline bool EncodeArgs(XdrOut& x, WriteArgs& a) { return EncodeWriteHead(x, a); }
template <class A>
std::span<const char> PayloadOf(const A&) { return {}; }
inline std::span<const char> PayloadOf(const WriteArgs& a) { return {a.data.data(), a.data.size()}; }
// Sets up the result a reply decodes into (READDIR and READDIRPLUS share
// one shape).
template <class A, class R>
void PrepareResult(const A&, R&) {}
inline void PrepareResult(const ReaddirArgs& a, ReaddirRes& r) { r.plus = a.plus; }
// Whether a decoded result can answer these arguments: a READ that brings
// more data than asked is a broken reply.
template <class A, class R>
bool Answers(const A&, const R&) { return true; }
inline bool Answers(const ReadArgs& a, const ReadRes& r) { return r.status != kOk || r.data.size() <= a.count; }

}  // namespace mpnfs::proto::nfs3
