#include "cli/calibrate.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>

#include "cli/control.h"
#include "common/log.h"
#include "common/mutex.h"
#include "engine/engine.h"
#include "nfs/nfs3.h"
#include "nfs/wait.h"

namespace mpnfs::cli {

using Clock = std::chrono::steady_clock;

Result<CalibrateOptions> ParseCalibrateArgs(const std::string& args) {
  CalibrateOptions o;
  std::istringstream in(args);
  std::string a;
  auto value = [&](const std::string& opt) -> Result<std::string> {
    std::string v;
    if (!(in >> v)) return Error::Errno(EINVAL, opt + " needs a value");
    return v;
  };
  while (in >> a) {
    if (a == "--json") {
      o.json = true;
    } else if (a == "--size") {
      auto v = value(a);
      if (!v) return v.error();
      char* end = nullptr;
      double n = std::strtod(v->c_str(), &end);
      uint64_t mult = 1;
      if (*end == 'K' || *end == 'k') mult = 1ull << 10, ++end;
      else if (*end == 'M' || *end == 'm') mult = 1ull << 20, ++end;
      else if (*end == 'G' || *end == 'g') mult = 1ull << 30, ++end;
      if (end == v->c_str() || *end != '\0' || n <= 0) {
        return Error::Errno(EINVAL, "--size: not a size: '" + *v + "'");
      }
      o.size = static_cast<uint64_t>(n * static_cast<double>(mult));
      if (o.size < (1u << 20)) return Error::Errno(EINVAL, "--size: at least 1M");
    } else if (a == "--time") {
      auto v = value(a);
      if (!v) return v.error();
      char* end = nullptr;
      o.step_s = std::strtod(v->c_str(), &end);
      // At most 60 s: every call's latency of a step is kept (a few MB).
      if (end == v->c_str() || *end != '\0' || !(o.step_s >= 0.1 && o.step_s <= 60)) {
        return Error::Errno(EINVAL, "--time: seconds per step, 0.1 to 60: '" + *v + "'");
      }
    } else if (a == "--apply") {
      o.apply = true;
    } else if (a == "--path") {
      auto v = value(a);
      if (!v) return v.error();
      o.path = *v;
    } else {
      return Error::Errno(EINVAL, "unknown calibrate argument '" + a + "'");
    }
  }
  if (o.apply && !o.path.empty()) {
    return Error::Errno(EINVAL, "--apply sets the weights from every path's speed: not with --path");
  }
  return o;
}

const DepthPoint* BestPoint(const std::vector<DepthPoint>& sweep) {
  const DepthPoint* best = nullptr;
  for (const auto& p : sweep) {
    if (best == nullptr || p.iops > best->iops) best = &p;
  }
  return best;
}

std::optional<std::vector<DepthPoint>> SweepDepths(
    const std::function<std::optional<DepthPoint>(int depth)>& measure, int max_depth,
    double min_gain) {
  std::vector<DepthPoint> out;
  double best = 0;
  for (int depth = 1; depth <= max_depth; depth *= 2) {
    auto p = measure(depth);
    if (!p) return std::nullopt;
    p->depth = depth;
    out.push_back(*p);
    if (depth > 1 && p->iops < best * (1.0 + min_gain)) break;
    best = std::max(best, p->iops);
  }
  return out;
}

double EstimateSeconds(const CalibrateOptions& o, size_t targets) {
  int depths = 0;
  for (int d = 1; d <= o.max_depth; d *= 2) ++depths;
  return static_cast<double>(targets) * o.step_s * (2 + 2 * depths);
}

namespace {

std::string Num(double v) { return fmt::format("{:.0f}", v); }

std::string Lat(const DepthPoint* p) {
  return p == nullptr ? "-" : fmt::format("{:.0f}/{:.0f}", p->mean_us, p->p99_us);
}

std::string SweepJson(const std::vector<DepthPoint>& sweep) {
  const DepthPoint* best = BestPoint(sweep);
  std::string out = fmt::format("{{\"best_iops\": {:.0f}, \"best_depth\": {}, \"sweep\": [",
                                best ? best->iops : 0.0, best ? best->depth : 0);
  for (size_t i = 0; i < sweep.size(); ++i) {
    const auto& p = sweep[i];
    out += fmt::format("{}{{\"depth\": {}, \"iops\": {:.0f}, \"latency_mean_us\": {:.0f}, "
                       "\"latency_p99_us\": {:.0f}}}",
                       i == 0 ? "" : ", ", p.depth, p.iops, p.mean_us, p.p99_us);
  }
  return out + "]}";
}

std::string JsonStr(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out + "\"";
}

}  // namespace

namespace {

// Each path's name and weight, in the order measured; empty unless every
// path was measured and there are two or more. `differ`: the slowest is
// under 85% of the fastest.
std::vector<std::pair<std::string, int>> Weights(const CalibrateResult& r, bool* differ) {
  std::vector<std::pair<std::string, double>> mbs;  // per path, in order
  bool all = false;
  *differ = false;
  for (const auto& t : r.targets) {
    if (t.name == "all") {
      all = true;
    } else {
      mbs.emplace_back(t.name, (t.seq_read_mbs + t.seq_write_mbs) / 2);
    }
  }
  if (!all || mbs.size() < 2 || !r.skipped.empty()) return {};
  double fastest = 0, slowest = mbs.front().second;
  for (const auto& [name, m] : mbs) {
    fastest = std::max(fastest, m);
    slowest = std::min(slowest, m);
  }
  if (slowest <= 0) return {};  // a path that moved nothing: no basis for weights
  *differ = slowest < 0.85 * fastest;
  std::vector<std::pair<std::string, int>> out;
  for (const auto& [name, m] : mbs) {
    const long w = *differ ? std::lround(std::min(10 * m / slowest, static_cast<double>(engine::kMaxWeight)))
                           : 1;
    out.emplace_back(name, static_cast<int>(w));
  }
  return out;
}

}  // namespace

WeightSuggestion SuggestWeight(const CalibrateResult& r) {
  bool differ = false;
  const auto w = Weights(r, &differ);
  if (!differ) return {};
  WeightSuggestion out;
  for (const auto& [name, weight] : w) {
    out.paths += (out.paths.empty() ? "" : "+") + name;
    out.weight += (out.weight.empty() ? "" : "+") + std::to_string(weight);
  }
  return out;
}

std::vector<int> WeightsToApply(const CalibrateResult& r) {
  bool differ = false;
  std::vector<int> out;
  for (const auto& [name, weight] : Weights(r, &differ)) out.push_back(weight);
  return out;
}

std::optional<std::string> ApplyRefusal(size_t paths_at_start, const std::vector<std::string>& measured,
                                        const std::vector<std::string>& skipped,
                                        const std::vector<int>& weights) {
  if (paths_at_start < 2) return std::string("nothing set: the mount has one path");
  if (!skipped.empty()) {
    return fmt::format("nothing set: not every path was measured (not measured: {})", fmt::join(skipped, ", "));
  }
  if (weights.size() != measured.size()) {
    return std::string("nothing set: a path measured no throughput");
  }
  return std::nullopt;
}

std::string RenderTable(const CalibrateResult& r) {
  std::string out = fmt::format(
      "scratch file {} MiB, {} s per step; random I/O {} KiB (writes UNSTABLE + COMMIT), "
      "sequential {} KiB calls; latency in us, mean/p99\n",
      r.file_bytes >> 20, r.step_s, r.small_io >> 10, r.large_io >> 10);
  out += fmt::format("{:<18} {:>10} {:>4} {:>15} {:>15} {:>10} {:>4} {:>15} {:>15} {:>11} {:>11}\n",
                     "PATH", "READ_IOPS", "@QD", "READ_LAT_QD1", "READ_LAT_BEST", "WRITE_IOPS",
                     "@QD", "WRITE_LAT_QD1", "WRITE_LAT_BEST", "SEQ_RD_MB/s", "SEQ_WR_MB/s");
  for (const auto& t : r.targets) {
    const DepthPoint* rb = BestPoint(t.rand_read);
    const DepthPoint* wb = BestPoint(t.rand_write);
    const DepthPoint* r1 = t.rand_read.empty() ? nullptr : &t.rand_read.front();
    const DepthPoint* w1 = t.rand_write.empty() ? nullptr : &t.rand_write.front();
    out += fmt::format(
        "{:<18} {:>10} {:>4} {:>15} {:>15} {:>10} {:>4} {:>15} {:>15} {:>11.1f} {:>11.1f}\n",
        t.name, rb ? Num(rb->iops) : "-", rb ? std::to_string(rb->depth) : "-", Lat(r1), Lat(rb),
        wb ? Num(wb->iops) : "-", wb ? std::to_string(wb->depth) : "-", Lat(w1), Lat(wb),
        t.seq_read_mbs, t.seq_write_mbs);
  }
  for (const auto& p : r.skipped) out += "not measured (down or disabled at the start): " + p + "\n";
  if (const auto w = SuggestWeight(r); !w.weight.empty()) {
    out += "paths differ in speed: suggested mount options path=" + w.paths + ",weight=" + w.weight +
           " (sequential MB/s against the slowest path's; see weight= in mpnfs(8))\n";
  }
  for (const auto& a : r.applied) out += "--apply: " + a + "\n";
  return out;
}

std::string RenderJson(const CalibrateResult& r) {
  const WeightSuggestion w = SuggestWeight(r);
  std::string out = fmt::format(
      "{{\"file_bytes\": {}, \"step_seconds\": {}, \"random_io_bytes\": {}, "
      "\"sequential_io_bytes\": {}, \"random_writes\": \"unstable+commit\", "
      "\"suggested_weight\": {}, \"suggested_paths\": {}, \"targets\": [",
      r.file_bytes, r.step_s, r.small_io, r.large_io, JsonStr(w.weight), JsonStr(w.paths));
  for (size_t i = 0; i < r.targets.size(); ++i) {
    const auto& t = r.targets[i];
    out += fmt::format(
        "{}\n  {{\"path\": {}, \"seq_read_mbs\": {:.1f}, \"seq_write_mbs\": {:.1f}, "
        "\"rand_read\": {}, \"rand_write\": {}}}",
        i == 0 ? "" : ",", JsonStr(t.name), t.seq_read_mbs, t.seq_write_mbs,
        SweepJson(t.rand_read), SweepJson(t.rand_write));
  }
  out += "\n], \"skipped\": [";
  for (size_t i = 0; i < r.skipped.size(); ++i) out += (i == 0 ? "" : ", ") + JsonStr(r.skipped[i]);
  out += "], \"applied\": [";
  for (size_t i = 0; i < r.applied.size(); ++i) out += (i == 0 ? "" : ", ") + JsonStr(r.applied[i]);
  return out + "]}\n";
}

namespace {

// One load step: `depth` calls kept outstanding on `client` for `seconds`.
struct Step {
  nfs::Client* client = nullptr;
  nfs::Fh fh;
  bool write = false;
  bool random = false;
  uint32_t io = 0;
  uint64_t extent = 0;      // offsets stay below (sequential: wrap there)
  uint64_t* cursor = nullptr;  // sequential position, carried between steps
  uint64_t stop_at = 0;     // sequential: stop (not wrap) when the cursor gets here; 0: wrap
  int depth = 1;
  double seconds = 1;
  nfs::Buffer data;         // writes
  std::string label;        // progress: "step=... path=..."
};

struct StepResult {
  uint64_t ops = 0, bytes = 0;
  double elapsed_s = 0;
  std::vector<uint32_t> lat_us;
};

// Shared with the callbacks. RunStep waits for every call it issued, but a
// callback may still be unlocking the mutex when RunStep returns: shared.
struct StepState {
  Mutex mu;
  CondVar cv;
  int inflight GUARDED_BY(mu) = 0;
  uint64_t ops GUARDED_BY(mu) = 0, bytes GUARDED_BY(mu) = 0;
  std::vector<uint32_t> lat_us GUARDED_BY(mu);
  std::optional<Error> error GUARDED_BY(mu);
};

Result<StepResult> RunStep(const Step& s, const std::function<bool(const std::string&)>& progress,
                           std::mt19937_64& rng) {
  auto st = std::make_shared<StepState>();
  const auto t0 = Clock::now();
  const auto end = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s.seconds));
  auto next_report = t0 + std::chrono::milliseconds(500);
  const uint64_t blocks = std::max<uint64_t>(1, s.extent / s.io);
  bool stopped = false, finished = false;
  auto done = [st](uint64_t n, Clock::time_point issued, std::optional<Error> err) {
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - issued).count();
    MutexLock lock(st->mu);
    --st->inflight;
    if (err) {
      if (!st->error) st->error = std::move(err);
    } else {
      ++st->ops;
      st->bytes += n;
      st->lat_us.push_back(static_cast<uint32_t>(std::min<int64_t>(us, UINT32_MAX)));
    }
    st->cv.SignalAll();
  };
  MutexLock lock(st->mu);
  for (;;) {
    const auto now = Clock::now();
    if (now >= end || st->error || stopped || (finished && st->inflight == 0)) break;
    if (now >= next_report) {
      const double el = std::chrono::duration<double>(now - t0).count();
      const std::string line =
          s.random ? fmt::format("progress {} depth={} iops={:.0f}", s.label, s.depth, st->ops / el)
                   : fmt::format("progress {} mbps={:.1f}", s.label, st->bytes / el / 1e6);
      lock.Unlock();
      stopped = !progress(line);
      lock.Lock();
      next_report = now + std::chrono::milliseconds(500);
      continue;
    }
    if (finished || st->inflight >= s.depth) {
      st->cv.WaitUntil(st->mu, std::min(end, next_report));
      continue;
    }
    uint64_t off;
    if (s.random) {
      off = (rng() % blocks) * s.io;
    } else {
      if (*s.cursor + s.io > s.extent) {
        if (s.stop_at != 0) {
          finished = true;  // the file is full: the step ends when the calls do
          continue;
        }
        *s.cursor = 0;
      }
      off = *s.cursor;
      *s.cursor += s.io;
    }
    ++st->inflight;
    lock.Unlock();
    const auto issued = Clock::now();
    const uint32_t io = s.io;
    if (s.write) {
      s.client->Write(s.fh, off, s.data, 0, io, false, engine::Cred{},
                      [done, io, issued](Result<nfs::WriteReply> r) {
                        done(io, issued, r ? std::nullopt : std::optional<Error>(r.error()));
                      });
    } else {
      s.client->Read(s.fh, off, io, engine::Cred{}, [done, issued](Result<nfs::ReadReply> r) {
        done(r ? r->len : 0, issued, r ? std::nullopt : std::optional<Error>(r.error()));
      });
    }
    lock.Lock();
  }
  while (st->inflight != 0) st->cv.Wait(st->mu);
  // Every call has ended: what they left, taken under the lock.
  std::optional<Error> error = std::move(st->error);
  const uint64_t ops = st->ops, bytes = st->bytes;
  std::vector<uint32_t> lat_us = std::move(st->lat_us);
  lock.Unlock();
  if (s.write && !stopped && !error) {
    auto c = nfs::Wait<nfs::CommitReply>([&](nfs::Cb<nfs::CommitReply> cb) {
      s.client->Commit(s.fh, engine::Cred{}, std::move(cb));
    });
    if (!c) return c.error();
  }
  if (stopped) return Error::Errno(ECANCELED, "calibrate stopped: the client went away");
  if (error) return *error;
  StepResult r;
  r.elapsed_s = std::chrono::duration<double>(Clock::now() - t0).count();
  r.ops = ops;
  r.bytes = bytes;
  r.lat_us = std::move(lat_us);
  return r;
}

