// MountOptions: everything `mpnfs SERVER:/EXPORT MOUNTPOINT -o ...` accepts.
//
// ParseMountArgs() is a pure function of argv so that every option, default
// and error message is unit-tested. Every option here is documented in
// man/mpnfs.8; fstab-only options (_netdev, nofail, noauto, x-systemd.*, ...)
// are accepted and ignored, generic mount flags are handed to FUSE, anything
// else is an error naming the option.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cache/block_cache.h"
#include "engine/engine.h"
#include "fs/options.h"
#include "mpnfs/result.h"

namespace mpnfs::cli {

struct MountOptions {
  std::string server;       // host name or address
  std::string export_path;  // "/export"
  std::string mountpoint;
  bool foreground = false;
  bool debug = false;
  bool help = false;
  bool version = false;
  // --sloppy (mount.mpnfs -s): an unknown -o option is listed in `ignored`
  // instead of failing the mount.
  bool sloppy = false;
  std::vector<std::string> ignored;
  // path=: server addresses that carry NFS traffic (one or more TCP
  // connections each); empty: the SERVER address alone.
  std::vector<std::string> paths;
  // local=: the client side of each path, in path order (an interface name
  // or a local address; "" lets routing choose). With no path=, the first
  // one binds the connection to SERVER.
  std::vector<std::string> locals;
  // weight=: the relative throughput of each path, in path order (1 to
  // engine::kMaxWeight; an empty entry is 1). The balancer divides a
  // connection's outstanding bytes by it. Not checked against the number of
  // paths here: mpnfstab may supply the paths (LoadMountOptions checks).
  std::vector<int> weights;
  std::string tab;        // tab=FILE: the mpnfstab to read first
  std::string tab_entry;  // file:line of the mpnfstab block used, if any
  int port = 2049;
  int mount_port = 0;        // 0: ask the portmapper
  int mount_timeout_s = 30;
  std::string log_level = "info";
  int max_background = 512;
  // fuse_uring=: whether FUSE requests come through io_uring
  // (fuse/transport.h): auto where the kernel offers it, on (the mount
  // fails where it does not), off (/dev/fuse, the default: faster here,
  // docs/BENCHMARKS.md). fuse_uring_depth=: ring entries per queue, the
  // requests one CPU's queue can have in mpnfs at once.
  enum class FuseUring { kAuto, kOn, kOff };
  FuseUring fuse_uring = FuseUring::kOff;
  int fuse_uring_depth = 32;
  int read_ahead_kb = -1;  // -1: DefaultReadAheadKb() of the mount's paths
  bool readdirplus = true;
  // The kernel checks mode bits (FUSE default_permissions) before mpnfs asks
  // the server; `nodefault_permissions` leaves every check to the server.
  bool kernel_permissions = true;
  // local_lock= (nfs(5)): which locks stay on this host (the kernel's own
  // lock tables) instead of going to the server's lock manager (NLM).
  bool local_posix_locks = false;  // fcntl and OFD locks
  bool local_flocks = false;       // flock
  engine::EngineOptions engine;  // paths filled from `server` after resolution
  fs::FsOptions fs;
  // The SSD cache tier: off unless cache_dir= is given.
  cache::CacheOptions cache;
  bool cache_optional = false;  // run uncached if the cache cannot be opened
  std::vector<std::string> fuse_opts;  // passed to the kernel mount via FUSE
  // metrics=: where to serve Prometheus metrics over HTTP ("127.0.0.1:9100");
  // empty: nowhere (the default).
  std::string metrics;
};

// The kernel readahead a mount of `paths` paths gets without read_ahead_kb=:
// 4 MiB, and 1 MiB per path beyond four, so that one sequential reader
// keeps a 1 MiB READ in flight on every path (with less, some paths idle:
// eight paths of 200 mbit read at 84% of their sum with 4 MiB, 99% with 8).
int DefaultReadAheadKb(size_t paths);

Result<MountOptions> ParseMountArgs(const std::vector<std::string>& args);

// mount.mpnfs: the calling convention of mount(8)'s helpers,
//   mount.mpnfs SPEC DIR [-sfnv] [-N NAMESPACE] [-o OPTIONS] [-t TYPE]
// turned into mpnfs's own arguments. -s (sloppy) becomes --sloppy; -f
// (fake: check everything, mount nothing) and -v (verbose) are returned as
// flags; -n (no mtab: there is none) is accepted. Refused with a message: a
// network namespace (-N) and a type other than mpnfs. (ParseMountArgs
// refuses `remount`, however mpnfs is called: a running mount's options
// are not changed by mounting again.)
struct HelperArgs {
  std::vector<std::string> args;  // for ParseMountArgs / LoadMountOptions
  bool fake = false;
  bool verbose = false;
};
Result<HelperArgs> TranslateHelperArgs(const std::vector<std::string>& argv);

// One path weight ("4"), as weight= and `path add ... weight=` take it:
// 1 to engine::kMaxWeight; nullopt otherwise.
std::optional<int> ParseWeight(const std::string& s);

// "SERVER:/EXPORT" -> server, export.
bool SplitSource(const std::string& src, std::string* server, std::string* export_path);

std::string UsageText();

// metrics= value: "PORT" means 127.0.0.1:PORT (loopback unless told
// otherwise); "ADDR:PORT" with a numeric IPv4 address, or "[IPv6]:PORT".
// Returns the listening address ("127.0.0.1:9100", "[::1]:9100") or an
// error naming what is wrong.
Result<std::string> ParseMetricsAddress(const std::string& value);

}  // namespace mpnfs::cli
