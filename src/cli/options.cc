#include "cli/options.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <functional>
#include <map>
#include <set>

namespace mpnfs::cli {
namespace {

Error Bad(const std::string& msg) { return Error::Errno(EINVAL, msg); }

bool ToInt(const std::string& s, long lo, long hi, long* out) {
  long v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v < lo || v > hi) return false;
  *out = v;
  return true;
}

// Options handed to the FUSE kernel mount unchanged.
const std::set<std::string> kFusePassthrough = {
    "allow_other", "allow_root", "auto_unmount", "ro", "rw", "suid",
    "nosuid", "dev", "nodev", "exec", "noexec", "atime", "noatime", "relatime", "norelatime",
    "strictatime", "nostrictatime", "dirsync", "async", "lazytime", "nolazytime"};
// Accepted for /etc/fstab and mount(8), meaningless to mpnfs.
const std::set<std::string> kFstabOnly = {"_netdev", "nofail", "noauto", "auto", "user", "nouser",
                                          "users", "owner", "group", "defaults", "bg", "fg"};

}  // namespace

std::optional<int> ParseWeight(const std::string& s) {
  long v = 0;
  if (!ToInt(s, 1, engine::kMaxWeight, &v)) return std::nullopt;
  return static_cast<int>(v);
}

bool SplitSource(const std::string& src, std::string* server, std::string* export_path) {
  auto colon = src.find(':');
  if (colon == std::string::npos || colon == 0) return false;
  // [v6addr]:/export
  if (src[0] == '[') {
    auto close = src.find(']');
    if (close == std::string::npos || close + 1 >= src.size() || src[close + 1] != ':') return false;
    *server = src.substr(1, close - 1);
    *export_path = src.substr(close + 2);
  } else {
    *server = src.substr(0, colon);
    *export_path = src.substr(colon + 1);
  }
  return !export_path->empty() && (*export_path)[0] == '/';
}

std::string UsageText() {
  return "usage: mpnfs SERVER:/EXPORT MOUNTPOINT [-f] [-d] [--sloppy] [-o OPTION[,OPTION...]]\n"
         "       mount.mpnfs SERVER:/EXPORT MOUNTPOINT [-sfnv] [-o OPTION[,OPTION...]]\n"
         "       mpnfs -h | --help | -V | --version\n"
         "Mounts an NFSv3 export through FUSE. Options: see mpnfs(8).\n";
}

Result<std::string> ParseMetricsAddress(const std::string& value) {
  const std::string what = "metrics= needs PORT, ADDR:PORT or [IPv6]:PORT (numeric addresses), not '" +
                           value + "'";
  std::string addr = "127.0.0.1", port = value;
  if (!value.empty() && value[0] == '[') {
    const auto close = value.find("]:");
    if (close == std::string::npos) return Bad(what);
    addr = value.substr(1, close - 1);
    port = value.substr(close + 2);
    in6_addr a6;
    if (inet_pton(AF_INET6, addr.c_str(), &a6) != 1) return Bad(what);
    addr = "[" + addr + "]";
  } else if (const auto colon = value.rfind(':'); colon != std::string::npos) {
    addr = value.substr(0, colon);
    port = value.substr(colon + 1);
    in_addr a4;
    if (inet_pton(AF_INET, addr.c_str(), &a4) != 1) return Bad(what);
  }
  long p = 0;
  if (!ToInt(port, 1, 65535, &p)) return Bad(what);
  return addr + ":" + std::to_string(p);
}

