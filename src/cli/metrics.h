// Metrics: the mount's statistics in the Prometheus text exposition format,
// for `mpnfsctl stats --prometheus` (control command "stats prometheus") and
// for the optional HTTP endpoint of `-o metrics=ADDR:PORT`.
//
// Design. The statistics live in the engine's and the cache's atomics; they
// are not counted twice. At each scrape a snapshot is taken (SnapshotFn) and
// turned into prometheus-cpp MetricFamily objects (StatsCollectable is a
// prometheus::Collectable that does that in Collect()), which prometheus-cpp's
// TextSerializer renders and its Exposer (civetweb) serves. Metric names
// and labels are documented in mpnfsctl(8): every name starts with
// `mpnfs_`, counters end in `_total`, units are in the names; labels are
// `mount` (the mountpoint), `path` (a connection: address:port#index) and
// `op` (the NFS procedure). Totals over paths are not exported (they would
// be counted twice by a sum()): sum by the labels you keep.
//
// Thread safety: MetricFamilies() and PrometheusText() are pure; Collect()
// runs on an Exposer thread and calls the SnapshotFn, which must be thread
// safe (Engine::Stats() and BlockCache::Stats() are).
#pragma once

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cache/block_cache.h"
#include "engine/engine.h"
#include "fuse/transport_stats.h"
#include "mpnfs/result.h"
#include "nfs/service_stats.h"

namespace prometheus {
class Exposer;
}

namespace mpnfs::cli {

// Everything the statistics report about one mount at one instant.
struct MountSnapshot {
  std::string source;  // SERVER:/EXPORT
  std::string mountpoint;
  double uptime_s = 0;  // since the mount started (what the counters cover)
  std::vector<engine::ConnectionStats> conns;
  std::optional<cache::CacheStats> cache;
  std::vector<nfs::ServiceStats> services;  // nfs/service_stats.h
  std::optional<fuse::TransportStats> fuse;  // fuse/transport.h; none before the mount
};
using SnapshotFn = std::function<MountSnapshot()>;

std::vector<prometheus::MetricFamily> MetricFamilies(const MountSnapshot& s);
// The text exposition format (version 0.0.4) of MetricFamilies(s).
std::string PrometheusText(const MountSnapshot& s);

class StatsCollectable : public prometheus::Collectable {
 public:
  explicit StatsCollectable(SnapshotFn fn) : fn_(std::move(fn)) {}
  std::vector<prometheus::MetricFamily> Collect() const override { return MetricFamilies(fn_()); }

 private:
  SnapshotFn fn_;
};

// The HTTP endpoint: GET /metrics on `listen` (MountOptions::metrics, from
// ParseMetricsAddress() in cli/options.h).
class MetricsServer {
 public:
  // Fails (with the reason) if the address cannot be listened on.
  static Result<std::unique_ptr<MetricsServer>> Start(const std::string& listen, SnapshotFn fn);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

 private:
  MetricsServer() = default;
  std::shared_ptr<StatsCollectable> collectable_;
  std::unique_ptr<prometheus::Exposer> exposer_;
};

}  // namespace mpnfs::cli