DepthPoint PointOf(StepResult& r) {
  DepthPoint p;
  p.iops = r.elapsed_s > 0 ? static_cast<double>(r.ops) / r.elapsed_s : 0;
  if (!r.lat_us.empty()) {
    double sum = 0;
    for (uint32_t v : r.lat_us) sum += v;
    p.mean_us = sum / static_cast<double>(r.lat_us.size());
    const size_t k = std::min(r.lat_us.size() - 1, r.lat_us.size() * 99 / 100);
    std::nth_element(r.lat_us.begin(), r.lat_us.begin() + static_cast<long>(k), r.lat_us.end());
    p.p99_us = r.lat_us[k];
  }
  return p;
}

}  // namespace

bool ScratchFileIsOurs(const nfs::Attr& a) {
  return a.type == nfs::Ftype::kReg && a.uid == 0 && a.nlink == 1 && a.size == 0;
}

namespace {
constexpr char kScratchPrefix[] = ".mpnfs-calibrate-";
}  // namespace

std::string ScratchHost() {
  char h[256] = {};
  if (gethostname(h, sizeof h - 1) != 0) return "unknown";
  std::string s(h);
  for (char& c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_') c = '_';
  }
  return s.empty() ? "unknown" : s;
}

std::optional<ScratchMaker> ParseScratchName(const std::string& name) {
  if (name.rfind(kScratchPrefix, 0) != 0) return std::nullopt;
  const std::string rest = name.substr(sizeof kScratchPrefix - 1);
  const auto r = rest.rfind('-');
  if (r == std::string::npos || r == 0) return std::nullopt;
  const auto p = rest.rfind('-', r - 1);
  if (p == std::string::npos || p == 0) return std::nullopt;
  const std::string pid = rest.substr(p + 1, r - p - 1);
  if (pid.empty() || pid.size() > 10 || pid.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return ScratchMaker{rest.substr(0, p), std::stol(pid)};
}

namespace {

// Scratch files a calibrate of this host left when its process died
// (killed, crashed: the file's removal never ran), up to 1 GiB each, go
// before this one begins; each is reported on a progress line. Those of
// other hosts, and of processes still running here, are left alone.
// Best effort: a listing or a removal that fails stops nothing.
bool RemoveLeftovers(nfs::Client& admin, const nfs::Fh& root,
                     const std::function<bool(const std::string&)>& progress) {
  const engine::Cred root_cred{};
  const std::string host = ScratchHost();
  std::vector<std::string> names;
  uint64_t cookie = 0, verf = 0;
  for (int page = 0; page < 100000; ++page) {
    auto p = nfs::Wait<nfs::DirPage>([&](nfs::Cb<nfs::DirPage> cb) {
      admin.Readdir(root, cookie, verf, 32768, root_cred, std::move(cb));
    });
    if (!p) return true;
    for (const auto& e : p->entries) {
      if (e.name.rfind(kScratchPrefix, 0) == 0) names.push_back(e.name);
      cookie = e.cookie;
    }
    verf = p->verf;
    if (p->eof || p->entries.empty()) break;
  }
  for (const auto& name : names) {
    const auto maker = ParseScratchName(name);
    if (!maker || maker->host != host || maker->pid == static_cast<long>(getpid())) continue;
    if (maker->pid <= 0 || kill(static_cast<pid_t>(maker->pid), 0) == 0 || errno != ESRCH) continue;
    // Only a file as calibrate makes it (a regular file of root's with one link).
    auto lk = nfs::Wait<nfs::LookupReply>([&](nfs::Cb<nfs::LookupReply> cb) {
      admin.Lookup(root, name, root_cred, std::move(cb));
    });
    if (!lk) continue;
    std::optional<nfs::Attr> a = lk->attr;
    if (!a) {
      auto ga = nfs::Wait<nfs::Attr>([&](nfs::Cb<nfs::Attr> cb) { admin.Getattr(lk->fh, root_cred, std::move(cb)); });
      if (!ga) continue;
      a = *ga;
    }
    if (a->type != nfs::Ftype::kReg || a->uid != 0 || a->nlink != 1) continue;
    auto rm = nfs::Wait<nfs::Wcc>([&](nfs::Cb<nfs::Wcc> cb) { admin.Remove(root, name, root_cred, std::move(cb)); });
    if (!rm) continue;
    Log("mount")->info("calibrate: removed {} ({} bytes), left by process {} of this host, gone", name, a->size,
                       maker->pid);
    if (!progress(fmt::format("progress step=leftover removed={} bytes={} pid={}", name, a->size, maker->pid))) {
      return false;
    }
  }
  return true;
}

}  // namespace

std::optional<engine::Endpoint> SplitHostPort(const std::string& addr) {
  engine::Endpoint ep;
  ep.host = addr;
  ep.port = 0;  // any
  const auto colon = addr.rfind(':');
  if (colon == std::string::npos || addr.find(':') != colon) return ep;  // a name, or IPv6
  const std::string port = addr.substr(colon + 1);
  char* end = nullptr;
  const long v = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || v < 1 || v > 65535) return std::nullopt;
  ep.host = addr.substr(0, colon);
  ep.port = static_cast<int>(v);
  return ep;
}