Result<HelperArgs> TranslateHelperArgs(const std::vector<std::string>& argv) {
  HelperArgs h;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    auto value = [&](const char* what) -> Result<std::string> {
      if (i + 1 >= argv.size()) return Bad(std::string("option ") + what + " needs an argument");
      return argv[++i];
    };
    if (a == "-h" || a == "--help" || a == "-V" || a == "--version") {
      h.args.push_back(a);
    } else if (a == "-o") {
      auto v = value("-o");
      if (!v) return v.error();
      h.args.push_back("-o");
      h.args.push_back(*v);
    } else if (a.rfind("-o", 0) == 0 && a.size() > 2) {
      h.args.push_back(a);
    } else if (a == "-t" || (a.rfind("-t", 0) == 0 && a.size() > 2)) {
      std::string type = a.substr(2);
      if (type.empty()) {
        auto v = value("-t");
        if (!v) return v.error();
        type = *v;
      }
      if (type != "mpnfs" && type != "fuse.mpnfs") return Bad("mount.mpnfs mounts type mpnfs, not " + type);
    } else if (a == "-N") {
      return Bad("mounting in another network namespace (-N) is not supported");
    } else if (a.size() > 1 && a[0] == '-' && a[1] != '-') {
      for (char c : a.substr(1)) {
        switch (c) {
          case 's': h.args.push_back("--sloppy"); break;
          case 'f': h.fake = true; break;
          case 'n': break;
          case 'v': h.verbose = true; break;
          default: return Bad(std::string("unknown flag -") + c + " (mount.mpnfs takes -s, -f, -n, -v, -o, -t)");
        }
      }
    } else if (!a.empty() && a[0] == '-') {
      return Bad("unknown argument '" + a + "'");
    } else {
      h.args.push_back(a);
    }
  }
  return h;
}

