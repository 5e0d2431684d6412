// mpnfs: mount an NFSv3 export through FUSE.
//
// Start-up order matters: options are parsed, then (unless -f) the process
// forks before any thread exists; the child mounts and reports the outcome
// through a pipe, so the command returns only once the mount is usable or
// has failed, with a message and exit code saying why. Exit codes follow
// mount(8): 1 bad usage or option, 32 mount failure.
#include <arpa/inet.h>
#include <fcntl.h>
#include <malloc.h>
#include <netdb.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <climits>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cli/calibrate.h"
#include "cli/control.h"
#include "cli/lock_service.h"
#include "cli/metrics.h"
#include "cli/mpnfstab.h"
#include "cli/options.h"
#include "cli/help.h"
#include "cli/path_control.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/timer.h"
#include "engine/engine.h"
#include "nfs/local_bind.h"
#include "fs/filesystem.h"
#include "fs/owner.h"
#include "fuse/fuse_ops.h"
#include "fuse/transport.h"
#include "mpnfs_config.h"
#include "nfs/rpc_transport.h"
#include "nfs/mount3.h"
#include "nfs/nfs3.h"
#include "nfs/wait.h"

namespace mpnfs {
namespace {

// The mount's statistics now (any thread).
cli::MountSnapshot Snapshot(engine::Engine& eng, fs::Filesystem& filesystem,
                            const nfs::ServiceCounters& services, const cli::LockService* lock_service,
                            const std::string& source, const std::string& mp,
                            std::chrono::steady_clock::time_point started,
                            const fuse::FuseTransport* transport) {
  cli::MountSnapshot s;
  s.source = source;
  s.mountpoint = mp;
  s.uptime_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  s.conns = eng.Stats();
  if (auto cache = filesystem.cache()) s.cache = cache->Stats();
  s.services = services.Snapshot();
  if (lock_service != nullptr) s.services.push_back(lock_service->Stats());
  if (transport != nullptr) s.fuse = transport->stats();
  return s;
}

// Runs filesystem.FlushCache() on a thread of its own and, until it returns,
// calls report(meter) every `every` with the dirty bytes left, the rate and
// the time to go; report returning false stops the reports (the flush goes on).
Result<Ok> FlushWithProgress(fs::Filesystem& filesystem, cache::BlockCache& c,
                             std::chrono::milliseconds every,
                             const std::function<bool(const cli::FlushMeter&)>& report) {
  Mutex mu;
  CondVar cv;
  bool done = false;
  Result<Ok> result = Ok{};
  std::thread flush([&] {
    auto r = filesystem.FlushCache();
    MutexLock lock(mu);
    result = std::move(r);
    done = true;
    cv.SignalAll();
  });
  cli::FlushMeter meter;
  const auto t0 = std::chrono::steady_clock::now();
  bool reporting = true;
  MutexLock lock(mu);
  for (;;) {
    const auto until = std::chrono::steady_clock::now() + every;
    while (!done && cv.WaitUntil(mu, until)) {
    }
    if (done) break;
    if (!reporting) continue;
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    meter.Sample(t, c.Stats().dirty_bytes);
    lock.Unlock();
    reporting = report(meter);
    lock.Lock();
  }
  lock.Unlock();
  flush.join();
  return result;
}

// Answers one control-socket command (see cli/control.h, mpnfsctl(8)).
// Runs on the command's own thread (never an engine loop thread).
void Control(const std::string& cmd, bool privileged, cli::Reply& out, engine::Engine& eng,
             fs::Filesystem& filesystem, nfs::Nfs3& nfs, const nfs::Fh& root,
             const cli::SnapshotFn& snapshot, const cli::MountOptions& m) {
  if (cmd == "stats") {
    const cli::MountSnapshot s = snapshot();
    out.Text(cli::StatsJson(s.source, s.mountpoint, s.conns, s.cache ? &*s.cache : nullptr,
                            s.uptime_s, s.services, s.fuse ? &*s.fuse : nullptr));
    return;
  }
  if (cmd == "stats prometheus") {
    out.Text(cli::PrometheusText(snapshot()));
    return;
  }
  if (cmd == "path" || cmd.rfind("path ", 0) == 0) {
    out.Text(cli::PathCommand(cmd, privileged, eng));
    return;
  }
  if (cmd == "calibrate" || cmd.rfind("calibrate ", 0) == 0) {
    if (!privileged) {
      out.Line("error: only root may calibrate (it writes a scratch file to the export)");
      return;
    }
    cli::CalibrateMount cm;
    cm.engine = &eng;
    cm.root = root;
    // The last of ro / rw wins, as for mount(8).
    cm.read_only = false;
    for (const auto& o : m.fuse_opts) {
      if (o == "ro" || o == "rw") cm.read_only = o == "ro";
    }
    cm.rsize = filesystem.options().rsize;
    cm.wsize = filesystem.options().wsize;
    cli::RunCalibrateCommand(cmd, out, cm);
    return;
  }
  if (cmd.rfind("cache ", 0) != 0) {
    out.Line("error: unknown command '" + cmd + "'");
    return;
  }
  if (!privileged) {
    out.Line("error: only root may change the cache");
    return;
  }
  // Commands run concurrently (cli/control.h); the cache operations one at
  // a time, each on the cache attached when its turn comes (not one a
  // `cache detach` ahead of it has just let go).
  static Mutex cache_ops;
  MutexLock cache_lock(cache_ops);
  auto cache = filesystem.cache();
  if (!cache) {
    out.Line("error: this mount has no SSD cache");
    return;
  }
  const bool wb = cache->mode() == cache::CacheMode::kWriteBack;
  if (cmd == "cache drop") {
    const uint64_t n = cache->DropAll();
    out.Line("dropped " + std::to_string(n) + " cached blocks" +
             (wb ? " (blocks with unflushed writes are kept)" : ""));
    return;
  }
  if (cmd == "cache flush") {
    if (!wb) {
      out.Line("nothing to flush: cache_mode=" + cache->Stats().mode + " keeps no dirty data");
      return;
    }
    const uint64_t before = cache->Stats().dirty_bytes;
    // A client that goes away stops the progress lines, not the flush.
    auto r = FlushWithProgress(filesystem, *cache, std::chrono::seconds(1),
                               [&](const cli::FlushMeter& meter) {
                                 return out.Alive() && out.Line(meter.ProgressLine());
                               });
    if (!r) {
      out.Line("error: flush failed: " + r.error().what);
      return;
    }
    out.Line("flushed " + std::to_string(before) + " dirty bytes to the server");
    return;
  }
  if (cmd == "cache detach") {
    const std::string cache_id = cache->id();
    cache.reset();
    if (auto r = filesystem.DetachCache(); !r) {
      out.Line("error: " + r.error().what);
      return;
    }
    if (wb) {
      // Nothing of this mount is left unflushed: the export is free again.
      if (auto r = fs::ReleaseOwner(nfs, root, cache_id); !r) {
        Log("mount")->warn("removing {}: {}", fs::kOwnerName, r.error().what);
      }
    }
    out.Line("cache detached; the mount runs uncached until it is mounted again");
    return;
  }
  out.Line("error: unknown command '" + cmd + "'");
}

// SIGTERM, SIGINT and SIGHUP once the FUSE loop has ended (FUSE's own
// handlers, which turn the first into the end of the loop, are replaced by
// these at once): the unmount's work goes on in order, and a write-back
// flush at unmount is told to end (FinishWriteBack), whenever the signal
// came. The handler only writes the signal number to a pipe; its write end
// is the one piece of global state it needs.
int g_stop_pipe = -1;

void OnStopSignal(int sig) {
  const unsigned char b = static_cast<unsigned char>(sig);
  ssize_t n = write(g_stop_pipe, &b, 1);
  (void)n;
}

class StopSignals {
 public:
  StopSignals() {
    if (pipe2(fds_, O_CLOEXEC) != 0) return;
    g_stop_pipe = fds_[1];
    struct sigaction sa {};
    sa.sa_handler = OnStopSignal;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < std::size(kSignals); ++i) sigaction(kSignals[i], &sa, &old_[i]);
  }
  ~StopSignals() {
    if (fds_[0] < 0) return;
    for (size_t i = 0; i < std::size(kSignals); ++i) sigaction(kSignals[i], &old_[i], nullptr);
    g_stop_pipe = -1;
    close(fds_[0]);
    close(fds_[1]);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The work is done (any thread).
  void Done() { OnStopSignal(0); }
  // Until Done() or a signal: 0, or the signal's number. (Without a pipe:
  // 0 at once, and the caller waits for the work uninterruptibly.)
  int Wait() {
    unsigned char b = 0;
    while (fds_[0] >= 0 && read(fds_[0], &b, 1) < 0 && errno == EINTR) {
    }
    return b;
  }

 private:
  static constexpr int kSignals[] = {SIGTERM, SIGINT, SIGHUP};
  int fds_[2] = {-1, -1};
  struct sigaction old_[std::size(kSignals)] {};
};

// Unmount of a write-back mount: the cached writes go to the server
// (unless wb_noflush), and the ownership record goes once nothing is left
// dirty. On a hard mount to a server that has gone away that waits for
// ever; a stop signal ends it, leaving what is not flushed in the cache for
// the next mount (the record then stays).
void FinishWriteBack(fs::Filesystem& filesystem, cache::BlockCache& c, engine::Engine& eng,
                     nfs::Nfs3& nfs, const nfs::Fh& root, StopSignals& signals) {
  auto log = Log("mount");
  std::thread work([&] {
    if (const uint64_t dirty = c.Stats().dirty_bytes; dirty > 0 && c.options().flush_on_unmount) {
      log->info("flushing {} KiB of write-back data to the server before exiting (SIGTERM or "
                "SIGINT stops it, leaving them in {})",
                dirty >> 10, c.options().dir);
      // Every 5 s: what is left, at what rate, for how long.
      auto r = FlushWithProgress(filesystem, c, std::chrono::seconds(5), [&](const cli::FlushMeter& mt) {
        const int64_t eta = mt.eta_s();
        log->info("flush at unmount: {} KiB dirty left, {} KiB/s, {}", mt.dirty() >> 10,
                  mt.rate_bps() >> 10, eta < 0 ? std::string("time to go not known yet")
                                               : fmt::format("about {} s to go", eta));
        return true;
      });
      if (!r) log->error("flush at unmount failed: {}", r.error().what);
    }
    if (c.Stats().dirty_bytes == 0) {
      if (auto r = fs::ReleaseOwner(nfs, root, c.id()); !r) {
        log->warn("removing {}: {}", fs::kOwnerName, r.error().what);
      }
    }
    signals.Done();
  });
  if (const int sig = signals.Wait(); sig != 0) {
    log->warn("{}: stopping the flush at unmount", strsignal(sig));
    filesystem.InterruptFlush();
    eng.Stop();  // calls still waiting for the server end now
  }
  work.join();
  if (const uint64_t left = c.Stats().dirty_bytes; left > 0) {
    log->warn("{} KiB of write-back data stay in {} (flushed at the next mount there)", left >> 10,
              c.options().dir);
  }
}

constexpr int kExitUsage = 1;
constexpr int kExitMountFailed = 32;

// Reports the mount outcome to the waiting parent (or stderr in foreground).
class Reporter {
 public:
  explicit Reporter(int fd) : fd_(fd) {}
  void Done(int code, const std::string& msg) {
    if (fd_ < 0) {
      if (!msg.empty()) fprintf(stderr, "%s\n", msg.c_str());
      return;
    }
    std::string line = std::to_string(code) + " " + msg;
    ssize_t n = write(fd_, line.data(), line.size());
    (void)n;
    close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

Result<std::string> Resolve(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    return Error::Errno(EHOSTUNREACH,
                        "cannot resolve server name '" + host + "': " + gai_strerror(rc));
  }
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, buf, sizeof(buf));
  freeaddrinfo(res);
  return std::string(buf);
}

using nfs::Wait;

// The kernel caps a FUSE mount's readahead at the block-device default (128
// KiB) whatever INIT says; raise it through the mount's backing device info,
// found by device number in mountinfo (stat() on the mountpoint would ask
// this very process, which is not serving requests yet).
// REQUIRES: `real` is the mountpoint's absolute path, resolved before mounting.
void SetReadahead(const std::string& real, int kb) {
  FILE* f = fopen("/proc/self/mountinfo", "r");
  if (f == nullptr) return;
  char line[4096];
  std::string dev;
  while (fgets(line, sizeof(line), f) != nullptr) {
    char devbuf[64], mp[PATH_MAX];
    if (sscanf(line, "%*d %*d %63s %*s %4095s", devbuf, mp) == 2 && real == std::string(mp) &&
        strstr(line, " fuse.mpnfs ") != nullptr) {
      dev = devbuf;
    }
  }
  fclose(f);
  if (dev.empty()) return;
  std::string path = "/sys/class/bdi/" + dev + "/read_ahead_kb";
  FILE* ra = fopen(path.c_str(), "w");
  if (ra == nullptr) {
    Log("mount")->warn("cannot set readahead ({}): {}", path, strerror(errno));
    return;
  }
  fprintf(ra, "%d\n", kb);
  fclose(ra);
}

int RunMount(cli::MountOptions m, Reporter& rep) {
  auto log = Log("mount");
  // With paths (path= or mpnfstab), SERVER may be a mere label.
  auto addr = Resolve(m.server);
  if (!addr && m.paths.empty()) {
    rep.Done(kExitMountFailed, "mpnfs: " + addr.error().what);
    return kExitMountFailed;
  }
  // NFS traffic goes over the path= addresses (or the server's own address).
  std::vector<std::string> path_addrs;
  for (const auto& p : m.paths) {
    auto a = Resolve(p);
    if (!a) {
      rep.Done(kExitMountFailed, "mpnfs: path=" + p + ": " + a.error().what);
      return kExitMountFailed;
    }
    if (std::find(path_addrs.begin(), path_addrs.end(), *a) != path_addrs.end()) {
      rep.Done(kExitMountFailed, "mpnfs: path=" + p + " is " + *a + ", given twice");
      return kExitMountFailed;
    }
    path_addrs.push_back(*a);
  }
  if (path_addrs.empty()) path_addrs.push_back(*addr);
  m.engine.paths.clear();
  for (size_t k = 0; k < path_addrs.size(); ++k) {
    std::string local = k < m.locals.size() ? m.locals[k] : std::string();
    if (!local.empty()) {
      // Checked now, so that a typo is an error at mount time, not a path
      // that never comes up.
      auto b = nfs::ResolveLocal(local);
      if (!b) {
        rep.Done(kExitMountFailed, "mpnfs: path " + path_addrs[k] + ": " + b.error().what);
        return kExitMountFailed;
      }
      log->info("path {} leaves by {}{}", path_addrs[k], b->ifname,
                b->addr_len != 0 ? " from " + local : std::string());
    }
    m.engine.paths.push_back(
        engine::Endpoint{path_addrs[k], m.port, local, k < m.weights.size() ? m.weights[k] : 1});
  }
  m.engine.weighed = !m.weights.empty();
  if (m.read_ahead_kb < 0) m.read_ahead_kb = cli::DefaultReadAheadKb(m.engine.paths.size());
  // MOUNT is asked over the server's address, then over each path in turn
  // (bound as that path is), so that a mount succeeds while some of them
  // are down.
  std::vector<std::pair<std::string, std::string>> mount_addrs;  // address, local=
  auto asked = [&](const std::string& a) {
    return std::any_of(mount_addrs.begin(), mount_addrs.end(), [&](const auto& m) { return m.first == a; });
  };
  if (addr) {
    std::string local;  // (the server's own address is a path without path=)
    for (const auto& p : m.engine.paths) {
      if (p.host == *addr) local = p.local;
    }
    mount_addrs.emplace_back(*addr, local);
  }
  for (const auto& p : m.engine.paths) {
    if (!asked(p.host)) mount_addrs.emplace_back(p.host, p.local);
  }
  const auto timeout = std::chrono::seconds(m.mount_timeout_s);
  const auto per_try = std::max<std::chrono::milliseconds>(
      std::chrono::milliseconds(timeout) / static_cast<int>(mount_addrs.size()),
      std::chrono::seconds(1));
  // The calls to the server's other services, for the statistics.
  nfs::ServiceCounters services;
  Result<nfs::Fh> root = Error::Errno(EIO, "no address to try");
  for (const auto& [a, local] : mount_addrs) {
    root = nfs::MountExport(a, m.mount_port, m.export_path, per_try, local, &services);
    // An answer from the server (even "not exported") ends the search.
    if (root || (root.error().err != ETIMEDOUT && root.error().err != EHOSTUNREACH &&
                 root.error().err != ECONNREFUSED)) {
      break;
    }
    log->warn("MOUNT over {} failed: {}", a, root.error().what);
  }
  if (!root) {
    rep.Done(kExitMountFailed, "mpnfs: mounting " + m.server + ":" + m.export_path +
                                   " failed: " + root.error().what);
    return kExitMountFailed;
  }

  const int tcp_to = static_cast<int>(m.engine.tcp_user_timeout.count());
  engine::Engine eng(m.engine, [tcp_to](engine::TransportSink* sink) {
    return std::make_unique<nfs::RpcTransport>(sink, tcp_to);
  });
  eng.Start();
  const auto started = std::chrono::steady_clock::now();  // what the statistics cover
  nfs::Nfs3 nfs(eng);
  engine::SubmitOptions so{std::chrono::milliseconds(timeout)};
  auto info = Wait<nfs::FsInfo>([&](nfs::Cb<nfs::FsInfo> cb) { nfs.Fsinfo(*root, {}, cb, so); });
  if (!info) {
    rep.Done(kExitMountFailed, "mpnfs: NFS service of " + m.server + " (port " +
                                   std::to_string(m.port) + ") not usable: " + info.error().what);
    return kExitMountFailed;
  }
  if (info->rtmax > 0) m.fs.rsize = std::min(m.fs.rsize, info->rtmax);
  if (info->wtmax > 0) m.fs.wsize = std::min(m.fs.wsize, info->wtmax);
  if (info->dtpref > 0) m.fs.dtpref = info->dtpref;
  auto pc = Wait<nfs::PathConf>([&](nfs::Cb<nfs::PathConf> cb) { nfs.Pathconf(*root, {}, cb, so); });
  // Linux programs assume NAME_MAX (255); a server may allow more (Ganesha says 1024).
  if (pc && pc->name_max > 0) m.fs.name_max = std::min<uint32_t>(pc->name_max, 255);
  if (!m.tab_entry.empty()) log->info("paths and options from the mpnfstab entry at {}", m.tab_entry);
  log->info("mounted {}:{} (rsize {} wsize {}, {} path(s) x {} connection(s))", m.server,
            m.export_path, m.fs.rsize, m.fs.wsize, m.engine.paths.size(),
            m.engine.conns_per_path);

  // The SSD cache tier, opened before the mount is offered: a cache that
  // cannot be used fails the mount, unless cache_optional says to go on.
  std::shared_ptr<cache::BlockCache> cache;
  if (m.cache.mode != cache::CacheMode::kOff) {
    auto c = cache::BlockCache::Open(m.cache);
    if (c) {
      cache = std::move(c.value());
    } else if (m.cache_optional) {
      log->warn("running without the SSD cache (cache_optional): {}", c.error().what);
    } else {
      rep.Done(kExitMountFailed, "mpnfs: " + c.error().what);
      return kExitMountFailed;
    }
  }
  // The write-back ownership record (fs/owner.h): a write-back cache claims
  // the export (atomically: of two gateways starting together, one wins);
  // nothing else mounts it while a record names another cache.
  const bool wb = cache && cache->mode() == cache::CacheMode::kWriteBack;
  {
    auto owner = wb ? fs::ClaimOwner(nfs, *root, m.cache.dir, cache->id()) : fs::ReadOwner(nfs, *root);
    if (!owner) {
      rep.Done(kExitMountFailed, "mpnfs: " + std::string(wb ? "cannot claim the export for write-back: " : "") +
                                     owner.error().what);
      return kExitMountFailed;
    }
    if (*owner) {
      rep.Done(kExitMountFailed, "mpnfs: " + fs::OwnerRefusal(**owner, m.server + ":" + m.export_path));
      return kExitMountFailed;
    }
  }
  const uint64_t dirty_at_start = wb ? cache->Stats().dirty_bytes : 0;
  fs::Filesystem filesystem(nfs, *root, m.fs, std::move(cache));
  if (dirty_at_start > 0) {
    // Writes acknowledged by an earlier mount that stopped before flushing
    // them (a crash, a kill, wb_noflush): to the server before anything
    // can read the file there or here.
    log->warn("flushing {} KiB of write-back data left by an earlier mount", dirty_at_start >> 10);
    if (auto r = filesystem.FlushCache(); !r) {
      rep.Done(kExitMountFailed, "mpnfs: cannot flush the write-back data an earlier mount left in " +
                                     m.cache.dir + ": " + r.error().what + " (it stays there)");
      return kExitMountFailed;
    }
    log->info("write-back data of the earlier mount is on the server");
  }
  // Locks for the server's lock manager (local_lock=): without one, they
  // fail with ENOLCK (the mount is still offered).
  std::unique_ptr<cli::LockService> lock_service;
  if (!m.local_posix_locks || !m.local_flocks) {
    auto ls = cli::LockService::Start(m, m.engine.paths.front(), tcp_to, timeout, &services);
    if (ls) {
      lock_service = std::move(ls).value();
    } else {
      log->warn("locks: {}; fcntl and flock locks fail with ENOLCK (local_lock=all keeps them on this host)",
                ls.error().what);
    }
  }
  fuse::FuseContext ctx;
  ctx.fs = &filesystem;
  ctx.posix_locks_to_server = !m.local_posix_locks;
  ctx.flocks_to_server = !m.local_flocks;
  ctx.locks = lock_service ? &lock_service->locks() : nullptr;
  ctx.opts.max_write = 1u << 20;  // larger FUSE writes split into wsize calls
  ctx.opts.max_background = static_cast<unsigned>(m.max_background);
  // INIT lowers the mount's readahead to this; SetReadahead() raised it first.
  if (m.read_ahead_kb > 0) ctx.opts.max_readahead = static_cast<unsigned>(m.read_ahead_kb) * 1024;
  ctx.opts.readdirplus = m.readdirplus;
  ctx.opts.kernel_cache = m.fs.kernel_cache;

  std::string fuse_o = "fsname=" + m.server + ":" + m.export_path + ",subtype=mpnfs";
  for (const auto& o : m.fuse_opts) fuse_o += "," + o;  // a user's fsname=/subtype= comes later and wins
  std::vector<std::string> fargs = {"mpnfs", "-o", fuse_o};
  if (m.debug) fargs.push_back("-d");
  std::vector<char*> argv;
  for (auto& a : fargs) argv.push_back(a.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
  fuse_session* se = fuse_session_new(&args, fuse::Operations(), sizeof(fuse_lowlevel_ops), &ctx);
  fuse_opt_free_args(&args);
  if (se == nullptr) {
    rep.Done(kExitMountFailed, "mpnfs: cannot create the FUSE session (bad FUSE option?)");
    return kExitMountFailed;
  }
  // (The session outlives every call that can reach Open: eng.Stop() below
  // comes first. Before the mount, or for an inode the kernel has
  // forgotten, the notification fails harmlessly.)
  filesystem.SetAttrInvalidator([se](uint64_t ino) { fuse_lowlevel_notify_inval_inode(se, ino, -1, 0); });
  // Page invalidations run on a thread of their own: dropping a page waits
  // for the request that holds it (the one being answered, or one whose
  // reply an engine thread brings). Ended before the session is destroyed.
  auto notifier = std::make_unique<Timer>();
  filesystem.SetDataInvalidator([se, n = notifier.get()](uint64_t ino) {
    n->After(std::chrono::milliseconds(0), [se, ino] { fuse_lowlevel_notify_inval_inode(se, ino, 0, 0); });
  });
  ctx.invalidate_data = [se, n = notifier.get()](uint64_t ino, std::function<void()> then) {
    n->After(std::chrono::milliseconds(0), [se, ino, then = std::move(then)] {
      fuse_lowlevel_notify_inval_inode(se, ino, 0, 0);
      then();
    });
  };
  // Paths are resolved before mounting: afterwards the mountpoint belongs to
  // this process, which does not answer requests until its loop runs.
  char real[PATH_MAX];
  const std::string mp_real = realpath(m.mountpoint.c_str(), real) != nullptr ? real : m.mountpoint;
  auto cpath = cli::ControlPathFor(m.mountpoint);
  // Set once the session's I/O is taken (after the mount); the statistics
  // may be asked for from another thread before that.
  std::atomic<const fuse::FuseTransport*> transport_stats{nullptr};
  const cli::SnapshotFn snapshot = [&eng, &filesystem, &services, ls = lock_service.get(),
                                    source = m.server + ":" + m.export_path, mp = mp_real, started,
                                    &transport_stats]() {
    return Snapshot(eng, filesystem, services, ls, source, mp, started, transport_stats.load());
  };
  // -o metrics=: asked for, so a port that cannot be had fails the mount.
  std::unique_ptr<cli::MetricsServer> metrics;
  if (!m.metrics.empty()) {
    auto ms = cli::MetricsServer::Start(m.metrics, snapshot);
    if (!ms) {
      fuse_session_destroy(se);
      rep.Done(kExitMountFailed, "mpnfs: " + ms.error().what);
      return kExitMountFailed;
    }
    metrics = std::move(ms).value();
    log->info("Prometheus metrics on http://{}/metrics", m.metrics);
  }
  fuse::FuseTransport::Options topts;
  topts.mode = m.fuse_uring == cli::MountOptions::FuseUring::kOn    ? fuse::FuseTransport::Mode::kOn
               : m.fuse_uring == cli::MountOptions::FuseUring::kOff ? fuse::FuseTransport::Mode::kOff
                                                                    : fuse::FuseTransport::Mode::kAuto;
  topts.depth = static_cast<unsigned>(m.fuse_uring_depth);
  topts.max_write = ctx.opts.max_write;
  if (topts.mode == fuse::FuseTransport::Mode::kOn) {
    if (auto allowed = fuse::FuseTransport::KernelAllows(); !allowed) {
      fuse_session_destroy(se);
      rep.Done(kExitMountFailed, "mpnfs: fuse_uring=on: " + allowed.error().what);
      return kExitMountFailed;
    }
  }
  if (fuse_set_signal_handlers(se) != 0 || fuse_session_mount(se, m.mountpoint.c_str()) != 0) {
    fuse_session_destroy(se);
    rep.Done(kExitMountFailed, "mpnfs: cannot mount on " + m.mountpoint +
                                   " (does it exist, and is /dev/fuse usable?)");
    return kExitMountFailed;
  }
  if (m.read_ahead_kb > 0) SetReadahead(mp_real, m.read_ahead_kb);
  // Before the loop reads INIT, which decides the transport.
  std::unique_ptr<fuse::FuseTransport> transport = fuse::FuseTransport::Install(se, &ctx, topts);
  if (topts.mode == fuse::FuseTransport::Mode::kOn && !transport->stats().why.empty()) {
    const std::string why = transport->stats().why;
    transport->Quiesce();
    fuse_remove_signal_handlers(se);
    fuse_session_unmount(se);
    fuse_session_destroy(se);
    rep.Done(kExitMountFailed, "mpnfs: fuse_uring=on: " + why);
    return kExitMountFailed;
  }
  transport_stats.store(transport.get());
  // Statistics for `mpnfsctl stats MOUNTPOINT`; the mount works without them.
  std::unique_ptr<cli::ControlSocket> control;
  if (cpath) {
    control = std::make_unique<cli::ControlSocket>(
        *cpath, [&eng, &filesystem, &nfs, &m, root = *root, snapshot](
                    const std::string& cmd, bool privileged, cli::Reply& out) {
          Control(cmd, privileged, out, eng, filesystem, nfs, root, snapshot, m);
        });
    if (auto st = control->Start(); !st) {
      log->warn("no statistics socket: {}", st.error().what);
      control.reset();
    }
  } else {
    log->warn("no statistics socket: {}", cpath.error().what);
  }
  rep.Done(0, "");
  if (!m.foreground) {
    int devnull = open("/dev/null", O_RDWR);
    if (devnull >= 0) {
      dup2(devnull, 0);
      dup2(devnull, 1);
      dup2(devnull, 2);
      if (devnull > 2) close(devnull);
    }
  }
  fuse_loop_config* cfg = fuse_loop_cfg_create();
  fuse_loop_cfg_set_clone_fd(cfg, 1);
  fuse_loop_cfg_set_max_threads(cfg, 64);
  fuse_loop_cfg_set_idle_threads(cfg, 8);
  int rc = fuse_session_loop_mt(se, cfg);
  fuse_loop_cfg_destroy(cfg);
  // The rings hold /dev/fuse open: closed first, so that the unmount's
  // close of the session's descriptor ends the connection (transport.h).
  transport->Quiesce();
  metrics.reset();
  // A stop signal from here on, during the unmount too, is recorded, not
  // lost to FUSE's handler nor fatal (StopSignals). Ours go in first:
  // fuse_remove_signal_handlers then leaves them (it resets only FUSE's
  // own), so no signal finds the default action in between.
  StopSignals signals;
  fuse_remove_signal_handlers(se);
  fuse_session_unmount(se);
  // Commands still running are told their client is gone and given a few
  // seconds with the engine still up (a calibrate removes its scratch file).
  // The socket object stays until the engine has stopped: a command waiting
  // for a server that is gone (a `cache flush`, a calibrate's last REMOVE)
  // ends with the engine's calls, and SIGTERM during the flush at unmount
  // (FinishWriteBack) interrupts its flush too.
  if (control && !control->Quiesce(std::chrono::seconds(10))) {
    log->warn("control commands still running at unmount; they end with the engine");
  }
  if (auto c = filesystem.cache(); c && c->mode() == cache::CacheMode::kWriteBack) {
    FinishWriteBack(filesystem, *c, eng, nfs, *root, signals);
  }
  // Every lock released (the kernel releases none at unmount); a lock
  // service that cannot leaves the next mount here to tell the server.
  if (lock_service) lock_service->Stop(std::chrono::seconds(10));
  // Calls still pending complete (with an error) and reply while the session
  // object exists; only then is it destroyed.
  eng.Stop();
  control.reset();
  notifier.reset();
  transport_stats.store(nullptr);
  fuse_session_destroy(se);
  transport.reset();
  log->info("unmounted {}", m.mountpoint);
  return rc == 0 ? 0 : kExitMountFailed;
}

}  // namespace
}  // namespace mpnfs

int main(int argc, char** argv) {
  using namespace mpnfs;
  std::vector<std::string> args(argv + 1, argv + argc);
  // Called as mount(8)'s helper (mount -t mpnfs, an fstab line of type
  // mpnfs): its conventions, cli/options.h TranslateHelperArgs.
  const char* slash = strrchr(argv[0], '/');
  const bool helper = strcmp(slash != nullptr ? slash + 1 : argv[0], "mount.mpnfs") == 0;
  cli::HelperArgs h;
  if (helper) {
    auto t = cli::TranslateHelperArgs(args);
    if (!t) {
      fprintf(stderr, "mount.mpnfs: %s\n", t.error().what.c_str());
      return kExitUsage;
    }
    h = std::move(t).value();
    args = h.args;
  }
  const char* env_tab = getenv("MPNFS_TAB");
  auto parsed = cli::LoadMountOptions(args, env_tab != nullptr ? env_tab : "", "/etc/mpnfstab",
                                      cli::ReadFileIfExists);
  if (!parsed) {
    fprintf(stderr, "mpnfs: %s\n%s", parsed.error().what.c_str(), cli::UsageText().c_str());
    return kExitUsage;
  }
  cli::MountOptions m = std::move(parsed).value();
  if (m.help) {
    printf("%s", cli::HelpText().c_str());
    return 0;
  }
  if (m.version) {
    printf("mpnfs %s\n", MPNFS_VERSION);
    return 0;
  }
  struct stat mst;
  const bool found = stat(m.mountpoint.c_str(), &mst) == 0;
  if (!found || !S_ISDIR(mst.st_mode)) {
    fprintf(stderr, "mpnfs: mountpoint %s: %s\n", m.mountpoint.c_str(),
            found ? "not a directory" : strerror(errno));
    return kExitMountFailed;
  }
  if (!m.ignored.empty()) {
    std::string list;
    for (const auto& o : m.ignored) list += (list.empty() ? "" : ", ") + o;
    fprintf(stderr, "mpnfs: ignoring unknown options (sloppy): %s\n", list.c_str());
  }
  if (h.verbose) {
    fprintf(stderr, "mount.mpnfs: %s %s:%s on %s\n", h.fake ? "would mount" : "mounting", m.server.c_str(),
            m.export_path.c_str(), m.mountpoint.c_str());
  }
  if (h.fake) return 0;  // (-f: the options and the mountpoint are checked; nothing is mounted)
  spdlog::level::level_enum level = spdlog::level::info;
  ParseLogLevel(m.debug ? "debug" : m.log_level, &level);
  // A daemon logs to syslog from the start; what the user must see on the
  // terminal (the mount outcome) travels through the status pipe.
  InitLogging(m.foreground ? LogSink::kStderr : LogSink::kSyslog, level);
  signal(SIGPIPE, SIG_IGN);
  // Data buffers (1 MiB writes, reply assembly) are allocated and freed all the
  // time; served by mmap they would page-fault fresh zeroed memory on every
  // request (a fifth of the CPU of a write). Keep them in the heap instead.
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);

  if (m.foreground) {
    Reporter rep(-1);
    return RunMount(std::move(m), rep);
  }
  int fds[2];
  if (pipe(fds) != 0) {
    perror("mpnfs: pipe");
    return kExitMountFailed;
  }
  pid_t pid = fork();
  if (pid < 0) {
    perror("mpnfs: fork");
    return kExitMountFailed;
  }
  if (pid > 0) {
    close(fds[1]);
    std::string msg;
    char buf[512];
    ssize_t n;
    while ((n = read(fds[0], buf, sizeof(buf))) > 0) msg.append(buf, static_cast<size_t>(n));
    if (msg.empty()) {
      fprintf(stderr, "mpnfs: the mount process died before mounting\n");
      return kExitMountFailed;
    }
    int code = atoi(msg.c_str());
    auto sp = msg.find(' ');
    if (sp != std::string::npos && sp + 1 < msg.size()) fprintf(stderr, "%s\n", msg.c_str() + sp + 1);
    return code;
  }
  close(fds[0]);
  setsid();
  if (chdir("/") != 0) perror("mpnfs: chdir /");
  Reporter rep(fds[1]);
  return RunMount(std::move(m), rep);
}
