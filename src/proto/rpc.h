// ONC RPC v2 (RFC 5531) message headers: a call's header with AUTH_SYS or
// AUTH_NONE credentials, and a reply's header up to the procedure's
// result. Record marking (RFC 5531, 11) is the transport's.
//
// Contract: as xdr.h (no allocation but the machine name and groups a
// decoded call holds, bounds checked before use, errors as values). A
// reply's verifier is skipped in place (at most 400 bytes, RFC 5531).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "proto/xdr.h"

namespace mpnfs::proto {

inline constexpr uint32_t kRpcVersion = 2;
inline constexpr uint32_t kMaxAuthBytes = 400;
inline constexpr uint32_t kMaxAuthGroups = 16;
enum : uint32_t { kAuthNone = 0, kAuthSys = 1 };
enum : uint32_t { kMsgCall = 0, kMsgReply = 1 };
enum : uint32_t { kMsgAccepted = 0, kMsgDenied = 1 };
enum class AcceptStat : uint32_t {
  kSuccess = 0, kProgUnavail = 1, kProgMismatch = 2, kProcUnavail = 3, kGarbageArgs = 4, kSystemErr = 5,
};
enum class RejectStat : uint32_t { kRpcMismatch = 0, kAuthError = 1 };

// AUTH_SYS's body (authsys_parms).
struct AuthSys {
  uint32_t stamp = 0;
  std::string machine;  // <= 255 bytes
  uint32_t uid = 0, gid = 0;
  std::vector<uint32_t> groups;  // <= 16
  bool operator==(const AuthSys&) const = default;
};

struct CallHeader {
  uint32_t xid = 0;
  uint32_t prog = 0, vers = 0, proc = 0;
  bool auth_sys = true;  // else AUTH_NONE
  AuthSys cred;
  bool operator==(const CallHeader&) const = default;
};

// Everything of a call up to its arguments.
template <class X>
bool Xdr(X& x, CallHeader& h);

struct ReplyHeader {
  uint32_t xid = 0;
  bool accepted = true;
  AcceptStat accept = AcceptStat::kSuccess;  // accepted
  RejectStat reject = RejectStat::kRpcMismatch;  // denied
  uint32_t low = 0, high = 0;  // PROG_MISMATCH, RPC_MISMATCH: the versions supported
  uint32_t auth_stat = 0;      // AUTH_ERROR
  bool operator==(const ReplyHeader&) const = default;
};

// Everything of a reply up to its result (which follows only when accepted
// with kSuccess). Encoding writes an empty AUTH_NONE verifier.
template <class X>
bool Xdr(X& x, ReplyHeader& h);

// For messages: "PROG_UNAVAIL", "AUTH_ERROR 5", ...
std::string Describe(const ReplyHeader& h);

}  // namespace mpnfs::proto
