#include "cli/metrics.h"

#include <prometheus/exposer.h>
#include <prometheus/text_serializer.h>

#include <cmath>
#include <map>
#include <stdexcept>

namespace mpnfs::cli {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using Labels = std::vector<ClientMetric::Label>;

// RTT histogram buckets: the engine's power-of-two microsecond buckets from
// 16 us to 2^25 us (33.5 s); bucket b holds [2^(b-1), 2^b) us, so all its
// values are <= 2^b us.
constexpr int kFirstBucket = 4;
constexpr int kLastBucket = 25;

// Families in the order first used; each name once.
class Families {
 public:
  void Counter(const std::string& name, const std::string& help, Labels labels, double v) {
    ClientMetric m;
    m.label = std::move(labels);
    m.counter.value = v;
    Family(name, help, MetricType::Counter).metric.push_back(std::move(m));
  }
  void Gauge(const std::string& name, const std::string& help, Labels labels, double v) {
    ClientMetric m;
    m.label = std::move(labels);
    m.gauge.value = v;
    Family(name, help, MetricType::Gauge).metric.push_back(std::move(m));
  }
  void Histogram(const std::string& name, const std::string& help, Labels labels,
                 const engine::LatencySnapshot& h) {
    ClientMetric m;
    m.label = std::move(labels);
    m.histogram.sample_count = h.count;
    m.histogram.sample_sum = static_cast<double>(h.sum_us) * 1e-6;
    uint64_t cumulative = 0;
    for (int b = 0; b <= kLastBucket; ++b) {
      cumulative += h.buckets[b];
      if (b >= kFirstBucket) {
        m.histogram.bucket.push_back({cumulative, std::ldexp(1.0, b) * 1e-6});
      }
    }
    // The +Inf bucket (sample_count) is written by the serializer.
    Family(name, help, MetricType::Histogram).metric.push_back(std::move(m));
  }
  std::vector<MetricFamily> Take() { return std::move(fams_); }

 private:
  MetricFamily& Family(const std::string& name, const std::string& help, MetricType type) {
    auto [it, fresh] = index_.try_emplace(name, fams_.size());
    if (fresh) fams_.push_back(MetricFamily{name, help, type, {}});
    return fams_[it->second];
  }
  std::vector<MetricFamily> fams_;
  std::map<std::string, size_t> index_;
};

Labels With(const Labels& base, const std::string& name, const std::string& value) {
  Labels l = base;
  l.push_back({name, value});
  return l;
}

void PathMetrics(Families& f, const Labels& mount, const engine::ConnectionStats& c) {
  const Labels path = With(mount, "path", c.endpoint);
  f.Gauge("mpnfs_path_up", "Whether the connection is up (1) or not (0)", path,
          c.state == "up" ? 1 : 0);
  for (const char* st : {"down", "connecting", "probing", "up"}) {
    f.Gauge("mpnfs_path_state", "The connection's state: 1 for the current one",
            With(path, "state", st), c.state == st ? 1 : 0);
  }
  f.Counter("mpnfs_path_transitions_total", "State changes of the connection", path,
            static_cast<double>(c.transitions));
  if (!c.history.empty()) {
    const auto t = c.history.back().last.time_since_epoch();
    f.Gauge("mpnfs_path_last_transition_timestamp_seconds",
            "Unix time of the connection's last state change", path,
            std::chrono::duration<double>(t).count());
  }
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    f.Counter(name, help, path, static_cast<double>(v));
  };
  counter("mpnfs_path_transmissions_total", "Calls sent, retransmissions included", c.calls);
  counter("mpnfs_path_replies_total", "Replies received", c.replies);
  counter("mpnfs_path_errors_total", "Calls that ended without a reply", c.errors);
  counter("mpnfs_path_retransmits_total", "Calls sent again after timeo", c.retransmits);
  counter("mpnfs_path_reissues_total", "Calls resent after their connection broke", c.reissues);
  counter("mpnfs_path_reconnects_total", "Times the connection was lost while up", c.reconnects);
  counter("mpnfs_path_failovers_total", "Times the connection was declared dead (path_timeout)",
          c.failovers);
  counter("mpnfs_path_probes_total", "NFS NULL probes sent", c.probes);
  counter("mpnfs_path_sent_bytes_total", "WRITE data sent", c.bytes_out);
  counter("mpnfs_path_received_bytes_total", "READ data received", c.bytes_in);
  f.Gauge("mpnfs_path_inflight_calls", "Calls sent and not answered", path,
          static_cast<double>(c.inflight));
  f.Gauge("mpnfs_path_queued_calls", "Calls waiting to be sent on the connection", path,
          static_cast<double>(c.queued));
  f.Gauge("mpnfs_path_outstanding_bytes", "Bytes queued and in flight (the balancer divides them by the path's weight)",
          path, static_cast<double>(c.outstanding_bytes));
  f.Gauge("mpnfs_path_weight",
          "The weight of the connection's path now (weight=, mpnfsctl path weight; each connection of a path repeats it)",
          path,
          static_cast<double>(c.weight));
  f.Gauge("mpnfs_path_link_rate_bytes_per_second",
          "What the connection's link carries, timed on large records (the balancer divides outstanding bytes by it "
          "unless weights are given; 0: unknown)",
          path, static_cast<double>(c.link_rate_bps));
  f.Gauge("mpnfs_path_throughput_bytes_per_second",
          "Recent throughput while busy (0 until measured)", path, static_cast<double>(c.rate_bps));
  f.Gauge("mpnfs_path_sojourn_seconds",
          "Recent mean time from queued to answered, weighted by bytes (0 until measured)",
          path, static_cast<double>(c.sojourn_us) / 1e6);

