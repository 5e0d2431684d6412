// NSM v1, the Network Status Monitor (X/Open XNFS chapter 11): how lock
// managers learn that a host restarted. A client that restarts sends
// SM_NOTIFY with its new state number to the status monitor of each server
// it held locks on, and the server frees that client's locks; a server
// that restarts does the same to its clients, which then reclaim theirs.
// SM_MON, SM_UNMON and SM_STAT are a lock manager's calls to its own
// host's monitor.
//
// One codec per message for both directions (proto/xdr.h). Bounds: names
// 1024 bytes (SM_MAXSTRLEN); `priv` is 16 bytes. Threads: none.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "proto/xdr.h"

namespace mpnfs::proto::nsm {

inline constexpr uint32_t kProgram = 100024;
inline constexpr uint32_t kVersion = 1;
inline constexpr uint32_t kStrMax = 1024;  // SM_MAXSTRLEN

enum Proc : uint32_t {
  kNull = 0, kStat = 1, kMon = 2, kUnmon = 3, kUnmonAll = 4, kSimuCrash = 5, kNotify = 6,
};
enum : uint32_t { kStatSucc = 0, kStatFail = 1 };

struct SmName {  // SM_STAT's argument
  std::string mon_name;
  bool operator==(const SmName&) const = default;
};

// The RPC the monitor calls back on the watcher's host when the monitored
// host restarts.
struct MyId {
  std::string my_name;
  int32_t my_prog = 0, my_vers = 0, my_proc = 0;
  bool operator==(const MyId&) const = default;
};

struct MonId {  // SM_UNMON's argument
  std::string mon_name;
  MyId my_id;
  bool operator==(const MonId&) const = default;
};

struct Mon {  // SM_MON's argument
  MonId mon_id;
  std::array<char, 16> priv{};
  bool operator==(const Mon&) const = default;
};

struct StatChge {  // SM_NOTIFY's argument: this host restarted, its state is now `state`
  std::string mon_name;
  int32_t state = 0;
  bool operator==(const StatChge&) const = default;
};

struct StatRes {  // sm_stat_res: SM_STAT's and SM_MON's result
  uint32_t res_stat = kStatSucc;
  int32_t state = 0;
  bool operator==(const StatRes&) const = default;
};

struct State {  // sm_stat: SM_UNMON's and SM_UNMON_ALL's result
  int32_t state = 0;
  bool operator==(const State&) const = default;
};

struct Void {  // SM_NOTIFY's result
  bool operator==(const Void&) const = default;
};

bool Xdr(XdrIn& x, Void& v);
bool Xdr(XdrOut& x, Void& v);
bool Xdr(XdrIn& x, SmName& v);
bool Xdr(XdrOut& x, SmName& v);
bool Xdr(XdrIn& x, MyId& v);
bool Xdr(XdrOut& x, MyId& v);
bool Xdr(XdrIn& x, MonId& v);
bool Xdr(XdrOut& x, MonId& v);
bool Xdr(XdrIn& x, Mon& v);
bool Xdr(XdrOut& x, Mon& v);
bool Xdr(XdrIn& x, StatChge& v);
bool Xdr(XdrOut& x, StatChge& v);
bool Xdr(XdrIn& x, StatRes& v);
bool Xdr(XdrOut& x, StatRes& v);
bool Xdr(XdrIn& x, State& v);
bool Xdr(XdrOut& x, State& v);

}  // namespace mpnfs::proto::nsm