Result<CalibrateResult> RunCalibrate(nfs::Client& admin, const nfs::Fh& root,
                                     const std::vector<CalibrateTarget>& targets,
                                     const CalibrateOptions& o,
                                     const std::function<bool(const std::string&)>& progress) {
  std::mt19937_64 rng(std::random_device{}());
  if (!RemoveLeftovers(admin, root, progress)) return Error::Errno(ECANCELED, "calibrate stopped");
  const std::string name = fmt::format("{}{}-{}-{:016x}", kScratchPrefix, ScratchHost(), getpid(), rng());
  const engine::Cred root_cred{};
  nfs::SetAttr sa;
  sa.mode = 0600;
  auto created = nfs::Wait<nfs::NewObject>([&](nfs::Cb<nfs::NewObject> cb) {
    admin.Create(root, name, nfs::CreateMode::kGuarded, sa, 0, root_cred, std::move(cb));
  });
  // EEXIST: a resent CREATE whose first transmission made the file (the
  // name is random): it is looked up and checked like a reply without a handle.
  const bool resent = !created && created.error().err == EEXIST;
  if (!created && !resent) {
    const int e = created.error().err;
    if (e == EROFS) return Error::Errno(e, "the export is read-only");
    if (e == ENOSPC || e == EDQUOT) return Error::Errno(e, "the export is full");
    return Error::Errno(e, "creating the scratch file " + name + ": " + created.error().what);
  }
  std::optional<nfs::Fh> handle = created ? created->fh : std::nullopt;
  if (!handle) {
    // Found by name: write to it only if it is what our CREATE made (an
    // empty regular file of root's with one link); else leave it alone.
    auto lk = nfs::Wait<nfs::LookupReply>([&](nfs::Cb<nfs::LookupReply> cb) {
      admin.Lookup(root, name, root_cred, std::move(cb));
    });
    if (!lk) return Error::Errno(lk.error().err, "looking up the scratch file " + name + ": " + lk.error().what);
    std::optional<nfs::Attr> a = lk->attr;
    if (!a) {
      auto ga = nfs::Wait<nfs::Attr>([&](nfs::Cb<nfs::Attr> cb) { admin.Getattr(lk->fh, root_cred, std::move(cb)); });
      if (!ga) return Error::Errno(ga.error().err, "GETATTR of the scratch file " + name + ": " + ga.error().what);
      a = *ga;
    }
    if (!ScratchFileIsOurs(*a)) {
      return Error::Errno(EEXIST, fmt::format(
          "the scratch file {} found is not the one calibrate created (type {}, uid {}, {} "
          "links, {} bytes): left alone",
          name, static_cast<int>(a->type), a->uid, a->nlink, a->size));
    }
    handle = lk->fh;
  }
  const nfs::Fh fh = *handle;

  auto run = [&]() -> Result<CalibrateResult> {
    CalibrateResult res;
    res.small_io = o.small_io;
    res.large_io = o.large_io;
    res.step_s = o.step_s;
    auto data = std::make_shared<nfs::Bytes>(std::max(o.small_io, o.large_io));
    for (size_t i = 0; i < data->size(); ++i) data->data()[i] = static_cast<char>(rng());
    uint64_t filled = 0;
    for (size_t ti = 0; ti < targets.size(); ++ti) {
      const auto& t = targets[ti];
      TargetResult tr;
      tr.name = t.name;
      Step s;
      s.client = t.client;
      s.fh = fh;
      s.data = data;
      // 1. Sequential writes: the first target fills the file.
      uint64_t cursor = 0;
      s.write = true;
      s.io = o.large_io;
      s.extent = ti == 0 ? o.size : filled;
      s.stop_at = ti == 0 ? o.size : 0;
      s.cursor = &cursor;
      s.depth = o.seq_depth;
      s.seconds = o.step_s;
      s.label = "step=seqwrite path=" + t.name;
      auto w = RunStep(s, progress, rng);
      if (!w) return w.error();
      tr.seq_write_mbs = w->elapsed_s > 0 ? static_cast<double>(w->bytes) / w->elapsed_s / 1e6 : 0;
      if (ti == 0) filled = std::max<uint64_t>(cursor / o.large_io * o.large_io, o.large_io);
      // 2. Sequential reads of the part written.
      cursor = 0;
      s.write = false;
      s.extent = filled;
      s.stop_at = 0;
      s.label = "step=seqread path=" + t.name;
      auto r = RunStep(s, progress, rng);
      if (!r) return r.error();
      tr.seq_read_mbs = r->elapsed_s > 0 ? static_cast<double>(r->bytes) / r->elapsed_s / 1e6 : 0;
      // 3., 4. Random reads, random writes, depth sweeps.
      for (bool write : {false, true}) {
        std::optional<Error> err;
        auto sweep = SweepDepths(
            [&](int depth) -> std::optional<DepthPoint> {
              Step q;
              q.client = t.client;
              q.fh = fh;
              q.data = data;
              q.write = write;
              q.random = true;
              q.io = o.small_io;
              q.extent = filled;
              q.depth = depth;
              q.seconds = o.step_s;
              q.label = fmt::format("step={} path={}", write ? "randwrite" : "randread", t.name);
              auto sr = RunStep(q, progress, rng);
              if (!sr) {
                err = sr.error();
                return std::nullopt;
              }
              return PointOf(*sr);
            },
            o.max_depth, o.min_gain);
        if (!sweep) return err ? *err : Error::Errno(ECANCELED, "calibrate stopped");
        (write ? tr.rand_write : tr.rand_read) = std::move(*sweep);
      }
      res.targets.push_back(std::move(tr));
    }
    res.file_bytes = filled;
    return res;
  };
  auto res = run();
  // The scratch file goes whatever happened (also after the client left).
  auto rm = nfs::Wait<nfs::Wcc>([&](nfs::Cb<nfs::Wcc> cb) { admin.Remove(root, name, root_cred, std::move(cb)); });
  if (!rm && res) return Error::Errno(rm.error().err, "removing " + name + ": " + rm.error().what);
  return res;
}

