// Iostat: what `mpnfsctl iostat MOUNTPOINT [INTERVAL [COUNT]]` prints, in
// the manner of nfsiostat(8): per-second rates per path and per NFS
// procedure, from two successive statistics documents (StatsJson). The
// first report covers the time since the mount.
//
// The documents are parsed with nlohmann-json; what is computed is kept
// apart from the socket so that it is unit-tested.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "mpnfs/result.h"

namespace mpnfs::cli {

// The cumulative counters iostat needs, of one procedure on one path.
struct IostatOp {
  uint64_t ops = 0, retransmits = 0, errors = 0, nfs_errors = 0, bytes = 0;
  uint64_t rtt_count = 0, rtt_total_us = 0, exe_total_us = 0;
};

struct IostatSample {
  std::string source, mountpoint;
  double uptime_s = 0;
  // path ("all" for the totals, else the endpoint) -> procedure -> counters.
  std::map<std::string, std::map<std::string, IostatOp>> paths;
  std::map<std::string, std::string> states;  // endpoint -> state
};

// Reads a statistics document. Errors name what is missing.
Result<IostatSample> ParseIostatSample(const std::string& json);

// One report: rates over [prev, cur] (prev null: since the mount). READ and
// WRITE are always shown; other procedures when they were called meanwhile.
std::string IostatReport(const IostatSample* prev, const IostatSample& cur);

}  // namespace mpnfs::cli
