// Calibrate: measures what the server and each path can do, from inside the
// gateway (`mpnfsctl calibrate MOUNTPOINT`), over the NFS client interface.
//
// What is measured, on a scratch file created in the export root as root
// (".mpnfs-calibrate-HOST-PID-RANDOM", removed at the end, on error and
// when the client goes away; one that a calibrate of this host left when
// its process died is removed by the next calibrate there, before it
// begins), for each target (each path alone, with its calls pinned
// to it, then all paths together; a one-path mount or --path has one target):
//   1. sequential WRITE of large calls (min(rsize, wsize)) at depth 8, for
//      --time seconds or until --size is written (the first target's step
//      fills the file; later ones overwrite it, wrapping at its end);
//   2. sequential READ of the same calls over the part written;
//   3. 8 KiB random READs, sweeping the queue depth 1, 2, 4, ... until IOPS
//      gain less than 5% over the best so far or depth 128 is reached;
//   4. 8 KiB random WRITEs, same sweep. Writes are UNSTABLE; each step ends
//      with a COMMIT, and the step's time includes it (a data file's pattern:
//      databases write their data files so and fsync them; the FILE_SYNC
//      pattern of a log is not measured).
// Latency is from the call's issue to its reply, as the gateway sees it.
//
// Threads: RunCalibrate runs on the caller's thread (a control command's
// thread) and blocks it: calls are issued there, their callbacks (engine
// loop threads) only count, note the latency and signal a condition
// variable. `progress` is called on the caller's thread about every 0.5 s;
// returning false stops the run (the scratch file is still removed).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "engine/transport.h"
#include "mpnfs/result.h"
#include "nfs/client.h"

namespace mpnfs::engine {
class Engine;
}

namespace mpnfs::cli {

class Reply;

struct CalibrateOptions {
  uint64_t size = 1ull << 30;      // scratch file size (upper bound; capped by free space / 2)
  double step_s = 3.0;             // each measurement step
  std::string path;                // only this path (HOST or HOST:PORT); empty: each path, then all
  bool json = false;
  bool apply = false;              // --apply: set the paths' weights from the run (not with --path)
  uint32_t small_io = 8192;
  uint32_t large_io = 1 << 20;     // set to min(rsize, wsize) by the gateway
  int seq_depth = 8;
  int max_depth = 128;
  double min_gain = 0.05;
};

// Parses the arguments after "calibrate" ("--size 256M --time 2 --json
// --path 10.0.0.2"). SIZE takes K/M/G suffixes (powers of 1024).
Result<CalibrateOptions> ParseCalibrateArgs(const std::string& args);

struct DepthPoint {
  int depth = 0;
  double iops = 0, mean_us = 0, p99_us = 0;
};

struct TargetResult {
  std::string name;  // the path's address, or "all"
  double seq_write_mbs = 0, seq_read_mbs = 0;  // MB = 10^6 bytes
  std::vector<DepthPoint> rand_read, rand_write;  // the sweeps, by depth
};

struct CalibrateResult {
  uint64_t file_bytes = 0;  // the part of the scratch file written and read
  uint32_t small_io = 0, large_io = 0;
  double step_s = 0;
  std::vector<TargetResult> targets;
  std::vector<std::string> skipped;  // paths down at the start: not measured
  // --apply: one line per path whose weight was set (the engine's answer).
  // Empty without --apply, or when it set nothing (the answer then starts
  // with an error line saying why).
  std::vector<std::string> applied;
};

// Whether a scratch file found by name (not by our CREATE's reply) is the
// one our GUARDED CREATE made: an empty regular file of root's, one link.
bool ScratchFileIsOurs(const nfs::Attr& a);

// This host's name as scratch files carry it (anything but letters,
// digits, '.' and '_' made '_').
std::string ScratchHost();
// The host and process a scratch file name says made it; nullopt for a
// name of another form.
struct ScratchMaker {
  std::string host;
  long pid = 0;
};
std::optional<ScratchMaker> ParseScratchName(const std::string& name);

// "--path" "HOST" or "HOST:PORT" -> the endpoint (port 0: any port);
// nullopt for a bad port.
std::optional<engine::Endpoint> SplitHostPort(const std::string& addr);

// The point with the most IOPS (null for an empty sweep).
const DepthPoint* BestPoint(const std::vector<DepthPoint>& sweep);

// Sweeps depth 1, 2, 4, ... max_depth: measure(depth) gives a point, or
// nullopt to stop (the run was stopped: the whole sweep is nullopt). Stops
// after the first depth whose IOPS are less than (1 + min_gain) x the best
// of the smaller depths.
std::optional<std::vector<DepthPoint>> SweepDepths(
    const std::function<std::optional<DepthPoint>(int depth)>& measure, int max_depth,
    double min_gain);

// Upper bound of the run time in seconds (every sweep to max_depth).
double EstimateSeconds(const CalibrateOptions& o, size_t targets);

// path= and weight= values for the paths measured, from each one's
// sequential throughput (the mean of its read and write MB/s): the slowest
// 10, the others in proportion (at most engine::kMaxWeight), in the order
// measured (the mount's engine order, which path add/remove can change),
// '+'-joined. Both empty unless every path of the mount was measured (the
// "all" row is there and none was skipped) and the slowest is under 85% of
// the fastest (equal paths want no weight).
struct WeightSuggestion {
  std::string paths, weight;
};
WeightSuggestion SuggestWeight(const CalibrateResult& r);

// The weights --apply sets, one per path measured, in the order measured:
// those of SuggestWeight when the paths differ in speed, 1 each when they do
// not (an earlier weight no longer fits them). Empty unless every path of
// the mount was measured (as SuggestWeight), there are at least two, and
// none measured 0 MB/s.
std::vector<int> WeightsToApply(const CalibrateResult& r);

// Why --apply sets nothing, if it must not, before asking the engine: the
// mount had one path at the start, a path was skipped (`skipped`), or a
// path measured no throughput (`weights`, from WeightsToApply, does not
// match `measured`, HOST:PORT of each path target). Engine::SetWeights
// then refuses if the paths changed during the run (a path added meanwhile
// would keep weight 1 on a scale where the slowest measured path is 10).
std::optional<std::string> ApplyRefusal(size_t paths_at_start, const std::vector<std::string>& measured,
                                        const std::vector<std::string>& skipped,
                                        const std::vector<int>& weights);

std::string RenderTable(const CalibrateResult& r);
std::string RenderJson(const CalibrateResult& r);

struct CalibrateTarget {
  std::string name;
  nfs::Client* client;  // its calls go over this target only
};

// Runs the measurements (see top). `admin` creates and removes the scratch
// file in `root` (as root); `free_bytes`: the export's available space.
Result<CalibrateResult> RunCalibrate(nfs::Client& admin, const nfs::Fh& root,
                                     const std::vector<CalibrateTarget>& targets,
                                     const CalibrateOptions& o,
                                     const std::function<bool(const std::string&)>& progress);

// The control command "calibrate ARGS" of a mount (cli/control.h): checks
// (read-only mount, free space), one Nfs3 per path pinned to it, progress
// lines to `out`, then the table or JSON. Runs on the command's thread.
struct CalibrateMount {
  engine::Engine* engine;
  nfs::Fh root;
  bool read_only = false;
  uint32_t rsize = 0, wsize = 0;
};
void RunCalibrateCommand(const std::string& cmd, Reply& out, const CalibrateMount& mount);

}  // namespace mpnfs::cli
