#include "cli/help.h"

#include <algorithm>

#include "cli/options.h"

namespace mpnfs::cli {

const std::vector<OptionHelp>& OptionHelpTable() {
  static const std::vector<OptionHelp> table = {
      {"Server", "path=ADDR[+ADDR...]", "path=10.0.1.2+10.0.2.2", "server addresses, one network path each (SERVER)"},
      {"Server", "local=L[+L...]", "path=10.0.1.2+10.0.2.2,local=eth1+eth2", "bind the k-th path to this interface or address"},
      {"Server", "weight=W[+W...]", "path=10.0.1.2+10.0.2.2,weight=1+10", "relative speed of the k-th path, 1-1000 (link rates, measured)"},
      {"Server", "path_timeout=MS", "path_timeout=400", "silent this long while another path answers: dead (400)"},
      {"Server", "resend_fence=MS", "resend_fence=5000", "state-changing calls of a lost connection: resent after (2000)"},
      {"Server", "tab=FILE", "tab=/etc/mpnfstab", "mpnfstab(5) file to read first"},
      {"Server", "port=N", "port=2049", "NFS service port (2049)"},
      {"Server", "mountport=N", "mountport=20048", "MOUNT service port (ask the portmapper)"},
      {"Server", "mount_timeout=SECONDS", "mount_timeout=30", "give up mounting after this long (30)"},
      {"Failure handling", "hard", "hard", "retry unanswered calls for ever (default)"},
      {"Failure handling", "soft", "soft", "fail a call with EIO after timeo/retrans"},
      {"Failure handling", "timeo=DECISECONDS", "timeo=600", "wait before the first retransmission (600)"},
      {"Failure handling", "retrans=N", "retrans=2", "retransmissions before a major timeout (2)"},
      {"Failure handling", "tcp_timeout=SECONDS", "tcp_timeout=15", "sent data unacknowledged this long: connection dead (15)"},
      {"Data path", "rsize=BYTES, wsize=BYTES", "rsize=1048576,wsize=1048576", "largest READ / WRITE call (1 MiB)"},
      {"Data path", "direct_io", "direct_io", "no kernel page cache for data files"},
      {"Data path", "write_behind=MIB", "write_behind=64", "page-cache writes sent before acknowledged, per file (64)"},
      {"Data path", "sync", "sync", "every write FILE_SYNC, no write-behind"},
      {"Data path", "read_ahead_kb=KB", "read_ahead_kb=4096", "kernel readahead of the mount (4096; 1024 per path beyond 4)"},
      {"Data path", "max_inflight=N", "max_inflight=128", "calls in flight per connection (128)"},
      {"Data path", "conns_per_path=N", "conns_per_path=1", "TCP connections per path (1)"},
      {"Data path", "loops=N", "loops=0", "event-loop threads (0: one per core)"},
      {"Data path", "busy_poll=US", "busy_poll=200", "at queue depth 1, poll for the reply this long, not sleep (0)"},
      {"Data path", "max_background=N", "max_background=512", "FUSE background requests (512)"},
      {"Data path", "fuse_uring=auto|on|off", "fuse_uring=auto", "FUSE requests through io_uring rings (off)"},
      {"Data path", "fuse_uring_depth=N", "fuse_uring_depth=32", "io_uring entries per CPU queue (32)"},
      {"Caching and consistency", "acregmin=S, acregmax=S", "acregmin=3,acregmax=60", "file attribute cache timeouts (3, 60)"},
      {"Caching and consistency", "acdirmin=S, acdirmax=S", "acdirmin=30,acdirmax=60", "directory attribute cache timeouts (30, 60)"},
      {"Caching and consistency", "actimeo=S", "actimeo=10", "all four attribute timeouts"},
      {"Caching and consistency", "noac", "noac", "no attribute caching"},
      {"Caching and consistency", "cto | nocto", "nocto", "close-to-open consistency (cto)"},
      {"Caching and consistency", "local_lock=none|flock|posix|all", "local_lock=flock", "locks kept on this host, not sent to the server (none)"},
      {"Caching and consistency", "lookupcache=all|positive|none", "lookupcache=positive", "names the kernel may cache: found and missing, found, none (all)"},
      {"Caching and consistency", "kernel_cache | nokernel_cache", "kernel_cache", "data changes only through this mount: keep cached pages (no)"},
      {"Caching and consistency", "readdirplus | noreaddirplus", "noreaddirplus", "list directories with attributes (readdirplus)"},
      {"SSD cache", "cache_dir=DIR", "cache_dir=/var/cache/mpnfs", "directory of the SSD cache (turns it on)"},
      {"SSD cache", "cache_size=SIZE", "cache_dir=/c,cache_size=50G", "size of the cache, K, M, G or T (1G)"},
      {"SSD cache", "cache_mode=off|readonly|writethrough|writeback", "cache_dir=/c,cache_mode=writeback", "what the cache takes (readonly)"},
      {"SSD cache", "cache_block=KIB", "cache_dir=/c,cache_block=256", "allocation unit, 64 to 1024 KiB (256)"},
      {"SSD cache", "seq_cutoff=MIB", "cache_dir=/c,seq_cutoff=4", "longer sequential runs bypass the cache (4)"},
      {"SSD cache", "admit=first|second", "cache_dir=/c,admit=second", "cache a block on its first or second miss (first)"},
      {"SSD cache", "fill=page|block", "cache_dir=/c,fill=block", "a read miss fills the pages read, or whole blocks (page)"},
      {"SSD cache", "cache_crc_ram=SIZE", "cache_dir=/c,cache_crc_ram=64M", "RAM for page checksums; the rest on the cache disk (4M or 1/32)"},
      {"SSD cache", "cache_direct", "cache_dir=/c,cache_direct", "O_DIRECT I/O on the cache files"},
      {"SSD cache", "cache_optional", "cache_dir=/c,cache_optional", "mount uncached if the cache cannot be used"},
      {"SSD cache", "wb_fsync=cache|server", "cache_dir=/c,cache_mode=writeback,wb_fsync=server", "where fsync makes data durable (cache)"},
      {"SSD cache", "dirty_high=PCT, dirty_low=PCT", "cache_dir=/c,cache_mode=writeback,dirty_high=80,dirty_low=60", "flush above / down to these dirty levels (50, 25)"},
      {"SSD cache", "dirty_age=SECONDS", "cache_dir=/c,cache_mode=writeback,dirty_age=30", "flush dirty data older than this (30)"},
      {"SSD cache", "wb_noflush", "cache_dir=/c,cache_mode=writeback,wb_noflush", "unmount without flushing (write-back)"},
      {"Access control", "allow_other", "allow_other", "let other users use the mount"},
      {"Access control", "default_permissions", "default_permissions", "kernel checks permission bits (default)"},
      {"Access control", "nodefault_permissions", "nodefault_permissions", "only the server checks permissions"},
      {"Logging", "log_level=LEVEL", "log_level=debug", "trace, debug, info, warn, error, critical, off (info)"},
      {"Logging", "debug", "debug", "foreground, debug logging and FUSE tracing"},
      {"Statistics", "metrics=PORT|ADDR:PORT", "metrics=9100", "serve Prometheus metrics over HTTP (off; PORT: loopback)"},
  };
  return table;
}

std::string HelpText() {
  std::string out = UsageText();
  out +=
      "\nFlags:\n"
      "    -f                   stay in the foreground, log to standard error\n"
      "    -d                   debug: -f, log_level=debug and FUSE request tracing\n"
      "    --sloppy             name and ignore unknown options instead of failing\n"
      "    -h, --help           this summary\n"
      "    -V, --version        the version\n"
      "\nOptions (-o OPT[,OPT...]; defaults in brackets; mpnfs(8) has the details):\n";
  size_t width = 0;
  for (const auto& o : OptionHelpTable()) width = std::max(width, std::string(o.syntax).size());
  width = std::min<size_t>(width, 28);
  std::string section;
  for (const auto& o : OptionHelpTable()) {
    if (section != o.section) {
      section = o.section;
      out += "  " + section + ":\n";
    }
    std::string syntax = o.syntax;
    out += "    " + syntax;
    if (syntax.size() < width) {
      out += std::string(width - syntax.size(), ' ');
    } else {
      out += "\n    " + std::string(width, ' ');
    }
    out += "  " + std::string(o.text) + "\n";
  }
  out +=
      "  Generic: ro, rw, nosuid, nodev, noexec, noatime, allow_root, auto_unmount,\n"
      "    fsname=NAME, subtype=NAME ... go to the FUSE mount; _netdev, nofail,\n"
      "    x-systemd.* and other fstab options are accepted and ignored.\n";
  return out;
}

}  // namespace mpnfs::cli
