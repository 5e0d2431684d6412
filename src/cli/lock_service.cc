#include "cli/lock_service.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <future>
#include <random>
#include <sstream>
#include <vector>

#include "common/log.h"
#include "nfs/mount3.h"
#include "nfs/rpc_transport.h"

namespace mpnfs::cli {
namespace {

std::string HostName() {
  char h[256] = "";
  if (gethostname(h, sizeof h - 1) != 0 || h[0] == '\0') return "localhost";
  return h;
}

std::string BootId() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string id;
  f >> id;
  return id.empty() ? "-" : id;
}

// "BOOTID PID STARTTIME" of a running process: the start time tells it from
// a later process with the same pid, the boot id from one of another boot.
// "" once it is gone.
std::string ProcessId(const std::string& pid) {
  std::ifstream f("/proc/" + pid + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return "";
  std::istringstream rest(stat.substr(paren + 1));
  std::string field;
  for (int i = 0; i < 20 && rest >> field; ++i) {
  }
  return field.empty() ? "" : BootId() + " " + pid + " " + field;
}

bool Running(const std::string& id) {
  std::istringstream in(id);
  std::string boot, pid;
  in >> boot >> pid;
  return !pid.empty() && ProcessId(pid) == id;
}

// The state file: "state N", then "mount BOOTID PID STARTTIME HELD" per
// mount.
struct State {
  int32_t state = 0;
  struct Mount {
    std::string id;  // "BOOTID PID STARTTIME"
    bool held = false;
  };
  std::vector<Mount> mounts;
};

State Parse(const std::string& text) {
  State st;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::istringstream l(line);
    std::string word;
    l >> word;
    if (word == "state") {
      l >> st.state;
    } else if (word == "mount") {
      std::string boot, pid, start;
      int held = 1;  // (a line cut short may have held)
      l >> boot >> pid >> start >> held;
      st.mounts.push_back({boot + " " + pid + " " + start, held != 0});
    }
  }
  return st;
}

std::string Format(const State& st) {
  std::string out = "state " + std::to_string(st.state) + "\n";
  for (const auto& m : st.mounts) out += "mount " + m.id + " " + (m.held ? "1" : "0") + "\n";
  return out;
}

// Runs `change` on the state file's contents, under an flock of PATH.lock
// (mounts of this host take turns), and replaces the file with what it
// leaves (written to PATH.new, fsync'ed, renamed over, the directory
// fsync'ed: a crash leaves the old file or the new one).
template <class F>
Result<Ok> Update(const std::string& path, F&& change) {
  const std::string lk = path + ".lock";
  const int lfd = open(lk.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lfd < 0) return Error::Errno(errno, "cannot open " + lk + ": " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { close(fd); }  // (and the flock goes)
  } closer{lfd};
  if (flock(lfd, LOCK_EX) != 0) return Error::Errno(errno, "cannot lock " + lk + ": " + std::strerror(errno));
  std::ifstream in(path);
  State st = Parse(std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()));
  if (auto r = change(st); !r) return r;
  const std::string out = Format(st), tmp = path + ".new";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Error::Errno(errno, "cannot write " + tmp + ": " + std::strerror(errno));
  const bool ok = write(fd, out.data(), out.size()) == static_cast<ssize_t>(out.size()) && fsync(fd) == 0;
  const int err = errno;
  close(fd);
  if (!ok) return Error::Errno(err, "cannot write " + tmp + ": " + std::strerror(err));
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    return Error::Errno(errno, "cannot replace " + path + ": " + std::strerror(errno));
  }
  const int dfd = open(LockService::kStateDir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  return Ok{};
}

}  // namespace

Result<Ok> LockService::Mark(bool held, bool gone) {
  return Update(state_file_, [&](State& st) -> Result<Ok> {
    std::erase_if(st.mounts, [&](const State::Mount& m) { return m.id == me_; });
    if (!gone) st.mounts.push_back({me_, held});
    return Ok{};
  });
}