  static constexpr const char* kStable[] = {"unstable", "data_sync", "file_sync"};
  for (int p = 0; p < engine::kProcCount; ++p) {
    const engine::OpStats& o = c.ops[p];
    if (o.ops == 0 && o.transmissions == 0) continue;
    const Labels op = With(path, "op", engine::ProcName(static_cast<engine::Proc>(p)));
    auto opc = [&](const char* name, const char* help, double v) { f.Counter(name, help, op, v); };
    opc("mpnfs_rpc_ops_total", "Calls of the procedure that ended (answered, failed or timed out)",
        static_cast<double>(o.ops));
    opc("mpnfs_rpc_transmissions_total", "Sends of the procedure's calls, resends included",
        static_cast<double>(o.transmissions));
    opc("mpnfs_rpc_retransmits_total", "Sends after timeo passed unanswered",
        static_cast<double>(o.retransmits));
    opc("mpnfs_rpc_errors_total", "Calls that ended without a reply (RPC failure, soft timeout)",
        static_cast<double>(o.errors));
    opc("mpnfs_rpc_nfs_errors_total", "Replies with an NFS status other than NFS3_OK",
        static_cast<double>(o.nfs_errors));
    opc("mpnfs_rpc_sent_bytes_total", "Data sent by the procedure's calls (WRITE payload)",
        static_cast<double>(o.bytes_out));
    opc("mpnfs_rpc_received_bytes_total", "Data received in replies (READ payload)",
        static_cast<double>(o.bytes_in));
    opc("mpnfs_rpc_execute_seconds_total",
        "Submit-to-end time of the calls that ended (queueing and resends included)",
        static_cast<double>(o.exe_us) * 1e-6);
    f.Histogram("mpnfs_rpc_rtt_seconds", "Send-to-reply time of answered calls", op, o.rtt);
    if (p == static_cast<int>(engine::Proc::kWrite)) {
      for (int k = 0; k < engine::kStabilityCount; ++k) {
        const Labels st = With(path, "stable", kStable[k]);
        f.Counter("mpnfs_rpc_write_ops_total", "WRITE calls that ended, by stability", st,
                  static_cast<double>(c.write_stability[k].ops));
        f.Counter("mpnfs_rpc_write_bytes_total", "Data of the WRITE calls that ended, by stability",
                  st, static_cast<double>(c.write_stability[k].bytes));
      }
    }
  }
}