Result<MountOptions> ParseMountArgs(const std::vector<std::string>& args) {
  MountOptions m;
  std::vector<std::string> positional;
  std::vector<std::string> opt_strings;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") {
      m.help = true;
    } else if (a == "-V" || a == "--version") {
      m.version = true;
    } else if (a == "-f") {
      m.foreground = true;
    } else if (a == "-d") {
      m.debug = true;
      m.foreground = true;
    } else if (a == "-s") {
      // single-threaded FUSE: accepted for compatibility, mpnfs is always multi-threaded
    } else if (a == "--sloppy") {
      m.sloppy = true;
    } else if (a == "-o") {
      if (i + 1 >= args.size()) return Bad("option -o needs an argument");
      opt_strings.push_back(args[++i]);
    } else if (a.rfind("-o", 0) == 0 && a.size() > 2) {
      opt_strings.push_back(a.substr(2));
    } else if (!a.empty() && a[0] == '-') {
      return Bad("unknown argument '" + a + "'");
    } else {
      positional.push_back(a);
    }
  }
  if (m.help || m.version) return m;
  if (positional.size() != 2) return Bad("expected SERVER:/EXPORT and MOUNTPOINT");
  if (!SplitSource(positional[0], &m.server, &m.export_path)) {
    return Bad("source '" + positional[0] + "' is not SERVER:/EXPORT");
  }
  m.mountpoint = positional[1];

  long timeo_ds = 600;
  bool have_actimeo = false;
  double actimeo = 0;
  struct Num {
    long lo, hi;
    std::function<void(long)> set;
  };
  std::string wb_opt;  // a write-back option seen (they need cache_mode=writeback)
  std::map<std::string, Num> nums = {
      {"port", {1, 65535, [&](long v) { m.port = static_cast<int>(v); }}},
      {"mountport", {1, 65535, [&](long v) { m.mount_port = static_cast<int>(v); }}},
      {"timeo", {1, 6000, [&](long v) { timeo_ds = v; }}},
      {"retrans", {0, 100, [&](long v) { m.engine.retrans = static_cast<int>(v); }}},
      {"rsize", {4096, 1 << 20, [&](long v) { m.fs.rsize = static_cast<uint32_t>(v); }}},
      {"wsize", {4096, 1 << 20, [&](long v) { m.fs.wsize = static_cast<uint32_t>(v); }}},
      {"acregmin", {0, 3600, [&](long v) { m.fs.acregmin = static_cast<double>(v); }}},
      {"acregmax", {0, 3600, [&](long v) { m.fs.acregmax = static_cast<double>(v); }}},
      {"acdirmin", {0, 3600, [&](long v) { m.fs.acdirmin = static_cast<double>(v); }}},
      {"acdirmax", {0, 3600, [&](long v) { m.fs.acdirmax = static_cast<double>(v); }}},
      {"actimeo", {0, 3600, [&](long v) { have_actimeo = true; actimeo = static_cast<double>(v); }}},
      {"max_inflight", {1, 65536, [&](long v) { m.engine.max_inflight = static_cast<int>(v); }}},
      {"conns_per_path", {1, 16, [&](long v) { m.engine.conns_per_path = static_cast<int>(v); }}},
      {"loops", {0, 64, [&](long v) { m.engine.loops = static_cast<int>(v); }}},
      {"mount_timeout", {1, 3600, [&](long v) { m.mount_timeout_s = static_cast<int>(v); }}},
      {"tcp_timeout", {0, 3600, [&](long v) {
         m.engine.tcp_user_timeout = std::chrono::seconds(v);
       }}},
      {"cache_block", {64, 1024, [&](long v) { m.cache.block = static_cast<uint32_t>(v) << 10; }}},
      {"seq_cutoff", {0, 1 << 20, [&](long v) { m.cache.seq_cutoff = static_cast<uint64_t>(v) << 20; }}},
      {"dirty_high", {1, 100, [&](long v) { wb_opt = "dirty_high="; m.cache.dirty_high = static_cast<uint32_t>(v); }}},
      {"dirty_low", {0, 99, [&](long v) { wb_opt = "dirty_low="; m.cache.dirty_low = static_cast<uint32_t>(v); }}},
      {"dirty_age", {1, 86400, [&](long v) { wb_opt = "dirty_age="; m.cache.dirty_age_s = static_cast<uint32_t>(v); }}},
      {"path_timeout", {0, 600000, [&](long v) {
         m.engine.path_timeout = std::chrono::milliseconds(v);
       }}},
      {"resend_fence", {0, 600000, [&](long v) {
         m.engine.resend_fence = std::chrono::milliseconds(v);
       }}},
      {"write_behind", {0, 4096, [&](long v) { m.fs.write_behind = static_cast<uint64_t>(v) << 20; }}},
      {"read_ahead_kb", {0, 1 << 20, [&](long v) { m.read_ahead_kb = static_cast<int>(v); }}},
      {"max_background", {1, 65535, [&](long v) { m.max_background = static_cast<int>(v); }}},
      {"busy_poll", {0, 100000, [&](long v) { m.engine.busy_poll = std::chrono::microseconds(v); }}},
      {"fuse_uring_depth", {1, 1024, [&](long v) { m.fuse_uring_depth = static_cast<int>(v); }}},
  };
  std::map<std::string, std::function<void()>> flags = {
      {"hard", [&] { m.engine.soft = false; }},
      {"soft", [&] { m.engine.soft = true; }},
      {"noac", [&] { have_actimeo = true; actimeo = 0; }},
      {"cto", [&] { m.fs.cto = true; }},
      {"nocto", [&] { m.fs.cto = false; }},
      {"kernel_cache", [&] { m.fs.kernel_cache = true; }},
      {"nokernel_cache", [&] { m.fs.kernel_cache = false; }},
      {"direct_io", [&] { m.fs.direct_io = true; }},
      {"sync", [&] { m.fs.sync = true; }},
      {"readdirplus", [&] { m.readdirplus = true; }},
      {"default_permissions", [&] { m.kernel_permissions = true; }},
      {"nodefault_permissions", [&] { m.kernel_permissions = false; }},
      {"noreaddirplus", [&] { m.readdirplus = false; }},
      {"debug", [&] { m.debug = true; m.foreground = true; }},
      {"cache_optional", [&] { m.cache_optional = true; }},
      {"cache_direct", [&] { m.cache.direct = true; }},
      {"wb_noflush", [&] { wb_opt = "wb_noflush"; m.cache.flush_on_unmount = false; }},
  };
  bool have_cache_mode = false;
  for (const auto& s : opt_strings) {
    size_t start = 0;
    while (start <= s.size()) {
      size_t end = s.find(',', start);
      if (end == std::string::npos) end = s.size();
      std::string opt = s.substr(start, end - start);
      start = end + 1;
      if (opt.empty()) continue;
      auto eq = opt.find('=');
      std::string key = opt.substr(0, eq);
      std::string val = eq == std::string::npos ? "" : opt.substr(eq + 1);
      if (auto it = nums.find(key); it != nums.end()) {
        long v;
        if (eq == std::string::npos || !ToInt(val, it->second.lo, it->second.hi, &v)) {
          return Bad("option " + key + "= needs a whole number from " +
                     std::to_string(it->second.lo) + " to " + std::to_string(it->second.hi));
        }
        it->second.set(v);
      } else if (auto f = flags.find(opt); f != flags.end()) {
        f->second();
      } else if (key == "path") {
        // path=ADDR, repeatable, or a '+'-separated list (commas separate options).
        size_t from = 0;
        while (from <= val.size()) {
          size_t plus = val.find('+', from);
          if (plus == std::string::npos) plus = val.size();
          std::string addr = val.substr(from, plus - from);
          if (addr.empty()) return Bad("path= needs an address (path=ADDR[+ADDR...])");
          if (std::find(m.paths.begin(), m.paths.end(), addr) != m.paths.end()) {
            return Bad("path " + addr + " is given twice");
          }
          m.paths.push_back(addr);
          from = plus + 1;
        }
        if (m.paths.size() > 8) return Bad("at most 8 paths");
      } else if (key == "local") {
        // local=L, repeatable, or a '+'-separated list; the k-th binds the k-th path.
        if (val.empty()) return Bad("local= needs an interface or address (local=L[+L...])");
        size_t from = 0;
        while (from <= val.size()) {
          size_t plus = val.find('+', from);
          if (plus == std::string::npos) plus = val.size();
          m.locals.push_back(val.substr(from, plus - from));  // "" keeps that path unbound
          from = plus + 1;
        }
      } else if (key == "weight") {
        // weight=W[+W...]; the k-th weighs the k-th path. The last weight=
        // counts (so the command line overrides an mpnfstab block's).
        if (val.empty()) return Bad("weight= needs a number (weight=W[+W...], 1 to 1000)");
        m.weights.clear();
        size_t from = 0;
        while (from <= val.size()) {
          size_t plus = val.find('+', from);
          if (plus == std::string::npos) plus = val.size();
          const std::string w = val.substr(from, plus - from);
          const std::optional<int> v = w.empty() ? 1 : ParseWeight(w);  // "": the default
          if (!v) return Bad("bad weight '" + w + "' (1 to " + std::to_string(engine::kMaxWeight) + ")");
          m.weights.push_back(*v);
          from = plus + 1;
        }
      } else if (key == "cache_dir") {
        if (val.empty() || val[0] != '/') return Bad("cache_dir= needs an absolute directory path");
        m.cache.dir = val;
      } else if (key == "cache_size" || key == "cache_crc_ram") {
        // N with an optional K, M, G or T (powers of 1024); plain N is bytes.
        size_t used = 0;
        unsigned long long n = 0;
        try {
          n = std::stoull(val, &used);
        } catch (...) {
          used = 0;
        }
        static const std::string kUnits = "KMGT";
        int shift = 0;
        if (used > 0 && used + 1 == val.size() && kUnits.find(std::toupper(val.back())) != std::string::npos) {
          shift = 10 * (1 + static_cast<int>(kUnits.find(std::toupper(val.back()))));
        } else if (used != val.size()) {
          used = 0;
        }
        if (used == 0 || n == 0 || (shift > 0 && n > (~0ull >> shift))) {
          return Bad(key + "= needs a size such as " + (key == "cache_size" ? "512M or 50G" : "4M or 64M"));
        }
        (key == "cache_size" ? m.cache.size : m.cache.crc_ram) = n << shift;
      } else if (key == "cache_mode") {
        if (val == "off") {
          m.cache.mode = cache::CacheMode::kOff;
        } else if (val == "readonly") {
          m.cache.mode = cache::CacheMode::kReadOnly;
        } else if (val == "writethrough") {
          m.cache.mode = cache::CacheMode::kWriteThrough;
        } else if (val == "writeback") {
          m.cache.mode = cache::CacheMode::kWriteBack;
        } else {
          return Bad("cache_mode= must be off, readonly, writethrough or writeback");
        }
        have_cache_mode = true;
      } else if (key == "wb_fsync") {
        if (val != "cache" && val != "server") return Bad("wb_fsync= must be cache or server");
        m.cache.fsync_server = val == "server";
        wb_opt = "wb_fsync=";
      } else if (key == "fuse_uring") {
        using U = MountOptions::FuseUring;
        if (val == "auto") {
          m.fuse_uring = U::kAuto;
        } else if (val == "on") {
          m.fuse_uring = U::kOn;
        } else if (val == "off") {
          m.fuse_uring = U::kOff;
        } else {
          return Bad("fuse_uring= must be auto, on or off");
        }
      } else if (key == "local_lock") {
        if (val != "none" && val != "flock" && val != "posix" && val != "all") {
          return Bad("local_lock= must be none, flock, posix or all");
        }
        m.local_flocks = val == "flock" || val == "all";
        m.local_posix_locks = val == "posix" || val == "all";
      } else if (key == "lookupcache") {
        using LC = fs::FsOptions::LookupCache;
        if (val == "all") {
          m.fs.lookupcache = LC::kAll;
        } else if (val == "positive" || val == "pos") {
          m.fs.lookupcache = LC::kPositive;
        } else if (val == "none") {
          m.fs.lookupcache = LC::kNone;
        } else {
          return Bad("lookupcache= must be all, positive (pos) or none");
        }
      } else if (key == "admit") {
        if (val != "first" && val != "second") return Bad("admit= must be first or second");
        m.cache.admit_second = val == "second";
      } else if (key == "fill") {
        if (val != "page" && val != "block") return Bad("fill= must be page or block");
        m.cache.fill_block = val == "block";
      } else if (key == "metrics") {
        auto a = ParseMetricsAddress(val);
        if (!a) return a.error();
        m.metrics = *a;
      } else if (key == "tab") {
        if (val.empty()) return Bad("tab= needs a file name");
        m.tab = val;
      } else if (key == "log_level") {
        static const std::set<std::string> levels = {"trace", "debug", "info", "warn",
                                                     "error", "critical", "off"};
        if (!levels.count(val)) return Bad("log_level= must be one of trace, debug, info, warn, error, critical, off");
        m.log_level = val;
      } else if (kFusePassthrough.count(opt)) {
        m.fuse_opts.push_back(opt);
      } else if (kFstabOnly.count(opt) || key.rfind("x-", 0) == 0 || key == "comment") {
        // fstab / systemd bookkeeping: not ours to act on
      } else if (key == "fsname" || key == "subtype") {
        m.fuse_opts.push_back(opt);
      } else if (opt == "remount") {
        // (mount -o remount: through mount.mpnfs or mount.fuse3 alike.)
        return Bad("remount is not supported: a running mount's options are not changed by mounting "
                   "again; unmount and mount, or change paths and weights online with mpnfsctl(8)");
      } else if (m.sloppy) {
        m.ignored.push_back(opt);
      } else {
        return Bad("unknown option '" + opt + "' (see mpnfs(8))");
      }
      if (end == s.size()) break;
    }
  }
  if (m.locals.size() > std::max<size_t>(1, m.paths.size())) {
    return Bad("more local= entries (" + std::to_string(m.locals.size()) + ") than paths (" +
               std::to_string(std::max<size_t>(1, m.paths.size())) + ")");
  }
  if (m.kernel_permissions) m.fuse_opts.push_back("default_permissions");
  if (!m.cache.dir.empty() && !have_cache_mode) m.cache.mode = cache::CacheMode::kReadOnly;
  if (m.cache.mode != cache::CacheMode::kOff && m.cache.dir.empty()) {
    return Bad("cache_mode= needs cache_dir=");
  }
  if ((m.cache.block & (m.cache.block - 1)) != 0) return Bad("cache_block= must be a power of two (KiB)");
  if (!wb_opt.empty() && m.cache.mode != cache::CacheMode::kWriteBack) {
    return Bad(wb_opt + " applies to cache_mode=writeback only");
  }
  if (m.cache.dirty_low >= m.cache.dirty_high) return Bad("dirty_low= must be below dirty_high=");
  if (have_actimeo) m.fs.acregmin = m.fs.acregmax = m.fs.acdirmin = m.fs.acdirmax = actimeo;
  if (m.fs.acregmin > m.fs.acregmax) return Bad("acregmin must not exceed acregmax");
  if (m.fs.acdirmin > m.fs.acdirmax) return Bad("acdirmin must not exceed acdirmax");
  m.engine.timeo = std::chrono::milliseconds(timeo_ds * 100);
  m.engine.connect_timeout = std::min<std::chrono::milliseconds>(
      m.engine.timeo, std::chrono::seconds(m.mount_timeout_s));
  // A cache_dir still held by an earlier mount (flushing after its unmount
  // returned) is waited for as long as a mount may take.
  m.cache.lock_wait = std::chrono::seconds(m.mount_timeout_s);
  return m;
}

int DefaultReadAheadKb(size_t paths) { return static_cast<int>(std::max<size_t>(4, paths)) * 1024; }

}  // namespace mpnfs::cli