Result<std::unique_ptr<LockService>> LockService::Start(const MountOptions& m, const engine::Endpoint& path,
                                                        int tcp_user_timeout_ms, std::chrono::milliseconds timeout,
                                                        nfs::ServiceCounters* counters) {
  static const auto log = Log("locks");
  std::string me_addr;
  auto port = nfs::LockManagerPort(path.host, timeout, path.local, &me_addr, counters);
  if (!port) return port.error();
  if (me_addr.empty()) return Error::Errno(EIO, "no local address toward " + path.host);
  std::unique_ptr<LockService> s(new LockService());
  s->counters_ = counters;
  if (std::error_code ec; !std::filesystem::create_directories(kStateDir, ec) && ec) {
    return Error::Errno(ec.value(), std::string("cannot make ") + kStateDir + ": " + ec.message());
  }
  // The server knows this host's locks by this address: every mount from
  // it shares the file (an SM_NOTIFY from it frees them all).
  s->state_file_ = std::string(kStateDir) + "/" + me_addr;
  s->me_ = ProcessId(std::to_string(getpid()));
  if (s->me_.empty()) return Error::Errno(EIO, "cannot read /proc/self/stat");
  // Mounts gone while they may have held locks: the server is told this
  // host restarted, unless a running mount may hold some (see the header).
  auto r = Update(s->state_file_, [&](State& st) -> Result<Ok> {
    std::vector<State::Mount> live, dead_held;
    bool live_held = false;
    for (const auto& mt : st.mounts) {
      if (Running(mt.id)) {
        live.push_back(mt);
        live_held |= mt.held;
      } else if (mt.held) {
        dead_held.push_back(mt);
      }
    }
    // NSM: odd while up; one more restart each time the server is told.
    s->state_ = st.state | 1;
    bool told = false;
    if (!dead_held.empty() && live_held) {
      log->warn("a mount of this host that ended without releasing its locks may have left some on {}; "
                "they stay until a mount starts while no mount here holds locks", path.host);
    } else if (!dead_held.empty()) {
      auto me = nfs::NotifyRestart(path.host, s->state_ + 2, timeout, path.local, counters);
      if (me) {
        s->state_ += 2;
        told = true;
        log->warn("a mount of this host ended holding locks: told the server this host ({}) restarted (NSM "
                  "state {}); it drops the locks it held for that address", *me, s->state_);
      } else {
        log->warn("a mount of this host ended holding locks on {}, and the server's status monitor could not "
                  "be told this host restarted ({}); the next mount here tries again", path.host,
                  me.error().what);
      }
    }
    if (!told) live.insert(live.end(), dead_held.begin(), dead_held.end());  // (for a later mount to see)
    st.mounts = std::move(live);
    st.state = s->state_;
    st.mounts.push_back({s->me_, false});
    return Ok{};
  });
  if (!r) return r.error();

  engine::EngineOptions eo = m.engine;
  eo.paths = {engine::Endpoint{path.host, *port, path.local, 1}};
  eo.loops = 1;
  eo.conns_per_path = 1;
  eo.busy_poll = {};  // a lock call is rare and not latency-bound: no core spent on it
  s->engine_ = std::make_unique<engine::Engine>(eo, [tcp_user_timeout_ms](engine::TransportSink* sink) {
    return std::make_unique<nfs::RpcTransport>(
        sink, tcp_user_timeout_ms, engine::RpcCall::Program{proto::nlm4::kProgram, proto::nlm4::kVersion, 0});
  });
  s->engine_->Start();
  s->nlm_path_ = eo.paths.front();
  s->lookup_timeout_ = timeout;
  s->watch_ = std::thread([self = s.get()] { self->Watch(); });
  s->nlm_ = std::make_unique<nfs::Nlm>(*s->engine_, HostName(), s->state_);
  std::array<char, 8> instance;
  std::random_device rd;
  for (char& c : instance) c = static_cast<char>(rd());
  LockService* self = s.get();
  s->locks_ = std::make_unique<fs::Locks>(*s->nlm_, instance, [self](bool held) { return self->Mark(held); });
  log->info("locks go to the server's lock manager (NLM v4, port {}) over {}", *port, path.host);
  return s;
}