void CacheMetrics(Families& f, const Labels& mount, const cache::CacheStats& k) {
  f.Gauge("mpnfs_cache_info", "The SSD cache's mode", With(mount, "mode", k.mode), 1);
  for (const char* st : {"healthy", "degraded", "out"}) {
    f.Gauge("mpnfs_cache_state", "The SSD cache's state: 1 for the current one",
            With(mount, "state", st), k.state == st ? 1 : 0);
  }
  auto gauge = [&](const char* name, const char* help, double v) { f.Gauge(name, help, mount, v); };
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    f.Counter(name, help, mount, static_cast<double>(v));
  };
  gauge("mpnfs_cache_capacity_bytes", "Capacity of the SSD cache",
        static_cast<double>(k.capacity_bytes));
  gauge("mpnfs_cache_used_bytes", "Valid pages in the SSD cache",
        static_cast<double>(k.used_bytes));
  gauge("mpnfs_cache_slots", "Block slots of the SSD cache", static_cast<double>(k.slots));
  gauge("mpnfs_cache_slots_used", "Block slots in use", static_cast<double>(k.slots_used));
  gauge("mpnfs_cache_dirty_bytes", "Unflushed write-back data", static_cast<double>(k.dirty_bytes));
  gauge("mpnfs_cache_checksum_ram_bytes", "RAM holding the cache's page checksums",
        static_cast<double>(k.checksum_ram_bytes));
  gauge("mpnfs_cache_dirty_blocks", "Blocks holding unflushed data",
        static_cast<double>(k.dirty_blocks));
  gauge("mpnfs_cache_dirty_age_seconds", "Age of the oldest unflushed write (0: none)",
        k.dirty_age_s);
  gauge("mpnfs_cache_flush_rate_bytes_per_second", "Bytes flushed per second over the last 10 s",
        static_cast<double>(k.flush_rate_bps));
  counter("mpnfs_cache_read_hits_total", "Reads served whole from the cache", k.read_hits);
  counter("mpnfs_cache_read_misses_total", "Reads not served whole from the cache", k.read_misses);
  counter("mpnfs_cache_read_bypasses_total", "Sequential reads past seq_cutoff", k.read_bypasses);
  counter("mpnfs_cache_writes_total", "Writes seen (stored, in write-back mode)", k.writes);
  counter("mpnfs_cache_write_hits_total", "Writes whose cached blocks were updated", k.write_hits);
  counter("mpnfs_cache_write_bypasses_total", "Sequential writes past seq_cutoff",
          k.write_bypasses);
  counter("mpnfs_cache_pages_filled_total", "Pages stored in the cache", k.pages_filled);
  counter("mpnfs_cache_evictions_total", "Blocks evicted", k.evictions);
  counter("mpnfs_cache_invalidations_total", "Pages invalidated by writes", k.invalidations);
  counter("mpnfs_cache_files_dropped_total", "Files dropped because they changed elsewhere",
          k.files_dropped);
  counter("mpnfs_cache_checksum_failures_total", "Cached pages whose checksum failed",
          k.checksum_failures);
  counter("mpnfs_cache_device_errors_total", "I/O errors of the cache device", k.device_errors);
  counter("mpnfs_cache_checksum_reads_total",
          "Frames of page checksums read back from the cache disk (cache_crc_ram)", k.checksum_reads);
  counter("mpnfs_cache_checksum_writes_total",
          "Frames of page checksums written out to the cache disk (cache_crc_ram)", k.checksum_writes);
  counter("mpnfs_cache_flushed_bytes_total", "Write-back data flushed to the server",
          k.flushed_bytes);
  counter("mpnfs_cache_flush_errors_total", "Flusher rounds that failed", k.flush_errors);
  counter("mpnfs_cache_copies_total", "Blocks copied because a write overwrote unflushed pages",
          k.copies);
  counter("mpnfs_cache_copies_to_partner_total",
          "Copies that went back to the block's previous slot, writing only what changed",
          k.copies_to_partner);
  counter("mpnfs_cache_copied_pages_total", "Pages copies read and wrote again", k.copied_pages);
  counter("mpnfs_cache_rewrites_in_place_total",
          "Writes over unflushed pages that no commit had declared yet, done without a copy",
          k.rewrites_in_place);
  counter("mpnfs_cache_tombstones_total",
          "Freed slots held until the free of an older copy of their block is durable", k.tombstones);
  counter("mpnfs_cache_writes_around_total", "Writes sent to the server: no room or degraded cache",
          k.wb_arounds);
}

