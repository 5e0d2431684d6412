// NLM v4, the Network Lock Manager (RFC 1813 appendix II; X/Open XNFS
// chapter 10 for the procedures' meaning): byte-range locks on NFSv3 files,
// as wire shapes. The gateway calls TEST, LOCK, CANCEL and UNLOCK on the
// server's lock manager, and may be called back with GRANTED (a blocked
// LOCK granted later); FREE_ALL takes the NSM notification's shape.
//
// One codec per message for both directions (proto/xdr.h), so the same
// shapes serve the calls made and the calls received.
//
// Bounds: caller_name 1024 bytes (LM_MAXSTRLEN), netobj (cookie, handle,
// owner) 1024 bytes (MAXNETOBJ_SZ); the handle is an NFSv3 handle, 64 bytes
// at most. An nlm4_stats value the specification does not define decodes
// (a server's newer status must not fail the reply) and maps to ENOLCK.
// Threads: none (plain functions).
#pragma once

#include <cstdint>
#include <string>

#include "proto/xdr.h"

namespace mpnfs::proto::nlm4 {

inline constexpr uint32_t kProgram = 100021;
inline constexpr uint32_t kVersion = 4;
inline constexpr uint32_t kStrMax = 1024;  // LM_MAXSTRLEN
inline constexpr uint32_t kObjMax = 1024;  // MAXNETOBJ_SZ
inline constexpr uint32_t kFhMax = 64;     // NFS3_FHSIZE

enum Proc : uint32_t {
  kNull = 0, kTest = 1, kLock = 2, kCancel = 3, kUnlock = 4, kGranted = 5,
  kTestMsg = 6, kLockMsg = 7, kCancelMsg = 8, kUnlockMsg = 9, kGrantedMsg = 10,
  kTestRes = 11, kLockRes = 12, kCancelRes = 13, kUnlockRes = 14, kGrantedRes = 15,
  kShare = 20, kUnshare = 21, kNmLock = 22, kFreeAll = 23,
};

enum class Stat : uint32_t {
  kGranted = 0, kDenied = 1, kDeniedNoLocks = 2, kBlocked = 3, kDeniedGracePeriod = 4,
  kDeadlock = 5, kReadOnlyFs = 6, kStaleFh = 7, kFileTooBig = 8, kFailed = 9,
};

// nlm4_stats as an errno, as the Linux client maps it (DENIED is EAGAIN,
// DENIED_NOLOCKS, DENIED_GRACE_PERIOD, BLOCKED and FAILED are ENOLCK,
// DEADLCK EDEADLK, ROFS EROFS, STALE_FH ESTALE, FBIG EOVERFLOW), and its
// name.
int ErrnoOf(Stat s);
std::string StatName(Stat s);

// nlm4_lock: who (caller_name: the client host; oh: the owner, an opaque
// the client makes; svid: the owner's number, shown to other hosts by
// TEST), what (fh) and which bytes (l_len 0: to the end of the file).
struct Lock {
  std::string caller_name;
  std::string fh;
  std::string oh;
  int32_t svid = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  bool operator==(const Lock&) const = default;
};

// nlm4_holder: the conflicting lock a denied TEST names.
struct Holder {
  bool exclusive = false;
  int32_t svid = 0;
  std::string oh;
  uint64_t offset = 0;
  uint64_t length = 0;
  bool operator==(const Holder&) const = default;
};

struct TestArgs {  // TEST, GRANTED (and their _MSG forms)
  std::string cookie;
  bool exclusive = false;
  Lock lock;
  bool operator==(const TestArgs&) const = default;
};

struct LockArgs {
  std::string cookie;
  bool block = false;
  bool exclusive = false;
  Lock lock;
  bool reclaim = false;  // in the server's grace period, after its restart
  int32_t state = 0;     // the client's NSM state number
  bool operator==(const LockArgs&) const = default;
};

struct CancelArgs {
  std::string cookie;
  bool block = false;
  bool exclusive = false;
  Lock lock;
  bool operator==(const CancelArgs&) const = default;
};

struct UnlockArgs {
  std::string cookie;
  Lock lock;
  bool operator==(const UnlockArgs&) const = default;
};

// nlm4_res: LOCK, CANCEL, UNLOCK, GRANTED.
struct Res {
  std::string cookie;
  Stat stat = Stat::kGranted;
  bool operator==(const Res&) const = default;
};

// nlm4_testres: the holder is on the wire only when the stat is DENIED.
struct TestRes {
  std::string cookie;
  Stat stat = Stat::kGranted;
  Holder holder;
  bool operator==(const TestRes&) const = default;
};

// nlm4_notify (FREE_ALL): a host and its new NSM state.
struct Notify {
  std::string name;
  int32_t state = 0;
  bool operator==(const Notify&) const = default;
};

bool Xdr(XdrIn& x, Lock& v);
bool Xdr(XdrOut& x, Lock& v);
bool Xdr(XdrIn& x, TestArgs& v);
bool Xdr(XdrOut& x, TestArgs& v);
bool Xdr(XdrIn& x, LockArgs& v);
bool Xdr(XdrOut& x, LockArgs& v);
bool Xdr(XdrIn& x, CancelArgs& v);
bool Xdr(XdrOut& x, CancelArgs& v);
bool Xdr(XdrIn& x, UnlockArgs& v);
bool Xdr(XdrOut& x, UnlockArgs& v);
bool Xdr(XdrIn& x, Res& v);
bool Xdr(XdrOut& x, Res& v);
bool Xdr(XdrIn& x, TestRes& v);
bool Xdr(XdrOut& x, TestRes& v);
bool Xdr(XdrIn& x, Notify& v);
bool Xdr(XdrOut& x, Notify& v);

}  // namespace mpnfs::proto::nlm4