void LockService::Watch() {
  static const auto log = Log("locks");
  int down = 0;  // checks in a row that found no connection up
  MutexLock lock(watch_mu_);
  while (!watch_stop_) {
    watch_cv_.WaitFor(watch_mu_, kRebind);
    if (watch_stop_) break;
    lock.Unlock();
    bool up = false;
    for (const auto& p : engine_->Paths()) up = up || p.connections_up > 0;
    down = up ? 0 : down + 1;
    if (down >= 2) {
      // (Blocking here holds up nothing but the next look.)
      auto port = nfs::LockManagerPort(nlm_path_.host, std::min<std::chrono::milliseconds>(lookup_timeout_, kRebind * 2),
                                       nlm_path_.local, nullptr, counters_);
      if (port && *port != nlm_path_.port) {
        engine::Endpoint moved = nlm_path_;
        moved.port = *port;
        const std::string old = nlm_path_.host + ":" + std::to_string(nlm_path_.port);
        if (auto added = engine_->AddPath(moved); !added) {
          log->warn("the server's lock manager is now on port {}, but lock calls cannot go there: {}", *port,
                    added.error().what);
        } else if (auto removed = engine_->RemovePath(old); !removed) {
          // (The old port answered again meanwhile: the calls stay there.)
          (void)engine_->RemovePath(moved.host + ":" + std::to_string(moved.port));
          log->warn("the server's lock manager answers on port {} again: {}", nlm_path_.port, removed.error().what);
        } else {
          log->info("the server's lock manager is now on port {} (was {}): lock calls go there", *port,
                    nlm_path_.port);
          nlm_path_ = moved;
          down = 0;
        }
      }
    }
    lock.Lock();
  }
}

void LockService::StopWatch() {
  {
    MutexLock lock(watch_mu_);
    watch_stop_ = true;
  }
  watch_cv_.SignalAll();
  if (watch_.joinable()) watch_.join();
}

void LockService::Stop(std::chrono::milliseconds timeout) {
  if (stopped_) return;
  stopped_ = true;
  locks_->Shutdown();
  static const auto log = Log("locks");
  auto done = std::make_shared<std::promise<Result<Ok>>>();
  auto f = done->get_future();
  locks_->ReleaseAll(engine::Cred{}, [done](Result<Ok> r) { done->set_value(std::move(r)); });
  if (f.wait_for(timeout) != std::future_status::ready) {
    log->warn("locks not released within {} s; the next mount here tells the server this host restarted",
              std::chrono::duration_cast<std::chrono::seconds>(timeout).count());
  } else if (auto r = f.get(); !r) {
    log->warn("a lock was not released ({}); the next mount here tells the server this host restarted",
              r.error().what);
  } else if (auto ok = Mark(false, /*gone=*/true); !ok) {
    log->warn("{}", ok.error().what);
  }
  StopWatch();
  engine_->Stop();
  // Its timer's retries (a wait, a grace period) reply to FUSE requests:
  // they end here, while the FUSE session still exists.
  std::unique_ptr<fs::Locks> gone;
  {
    MutexLock lock(stats_mu_);
    lost_at_stop_ = locks_->LostLocks();
    gone = std::move(locks_);
  }
  gone.reset();
}

nfs::ServiceStats LockService::Stats() const {
  nfs::ServiceStats s;
  s.service = "NLM";
  // The counts over every connection it had (one; a path moved to the
  // lock manager's new port leaves its old one behind, counts final).
  for (const auto& c : engine_->StatsEver()) {
    for (const auto& op : c.ops) s.calls.Merge(op);
    s.reconnects += c.reconnects;
  }
  // Where it goes now, and how that is.
  for (const auto& c : engine_->Stats()) {
    if (!s.endpoint.empty() && c.state != "up") continue;
    s.endpoint = c.endpoint.substr(0, c.endpoint.rfind('#'));
    s.state = c.state;
    s.last_error.clear();
    if (c.state == "up") continue;
    for (auto h = c.history.rbegin(); h != c.history.rend(); ++h) {
      if (h->to == "down") {
        s.last_error = h->reason;
        break;
      }
    }
  }
  MutexLock lock(stats_mu_);
  s.lost_locks = locks_ ? locks_->LostLocks() : lost_at_stop_;
  return s;
}

LockService::~LockService() {
  StopWatch();
  if (!stopped_ && engine_) engine_->Stop();
}

}  // namespace mpnfs::cli
