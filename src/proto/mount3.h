// MOUNT v3 (RFC 1813, appendix I) and PORTMAP v2 GETPORT (RFC 1833): the
// calls the gateway makes once at mount time, as wire shapes (proto/xdr.h:
// one codec for both directions). Bounds: a path 1024 bytes (MNTPATHLEN),
// a handle 64 bytes (FHSIZE3), at most 16 auth flavors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "proto/xdr.h"

namespace mpnfs::proto {

namespace mount3 {
inline constexpr uint32_t kProgram = 100005;
inline constexpr uint32_t kVersion = 3;
inline constexpr uint32_t kProcMnt = 1;
inline constexpr uint32_t kOk = 0;

struct MntArgs {
  std::string path;
  bool operator==(const MntArgs&) const = default;
};
struct MntRes {
  uint32_t status = kOk;        // mountstat3
  std::string fh;               // MNT3_OK
  std::vector<uint32_t> flavors;  // MNT3_OK
  bool operator==(const MntRes&) const = default;
};
bool Xdr(XdrIn& x, MntArgs& a);
bool Xdr(XdrOut& x, MntArgs& a);
bool Xdr(XdrIn& x, MntRes& r);
bool Xdr(XdrOut& x, MntRes& r);
// mountstat3 as an errno, and what it means for someone mounting.
int ErrnoOf(uint32_t status);
std::string Explain(uint32_t status);
}  // namespace mount3

namespace portmap {
inline constexpr uint32_t kProgram = 100000;
inline constexpr uint32_t kVersion = 2;
inline constexpr uint32_t kProcGetport = 3;
inline constexpr uint32_t kPort = 111;
inline constexpr uint32_t kTcp = 6;

struct GetportArgs {
  uint32_t prog = 0, vers = 0, prot = kTcp, port = 0;
  bool operator==(const GetportArgs&) const = default;
};
struct GetportRes {
  uint32_t port = 0;  // 0: not registered
  bool operator==(const GetportRes&) const = default;
};
bool Xdr(XdrIn& x, GetportArgs& a);
bool Xdr(XdrOut& x, GetportArgs& a);
bool Xdr(XdrIn& x, GetportRes& r);
bool Xdr(XdrOut& x, GetportRes& r);
}  // namespace portmap

}  // namespace mpnfs::proto