// The calls to the server's other services (nfs/service_stats.h), by
// `service`: PORTMAP, MOUNT, NSM (one call at a time), NLM (its own
// connection, whose state is exported too).
void ServiceMetrics(Families& f, const Labels& mount, const nfs::ServiceStats& v) {
  const Labels svc = With(mount, "service", v.service);
  const auto& o = v.calls;
  auto counter = [&](const char* name, const char* help, double x) { f.Counter(name, help, svc, x); };
  counter("mpnfs_service_ops_total", "Calls to the service that ended (answered, failed or timed out)",
          static_cast<double>(o.ops));
  counter("mpnfs_service_transmissions_total", "Sends of the service's calls, resends included",
          static_cast<double>(o.transmissions));
  counter("mpnfs_service_retransmits_total", "Sends after timeo passed unanswered",
          static_cast<double>(o.retransmits));
  counter("mpnfs_service_errors_total", "Calls to the service that ended without an answer",
          static_cast<double>(o.errors));
  counter("mpnfs_service_refusals_total",
          "Answers that refused (MOUNT's status other than OK, a program the portmapper does not know)",
          static_cast<double>(o.nfs_errors));
  f.Histogram("mpnfs_service_rtt_seconds", "Send-to-reply time of the service's answered calls", svc, o.rtt);
  if (v.service == "NLM") {
    f.Gauge("mpnfs_service_up", "Whether the service's connection is up (1) or not (0)", svc,
            v.state == "up" ? 1 : 0);
    counter("mpnfs_service_reconnects_total", "Times the service's connection was lost while up",
            static_cast<double>(v.reconnects));
    f.Counter("mpnfs_locks_lost_total",
              "Locks the server no longer granted when asked again after its restart", mount,
              static_cast<double>(v.lost_locks));
  }
}

}  // namespace

std::vector<MetricFamily> MetricFamilies(const MountSnapshot& s) {
  Families f;
  const Labels mount = {{"mount", s.mountpoint}};
  f.Gauge("mpnfs_mount_info", "The mount's NFS source", With(mount, "source", s.source), 1);
  f.Gauge("mpnfs_uptime_seconds", "Time since the mount started", mount, s.uptime_s);
  for (const auto& c : s.conns) PathMetrics(f, mount, c);
  if (s.cache) CacheMetrics(f, mount, *s.cache);
  for (const auto& v : s.services) ServiceMetrics(f, mount, v);
  if (s.fuse) {
    f.Gauge("mpnfs_fuse_transport_info", "How FUSE requests reach mpnfs: io_uring or device (/dev/fuse)",
            With(mount, "transport", s.fuse->transport), 1);
    f.Counter("mpnfs_fuse_requests_total", "FUSE requests received, by the way they came",
              With(mount, "transport", "io_uring"), static_cast<double>(s.fuse->ring_requests));
    f.Counter("mpnfs_fuse_requests_total", "FUSE requests received, by the way they came",
              With(mount, "transport", "device"), static_cast<double>(s.fuse->device_requests));
  }
  return f.Take();
}

std::string PrometheusText(const MountSnapshot& s) {
  return prometheus::TextSerializer().Serialize(MetricFamilies(s));
}

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& listen,
                                                            SnapshotFn fn) {
  std::unique_ptr<MetricsServer> m(new MetricsServer());
  m->collectable_ = std::make_shared<StatsCollectable>(std::move(fn));
  try {
    m->exposer_ = std::make_unique<prometheus::Exposer>(listen, 1);
  } catch (const std::exception& e) {
    return Error::Errno(EADDRINUSE,
                        "metrics=" + listen + ": cannot listen there (" + e.what() + ")");
  }
  m->exposer_->RegisterCollectable(m->collectable_);
  return m;
}

MetricsServer::~MetricsServer() = default;

}  // namespace mpnfs::cli