void RunCalibrateCommand(const std::string& cmd, Reply& out, const CalibrateMount& m) {
  auto o = ParseCalibrateArgs(cmd.size() > 9 ? cmd.substr(9) : std::string());
  if (!o) {
    out.Line("error: " + o.error().what);
    return;
  }
  if (m.read_only) {
    out.Line("error: the mount is read-only (ro): calibrate writes a scratch file");
    return;
  }
  nfs::Nfs3 admin(*m.engine);
  auto fs = nfs::Wait<nfs::FsStat>([&](nfs::Cb<nfs::FsStat> cb) { admin.Fsstat(m.root, {}, std::move(cb)); });
  if (!fs) {
    out.Line("error: FSSTAT: " + fs.error().what);
    return;
  }
  constexpr uint64_t kMinFree = 64ull << 20;
  if (fs->abytes < kMinFree) {
    out.Line(fmt::format("error: the export is full ({} MiB available; calibrate needs {} MiB)",
                         fs->abytes >> 20, kMinFree >> 20));
    return;
  }
  o->size = std::min(o->size, fs->abytes / 2);
  if (m.rsize > 0 && m.wsize > 0) o->large_io = std::min(m.rsize, m.wsize);
  o->size = std::max<uint64_t>(o->size / o->large_io * o->large_io, o->large_io);

  // The paths as they are now (paths can be added, disabled or removed on
  // a live mount). A path none of whose connections is up, or that is out
  // of the balancing, is not measured: its pinned calls would wait for it or
  // be moved to another path.
  const auto paths = m.engine->Paths();
  std::vector<std::unique_ptr<nfs::Nfs3>> pinned;
  std::vector<CalibrateTarget> targets;
  std::vector<std::string> measured;  // HOST:PORT of each path target, for --apply
  std::vector<std::string> skipped;
  bool named_found = false;
  const auto wanted = SplitHostPort(o->path);  // HOST or HOST:PORT, as the path commands
  if (!wanted) {
    out.Line("error: --path: bad port in '" + o->path + "' (1 to 65535)");
    return;
  }
  for (const auto& p : paths) {
    if (!o->path.empty() &&
        (p.endpoint.host != wanted->host || (wanted->port != 0 && p.endpoint.port != wanted->port))) {
      continue;
    }
    named_found = true;
    if (p.admin != "enabled" || (p.state != "up" && p.state != "degraded")) {
      skipped.push_back(p.endpoint.host);
      continue;
    }
    engine::SubmitOptions so;
    so.path = p.endpoint;
    // A pinned call that a path going down holds up fails after this long
    // (and the run with it) instead of stalling it.
    so.deadline = std::chrono::seconds(30);
    pinned.push_back(std::make_unique<nfs::Nfs3>(*m.engine, so));
    targets.push_back(CalibrateTarget{p.endpoint.host, pinned.back().get()});
    measured.push_back(fmt::format("{}:{}", p.endpoint.host, p.endpoint.port));
  }
  if (targets.empty() && named_found) {
    out.Line("error: no path to measure (down or disabled): " + fmt::format("{}", fmt::join(skipped, " ")));
    return;
  }
  if (targets.empty()) {
    std::string names;
    for (const auto& p : paths) names += " " + p.endpoint.host;
    out.Line("error: no path " + o->path + " in this mount (its paths:" + names + ")");
    return;
  }
  if (o->path.empty() && paths.size() > 1) targets.push_back(CalibrateTarget{"all", &admin});
  if (!out.Line(fmt::format("progress step=start targets={} file_mib={} estimated_max_s={:.0f}",
                            targets.size(), o->size >> 20, EstimateSeconds(*o, targets.size())))) {
    return;
  }
  auto res = RunCalibrate(admin, m.root, targets, *o, [&](const std::string& line) {
    return out.Alive() && out.Line(line);
  });
  if (!res) {
    out.Line("error: calibrate: " + res.error().what);
    return;
  }
  res->skipped = skipped;
  // --apply: all the weights or none (the engine checks that the paths are
  // still the ones measured as it sets them). What refuses it comes first,
  // as an "error:" line (mpnfsctl then exits 1), the measurements after it.
  std::string refused;
  if (o->apply) {
    const std::vector<int> w = WeightsToApply(*res);
    auto why = ApplyRefusal(paths.size(), measured, skipped, w);
    if (!why) {
      std::vector<std::pair<std::string, int>> set;
      for (size_t i = 0; i < w.size(); ++i) set.emplace_back(measured[i], w[i]);
      if (auto r = m.engine->SetWeights(set); !r) {
        why = "nothing set: " + r.error().what;
      } else {
        std::istringstream lines(*r);
        for (std::string line; std::getline(lines, line);) {
          Log("mount")->info("calibrate --apply: {}", line);
          res->applied.push_back(line);
        }
      }
    }
    if (why) refused = "error: calibrate --apply: " + *why + "\n";
  }
  out.Text(refused + (o->json ? RenderJson(*res) : RenderTable(*res)));
}

}  // namespace mpnfs::cli
