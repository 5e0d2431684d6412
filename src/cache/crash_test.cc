// The crash-state explorer for the SSD cache (write-back).
//
// A workload of write-back writes (whole-page batches that group-commit, and
// partial pages merged with the server's copy), writes sent around the cache,
// fills of clean data, evictions, flushes, truncates, detach and remount runs
// on a BlockCache whose every file operation goes through a CrashDisk
// (test/fakes/crash_disk.h), beside a model of the NFS server. Then, for
// every crash point (every operation of the disk's log), it builds the disk
// states the barriers allow (all of them when there are few, else a fixed-
// seed sample plus the two extremes: nothing unsynced landed / everything
// landed, i.e. a killed process), reopens the cache from each, lets it flush
// what it holds to a copy of the server as the server was at that point, and
// checks every byte of every file:
//  - every write made durable before the crash point reads back (unless a
//    write issued later, durable or not, replaced it): a write sent to the
//    server once answered, a write-back write once a Durable() call (fsync)
//    made after its answer returned, or an unmount after it ended;
//  - nothing older than a durable write comes back, to the cache or to the
//    server (a resurrected stale dirty page would be flushed over it);
//  - a write-back write answered but not yet durable may be lost, but then
//    the byte holds what an earlier write left (some write's value);
//  - what the cache serves after recovery is what the server then holds.
//
// MPNFS_CRASH_SEED, MPNFS_CRASH_OPS and MPNFS_CRASH_SAMPLES change the seed,
// the workload length and the states sampled per crash point for long runs
// by hand.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <random>
#include <thread>
#include <cstring>

#include "cache/block_cache.h"
#include "common/log.h"
#include "test/fakes/crash_disk.h"

namespace mpnfs::cache {
namespace {

using test::CrashDisk;

constexpr uint32_t kBlock = 64 << 10;
// Under ASan or TSan a reopen costs about ten times more: the sampled
// states shrink there (the plain build runs the full counts).
// (GCC defines __SANITIZE_*; clang answers __has_feature.)
#if !defined(__has_feature)
#define __has_feature(x) 0
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || \
    __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
constexpr uint64_t kSpan = 256 << 10;  // bytes of each file the workload touches
const std::vector<std::string> kFiles = {"fhA", "fhB", "fhC"};

uint64_t Env(const char* name, uint64_t def) {
  const char* v = std::getenv(name);
  return v ? std::strtoull(v, nullptr, 10) : def;
}

char Value(size_t wid, uint64_t off) {
  return static_cast<char>(1 + (wid * 131 + off * 7 + off / 4096) % 255);  // never 0
}

// What was asked of the system, and when (positions in the disk's log).
struct Logical {
  std::string fh;
  bool truncate = false;
  uint64_t off = 0, len = 0;  // a truncate: off = the new size
  size_t issued = 0, acked = SIZE_MAX;
};

struct ServerEvent {
  size_t pos;
  std::string fh;
  bool truncate;
  uint64_t off;
  std::string data;
};

// Calls `fn` with each state a crash at `point` may leave on `disk`: all
// of them when there are at most `cap`, else the two extremes (nothing
// unsynced landed, everything did) and `samples` drawn with a fixed seed.
// The first failure `fn` reports, or "".
std::string EachCrashState(const CrashDisk& disk, size_t point, double cap, uint64_t samples,
                           const std::function<std::string(CrashDisk&)>& fn) {
  const auto questions = disk.Questions(point);
  double product = 1;
  for (size_t n : questions) product *= static_cast<double>(n);
  std::vector<size_t> odo(questions.size(), 0);
  auto check = [&](const std::vector<size_t>& a) {
    size_t q = 0;
    auto state = disk.CrashState(point, [&a, &q](size_t) { return a[q++]; });
    return fn(*state);
  };
  if (product > cap) {
    std::mt19937_64 pick(point);
    std::vector<size_t> all;
    for (size_t n : questions) all.push_back(n - 1);
    if (std::string why = check(odo); !why.empty()) return why;
    if (std::string why = check(all); !why.empty()) return why;
    for (uint64_t k = 0; k < samples; ++k) {
      std::vector<size_t> a;
      for (size_t n : questions) a.push_back(pick() % n);
      if (std::string why = check(a); !why.empty()) return why;
    }
    return "";
  }
  while (true) {
    if (std::string why = check(odo); !why.empty()) return why;
    size_t i = 0;
    for (; i < odo.size(); ++i) {
      if (++odo[i] < questions[i]) break;
      odo[i] = 0;
    }
    if (i == odo.size()) return "";
  }
}

class Explorer {
 public:
  Explorer(uint64_t seed, uint32_t per_page, bool paged_crcs = false)
      : rng_(static_cast<uint32_t>(seed)), per_page_(per_page), paged_crcs_(paged_crcs) {
    // Each crash state is written out and reopened, thousands per test: in
    // memory (tmpfs), since the disk under test is CrashDisk's model, not
    // the host's, and the host disk's syncs only add waiting.
    char tmpl[] = "/dev/shm/mpnfs-crash-test-XXXXXX";
    const char* made = mkdtemp(tmpl);
    if (made == nullptr) {
      std::perror("crash_test: mkdtemp in /dev/shm");
      std::abort();
    }
    dir_ = made;
  }
  ~Explorer() {
    cache_.reset();
    std::filesystem::remove_all(dir_);
  }

  std::unique_ptr<BlockCache> OpenOn(CrashDisk& disk, std::string* err = nullptr) {
    CacheOptions o;
    o.dir = dir_;
    o.size = 16 * kBlock;
    o.block = kBlock;
    o.mode = CacheMode::kWriteBack;
    o.seq_cutoff = 0;
    o.disk = &disk;
    o.index_per_page = per_page_;
    if (paged_crcs_) {
      // Page checksums of 2 slots in RAM, the rest in the file `crcs`.
      o.crc_frame = kBlock / 4096 * 4;
      o.crc_ram = 2 * o.crc_frame;
    }
    o.commit_interval = std::chrono::hours(1);  // commits only when asked: a deterministic log
    auto c = BlockCache::Open(o);
    if (!c) {
      if (err) *err = c.error().what;
      return nullptr;
    }
    return std::move(*c);
  }

  // The server's files after the events up to `point`.
  std::map<std::string, std::string> Server(size_t point) const {
    std::map<std::string, std::string> s;
    for (const auto& e : events_) {
      if (e.pos > point) break;
      std::string& f = s[e.fh];
      if (e.truncate) {
        f.resize(e.off, '\0');
      } else {
        if (f.size() < e.off + e.data.size()) f.resize(e.off + e.data.size(), '\0');
        std::copy(e.data.begin(), e.data.end(), f.begin() + static_cast<ptrdiff_t>(e.off));
      }
    }
    return s;
  }
  static FileVersion VersionOf(const std::string& content, int64_t changes) {
    return FileVersion{content.size(), changes, changes};
  }
  int64_t Changes(const std::string& fh, size_t point) const {
    int64_t n = 0;
    for (const auto& e : events_) {
      if (e.pos > point) break;
      n += e.fh == fh;
    }
    return n;
  }
  FileVersion Current(const std::string& fh) {
    return VersionOf(Server(SIZE_MAX)[fh], Changes(fh, SIZE_MAX));
  }

  void Unmount() {
    if (cache_) EndRound();
    if (cache_) {
      const CacheStats k = cache_->Stats();
      copies_ += k.copies;
      copies_to_partner_ += k.copies_to_partner;
      rewrites_in_place_ += k.rewrites_in_place;
      tombstones_ += k.tombstones;
      checksum_failures_ += k.checksum_failures;
      checksum_reads_ += k.checksum_reads;
    }
    cache_.reset();
  }

  // --- the workload's operations, each as the filesystem layer does it
  void ServerApply(const std::string& fh, bool truncate, uint64_t off, std::string data) {
    events_.push_back(ServerEvent{disk_.Mark(), fh, truncate, off, std::move(data)});
  }
  void ServerWrite(const std::string& fh, uint64_t off, const std::string& data, bool flusher) {
    const FileVersion before = Current(fh);
    const uint64_t token = cache_->WriteStart(fh, off, data.size(), !flusher);
    ServerApply(fh, false, off, data);
    cache_->WriteDone(fh, token, off, data.data(), data.size(), true, false, before, Current(fh));
  }
  bool FlushRound(const std::string& fh, uint64_t max_bytes) {
    EndRound();  // (the flusher runs one round at a time)
    auto runs = cache_->CollectDirty(max_bytes, fh, std::chrono::steady_clock::now());
    if (runs.empty()) return false;
    for (const auto& r : runs) ServerWrite(r.fh, r.off, r.data, /*flusher=*/true);
    cache_->Flushed(runs);
    return true;
  }
  // The flusher's thread runs a round while the application goes on: its
  // runs are collected, their WRITEs reach the server now or at the end,
  // and the cache hears of them (Flushed) only at EndRound(). Meanwhile
  // write-back writes, fills, commits and fsyncs go on; what waits for the
  // flusher (a flush, a truncate, a write around the cache, an unmount)
  // ends the round first.
  void BeginRound(uint64_t max_bytes) {
    EndRound();
    round_ = cache_->CollectDirty(max_bytes, "", std::chrono::steady_clock::now());
    round_sent_ = rng_() % 2 == 0;
    if (round_sent_) {
      for (const auto& r : round_) ServerWrite(r.fh, r.off, r.data, /*flusher=*/true);
    }
  }
  void EndRound() {
    if (round_.empty()) return;
    if (!round_sent_) {
      for (const auto& r : round_) ServerWrite(r.fh, r.off, r.data, /*flusher=*/true);
    }
    cache_->Flushed(round_);
    round_.clear();
  }
  void FlushFile(const std::string& fh) {
    while (FlushRound(fh, UINT64_MAX)) {
    }
  }
  std::string Data(size_t wid, uint64_t off, uint64_t len) {
    std::string d(len, '\0');
    for (uint64_t i = 0; i < len; ++i) d[i] = Value(wid, off + i);
    return d;
  }
  // A new write sent around the cache.
  void WriteAroundNew(const std::string& fh, uint64_t off, uint64_t len) {
    const size_t wid = writes_.size();
    writes_.push_back(Logical{fh, false, off, len, disk_.Mark()});
    WriteAround(wid);
  }
  // The write went around the cache: after the unflushed writes it overlaps.
  void WriteAround(size_t wid) {
    const Logical& w = writes_[wid];
    EndRound();  // (its WRITEs may overlap: the filesystem orders them first)
    if (cache_->HasDirty(w.fh, w.off, w.len)) FlushFile(w.fh);
    ServerWrite(w.fh, w.off, Data(wid, w.off, w.len), false);
    writes_[wid].acked = disk_.Mark();
  }
  // Write-back writes of disjoint ranges submitted together (one batch).
  void WriteBackBatch(const std::vector<std::pair<uint64_t, uint64_t>>& ranges, const std::string& fh) {
    struct Pending {
      size_t wid;
      std::string data;
      std::promise<WbOutcome> got;
      size_t ack = 0;
    };
    std::vector<std::unique_ptr<Pending>> ps;
    for (auto [off, len] : ranges) {
      auto p = std::make_unique<Pending>();
      p->wid = writes_.size();
      writes_.push_back(Logical{fh, false, off, len, disk_.Mark()});
      p->data = Data(p->wid, off, len);
      ps.push_back(std::move(p));
    }
    for (auto& p : ps) Submit(*p, {});
    for (size_t i = 0; i < ps.size(); ++i) Finish(*ps[i]);
  }
  template <class P>
  void Submit(P& p, std::map<uint64_t, std::string> base) {
    const Logical& w = writes_[p.wid];
    for (const auto& r : round_) {
      if (r.fh == w.fh && r.off < w.off + w.len && w.off < r.off + r.data.size()) {
        ++rounds_overtaken_;
        break;
      }
    }
    WbWrite wb;
    wb.fh = w.fh;
    wb.off = w.off;
    wb.data = p.data.data();
    wb.len = p.data.size();
    wb.base = std::move(base);
    p.got = std::promise<WbOutcome>();
    cache_->WriteBack(std::move(wb), [this, &p](WbOutcome o) {
      p.ack = disk_.Mark();
      p.got.set_value(std::move(o));
    });
  }
  template <class P>
  void Finish(P& p) {
    for (int attempt = 0;; ++attempt) {
      WbOutcome o = p.got.get_future().get();
      const Logical& w = writes_[p.wid];
      if (o.kind == WbOutcome::kStored) {
        undurable_.push_back(p.wid);  // durable at the next Durable() or unmount
        return;
      }
      if (o.kind == WbOutcome::kUnavailable || attempt > 8) return WriteAround(p.wid);
      std::map<uint64_t, std::string> base;
      if (o.kind == WbOutcome::kNeedPages) {
        const std::string cur = Server(SIZE_MAX)[w.fh];
        for (uint64_t page : o.need) {
          base[page] = page < cur.size() ? cur.substr(page, 4096) : std::string();
        }
      }
      Submit(p, std::move(base));
    }
  }
  // As the filesystem truncates: flush, forget the file, send the truncate;
  // if writes came between the flush and the forgetting, flush again. Half
  // the time the first flush is left out, as if those writes came late.
  void Truncate(const std::string& fh, uint64_t size) {
    EndRound();  // (a truncate flushes first, through the flusher's queue)
    if (cache_->SizeFloor(fh) > 0 && rng_() % 2) FlushFile(fh);
    writes_.push_back(Logical{fh, true, size, 0, disk_.Mark()});
    std::promise<void> dropped;
    while (!cache_->Truncating(fh, [&dropped] { dropped.set_value(); })) FlushFile(fh);
    dropped.get_future().get();
    ServerApply(fh, true, size, "");
    cache_->TruncateDone(fh);  // (the SETATTR's answer: fills go on)
    writes_.back().acked = disk_.Mark();
    cache_->Observe(fh, Current(fh));
  }
  void Fill(const std::string& fh, uint64_t block) {
    const uint64_t token = cache_->ReadStart(fh);
    const std::string cur = Server(SIZE_MAX)[fh];
    const uint64_t off = block * kBlock;
    if (off >= cur.size()) return;
    const std::string data = cur.substr(off, kBlock);
    cache_->Fill(fh, token, off, data.data(), data.size());
  }
  // fsync: every write-back write to `fh` answered so far is durable once it returns.
  void Fsync(const std::string& fh) {
    std::promise<bool> got;
    cache_->Durable(fh, [&got](bool ok) { got.set_value(ok); });
    const bool ok = got.get_future().get();
    EXPECT_TRUE(ok) << "Durable failed on a sound disk";
    MadeDurable(&fh);
  }
  // (A commit covers every file's writes, but only `fh`'s are promised.)
  void MadeDurable(const std::string* fh = nullptr) {
    const size_t at = disk_.Mark();
    std::vector<size_t> rest;
    for (size_t wid : undurable_) {
      if (fh && writes_[wid].fh != *fh) {
        rest.push_back(wid);
      } else {
        writes_[wid].acked = at;
      }
    }
    undurable_ = std::move(rest);
  }
  void Remount() {
    Unmount();
    MadeDurable();  // an unmount commits
    std::string err;
    cache_ = OpenOn(disk_, &err);
    ASSERT_NE(cache_, nullptr) << err;
    for (const auto& fh : kFiles) cache_->Observe(fh, Current(fh));
  }

  void Run(size_t ops) {
    Remount();
    std::uniform_int_distribution<int> pick(0, 99);
    for (size_t i = 0; i < ops; ++i) {
      std::string fh = kFiles[rng_() % 2];  // fhC: fills only (evictions)
      const int what = pick(rng_);
      const uint64_t span_pages = kSpan / 4096;
      if (what < 40) {
        // 1-3 disjoint whole-page writes, one batch.
        std::vector<std::pair<uint64_t, uint64_t>> ranges;
        uint64_t at = (rng_() % (span_pages / 2)) * 4096;
        if (!round_.empty() && rng_() % 2) {
          // Over the pages of the flush round in progress.
          const DirtyRun& r = round_[rng_() % round_.size()];
          fh = r.fh;
          at = r.off / 4096 * 4096;
        }
        for (int k = 0, n = 1 + static_cast<int>(rng_() % 3); k < n && at < kSpan; ++k) {
          const uint64_t len = (1 + rng_() % 6) * 4096;
          ranges.emplace_back(at, len);
          at += len + (rng_() % 8) * 4096;
        }
        WriteBackBatch(ranges, fh);
        if (rng_() % 3 == 0) Fsync(fh);  // as a database's write + fdatasync
      } else if (what < 55) {
        const uint64_t off = rng_() % kSpan, len = 1 + rng_() % 9000;
        WriteBackBatch({{off, len}}, fh);
      } else if (what < 63) {
        const uint64_t off = rng_() % kSpan, len = 1 + rng_() % 20000;
        WriteAroundNew(fh, off, len);
      } else if (what < 75) {
        Fill(kFiles[rng_() % 3], rng_() % (kSpan / kBlock));
        Fill("fhC", rng_() % 12);
      } else if (what < 85) {
        if (split_rounds_ && rng_() % 2) {
          if (round_.empty()) {
            BeginRound((1 + rng_() % 64) * 4096);  // (larger: writes come over it)
          } else {
            EndRound();
          }
        } else {
          FlushRound("", (1 + rng_() % 8) * 4096);
        }
      } else if (what < 91) {
        Truncate(fh, rng_() % kSpan);
      } else if (what < 92) {
        cache_->Observe(fh, Current(fh));
      } else if (what < 94) {
        Fsync(kFiles[rng_() % 2]);
      } else if (what < 97) {
        // Detach: write-back stops, everything is flushed, the cache goes.
        cache_->StopWriteBack();
        FlushFile("");
        Remount();
      } else {
        Remount();
      }
      cache_->Quiesce(/*commit=*/false);
      if (::testing::Test::HasFatalFailure()) return;
    }
    Unmount();
    MadeDurable();
  }

  // Per byte of each file, the values it may hold after a crash at `point`.
  struct Values {
    uint8_t n = 1;
    char v[7] = {0};  // (more than 7 candidates: any value passes; the test fails if that happens)
    bool Has(char x) const { return n > 7 || std::find(v, v + n, x) != v + n; }
    void Add(char x) {
      if (Has(x)) return;
      if (n < 7) v[n] = x;
      ++n;
    }
  };
  // Per file: each byte's values, and the same in a form each state is
  // compared with at memory speed (most bytes have one value): `only` holds
  // a byte's value where it has one and 0 where it has several, `multi`
  // lists the bytes with several.
  struct FileAllowed {
    std::vector<Values> bytes;
    std::string only;
    std::vector<uint32_t> multi;
  };
  using Allowed = std::map<std::string, FileAllowed>;
  Allowed AllowedAt(size_t point) {
    std::map<std::string, std::vector<Values>> a;
    for (const auto& fh : kFiles) a[fh].assign(2 * kSpan, Values{});
    for (size_t wid = 0; wid < writes_.size(); ++wid) {
      const Logical& w = writes_[wid];
      if (w.issued > point) break;
      const bool acked = w.acked <= point;
      auto& bytes = a[w.fh];
      const uint64_t lo = w.off, hi = w.truncate ? bytes.size() : w.off + w.len;
      for (uint64_t b = lo; b < hi && b < bytes.size(); ++b) {
        const char v = w.truncate ? 0 : Value(wid, b);
        if (acked) bytes[b].n = 0;
        bytes[b].Add(v);
        if (bytes[b].n > 7) ++overflows_;
      }
    }
    Allowed out;
    for (auto& [fh, bytes] : a) {
      FileAllowed& f = out[fh];
      f.only.assign(bytes.size(), '\0');
      for (uint32_t b = 0; b < bytes.size(); ++b) {
        if (bytes[b].n == 1) {
          f.only[b] = bytes[b].v[0];
        } else {
          f.multi.push_back(b);
        }
      }
      f.bytes = std::move(bytes);
    }
    return out;
  }
  // Whether every byte of `f` (zeros past its end) is allowed: the quick
  // comparison; the caller walks the bytes only to say which one is not.
  static bool AllAllowed(const FileAllowed& ok, const std::string& f) {
    std::string g = f.substr(0, ok.only.size());
    g.resize(ok.only.size(), '\0');
    for (uint32_t b : ok.multi) {
      if (!ok.bytes[b].Has(g[b])) return false;
      g[b] = '\0';
    }
    return g == ok.only;
  }

  // Reopens the cache from one crash state and checks it; "" if sound.
  std::string Check(size_t point, CrashDisk& state, const Allowed& allowed) {
    std::string err;
    auto c = OpenOn(state, &err);
    if (!c) return "the cache does not open: " + err;
    auto server = Server(point);
    for (const auto& fh : kFiles) c->Observe(fh, VersionOf(server[fh], Changes(fh, point)));
    for (int round = 0; round < 64; ++round) {
      auto runs = c->CollectDirty(UINT64_MAX, "", std::chrono::steady_clock::now());
      if (runs.empty()) break;
      for (const auto& r : runs) {
        std::string& f = server[r.fh];
        if (f.size() < r.off + r.data.size()) f.resize(r.off + r.data.size(), '\0');
        std::copy(r.data.begin(), r.data.end(), f.begin() + static_cast<ptrdiff_t>(r.off));
      }
      c->Flushed(runs);
    }
    for (const auto& fh : kFiles) {
      const std::string& f = server[fh];
      // The size the cache gives the file is one its data makes.
      if (c->SizeFloor(fh) > f.size()) {
        return fmt::format("{}: the cache says the file is at least {} bytes, its data makes {}", fh,
                           c->SizeFloor(fh), f.size());
      }
      if (const FileAllowed& allow = allowed.at(fh); !AllAllowed(allow, f)) {
        const auto& ok = allow.bytes;
        for (uint64_t b = 0; b < ok.size(); ++b) {
          const char v = b < f.size() ? f[b] : 0;
          if (!ok[b].Has(v)) {
            return fmt::format("{} byte {} is {} after recovery; allowed: {} value(s), first {}", fh, b,
                               static_cast<int>(static_cast<unsigned char>(v)), ok[b].n,
                               static_cast<int>(static_cast<unsigned char>(ok[b].v[0])));
          }
        }
        return fh + ": the quick comparison and the byte walk disagree (a defect of this test)";
      }
      // What the cache serves must be what the server now holds (page by
      // page: a block is rarely valid whole).
      for (uint64_t pg = 0; pg * 4096 < f.size(); ++pg) {
        auto hit = c->Read(fh, pg * 4096, 4096);
        if (!hit) continue;
        const std::string want = f.substr(pg * 4096, hit->size());
        if (*hit != want) {
          size_t at = 0;
          while (at < hit->size() && at < want.size() && (*hit)[at] == want[at]) ++at;
          return fmt::format("{} page {}: the cache serves stale data after recovery ({} bytes served, {} held "
                             "by the server; first difference at byte {}: {} served, {} held)",
                             fh, pg, hit->size(), want.size(), at,
                             at < hit->size() ? static_cast<int>(static_cast<unsigned char>((*hit)[at])) : -1,
                             at < want.size() ? static_cast<int>(static_cast<unsigned char>(want[at])) : -1);
        }
      }
    }
    return "";
  }

  // Check() after a second crash during the recovery from `state`: at each
  // operation the recovery makes, in each state it may leave.
  std::string CheckRecoveryCrashes(size_t point, CrashDisk& state, const Allowed& allowed) {
    size_t end = 0;
    {
      std::string err;
      auto c = OpenOn(state, &err);
      if (!c) return "the cache does not open: " + err;
      end = state.Mark();
    }
    for (size_t p = 0; p <= end; ++p) {
      std::string why = EachCrashState(state, p, kSanitized ? 8 : 64, kSanitized ? 1 : 8, [&](CrashDisk& again) {
        ++recovery_states_;
        return Check(point, again, allowed);
      });
      if (!why.empty()) return fmt::format("a second crash at recovery operation {}: {}", p, why);
    }
    return "";
  }

  // Every crash point, each with its states; the first failure, or "".
  std::string Explore(uint64_t samples, size_t* states_checked) {
    const size_t end = disk_.Mark();
    std::mt19937_64 pick(4242);
    Allowed allowed;
    for (size_t point = 0; point <= end; ++point) {
      const auto questions = disk_.Questions(point);
      // What is allowed changes only where a write is issued or acknowledged.
      if (point == 0 || std::any_of(writes_.begin(), writes_.end(), [point](const Logical& w) {
            return w.issued == point || w.acked == point;
          })) {
        allowed = AllowedAt(point);
      }
      double product = 1;
      for (size_t n : questions) product *= static_cast<double>(n);
      std::vector<std::vector<size_t>> answers;
      if (product <= static_cast<double>(samples)) {
        std::vector<size_t> odo(questions.size(), 0);
        while (true) {
          answers.push_back(odo);
          size_t i = 0;
          for (; i < odo.size(); ++i) {
            if (++odo[i] < questions[i]) break;
            odo[i] = 0;
          }
          if (i == odo.size()) break;
        }
      } else {
        std::vector<size_t> none(questions.size(), 0), all;
        for (size_t n : questions) all.push_back(n - 1);
        answers.push_back(none);
        answers.push_back(all);
        for (uint64_t k = 0; k < samples; ++k) {
          std::vector<size_t> a;
          for (size_t n : questions) a.push_back(pick() % n);
          answers.push_back(std::move(a));
        }
      }
      for (const auto& a : answers) {
        size_t q = 0;
        auto state = disk_.CrashState(point, [&a, &q](size_t) { return a[q++]; });
        std::string why = recovery_crashes_ ? CheckRecoveryCrashes(point, *state, allowed)
                                            : Check(point, *state, allowed);
        ++*states_checked;
        if (!why.empty()) {
          if (std::getenv("MPNFS_CRASH_DEBUG")) Dump(point, a);
          return fmt::format("crash after disk operation {} of {}: {}", point, end, why);
        }
      }
    }
    return "";
  }

  void Dump(size_t point, const std::vector<size_t>& answers) {
    std::printf("answers:");
    for (size_t a : answers) std::printf(" %zu", a);
    std::printf("\nwrites:\n");
    for (size_t i = 0; i < writes_.size(); ++i) {
      const auto& w = writes_[i];
      std::printf("  w%zu %s %s [%llu,+%llu) issued %zu acked %zd\n", i, w.fh.c_str(),
                  w.truncate ? "TRUNC" : "write", (unsigned long long)w.off, (unsigned long long)w.len,
                  w.issued, w.acked == SIZE_MAX ? -1 : (ssize_t)w.acked);
    }
    std::printf("server events:\n");
    for (const auto& e : events_) {
      std::printf("  @%zu %s %s %llu +%zu first %d\n", e.pos, e.fh.c_str(), e.truncate ? "TRUNC" : "write",
                  (unsigned long long)e.off, e.data.size(), e.data.empty() ? -1 : (int)(unsigned char)e.data[0]);
    }
    std::printf("disk log up to %zu:\n", point + 3);
    disk_.DumpLog(point + 3);
  }

  CrashDisk disk_;
  std::unique_ptr<BlockCache> cache_;
  size_t overflows_ = 0;  // bytes with too many candidates to check
  uint64_t copies_ = 0, copies_to_partner_ = 0, rewrites_in_place_ = 0;  // over the workload's mounts
  uint64_t tombstones_ = 0;
  bool recovery_crashes_ = false;  // Explore: also crash during each recovery
  bool split_rounds_ = false;      // Run: flush rounds that span other operations (BeginRound)
  uint64_t rounds_overtaken_ = 0;  // runs of split rounds written again before their round ended
  size_t recovery_states_ = 0;     // states checked after a second crash
  std::string dir_;
  uint64_t checksum_failures_ = 0;
  uint64_t checksum_reads_ = 0;  // page checksums read back from their file

 private:
  std::mt19937 rng_;
  const uint32_t per_page_;
  const bool paged_crcs_;
  std::vector<Logical> writes_;
  std::vector<size_t> undurable_;  // write-back writes answered, not yet made durable
  std::vector<ServerEvent> events_;
  std::vector<DirtyRun> round_;  // a split round's runs, until EndRound
  bool round_sent_ = false;
};

void ExploreWith(uint32_t per_page, uint64_t default_seed = 20261130, uint64_t default_ops = 80,
                 bool paged_crcs = false, bool split_rounds = false) {
  const uint64_t seed = Env("MPNFS_CRASH_SEED", default_seed);
  Explorer x(seed, per_page, paged_crcs);
  x.split_rounds_ = split_rounds;
  x.Run(Env("MPNFS_CRASH_OPS", default_ops));
  if (split_rounds) {
    EXPECT_GT(x.rounds_overtaken_, 0u) << "no write came over a flush round in progress";
    std::printf("%llu writes came over a flush round in progress\n",
                static_cast<unsigned long long>(x.rounds_overtaken_));
  }
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  size_t states = 0;
  const std::string why = x.Explore(Env("MPNFS_CRASH_SAMPLES", 8), &states);
  EXPECT_EQ(why, "") << "seed " << seed;
  EXPECT_GT(states, 100u);
  EXPECT_EQ(x.overflows_, 0u) << "some bytes were not checked";
  // The workload reaches copy-on-write, to fresh slots and back to
  // partners, and rewrites of dirty pages in place.
  EXPECT_GT(x.copies_to_partner_, 0u);
  if (paged_crcs) {
    EXPECT_GT(x.checksum_reads_, 20u);  // (they did live in their file)
  }
  EXPECT_GT(x.copies_, x.copies_to_partner_);
  EXPECT_GT(x.rewrites_in_place_, 0u);
  EXPECT_EQ(x.checksum_failures_, 0u) << "a page failed its checksum during the workload";
  std::printf("explored %zu crash states over %zu disk operations (seed %llu, %u records per index page; "
              "%llu copies, %llu to a partner, %llu rewrites in place)\n",
              states, x.disk_.Mark(), static_cast<unsigned long long>(seed), per_page,
              static_cast<unsigned long long>(x.copies_), static_cast<unsigned long long>(x.copies_to_partner_),
              static_cast<unsigned long long>(x.rewrites_in_place_));
}

// One record per index page: every record change lands on its own, in any
// order the barriers allow.
TEST(CrashExplorerTest, EveryCrashStateKeepsAcknowledgedWritesAndNothingOlder) { ExploreWith(1); }

// The production layout (records share index pages).
TEST(CrashExplorerTest, TheSameHoldsWithFullIndexPages) { ExploreWith(0); }

// With the page checksums mostly out of RAM (crc_store.h): their file is
// scratch, rebuilt from the records at every mount, so the same holds.
// (Under a sanitizer block_cache_paged covers the checksum store's paths.)
TEST(CrashExplorerTest, TheSameHoldsWithChecksumsOutOfRam) {
  if (kSanitized) GTEST_SKIP() << "minutes more under a sanitizer: the plain build runs it";
  ExploreWith(1, 20261203, 80, true);
}

// Flush rounds that span other operations, as the flusher's thread runs
// beside the application: write-back writes (over the pages in flight too),
// fills, commits and fsyncs come between a round's collecting and its end.
TEST(CrashExplorerTest, TheSameHoldsWithFlushRoundsAcrossOtherOperations) {
  ExploreWith(1, 20261205, 80, false, /*split_rounds=*/true);
}

// A longer workload: this seed reaches the orders in which a record could
// extend the file alone or a freed newest copy bring back an older one (the
// targeted tests below reach them directly).
TEST(CrashExplorerTest, TheSameHoldsOverALongerWorkload) {
  if (kSanitized) GTEST_SKIP() << "about 10 minutes under a sanitizer: the plain build runs it";
  ExploreWith(1, 4, 150);
}

// Targeted workloads, each explored in every crash state: each reaches
// directly an order the random explorer reaches only with some seeds (4, 2,
// 5 and 7 at 150 operations).
std::string ExploreAll(Explorer& x, uint64_t samples = 256) {
  x.Unmount();
  x.MadeDurable();
  size_t states = 0;
  std::string why = x.Explore(kSanitized ? std::min<uint64_t>(samples, 8) : samples, &states);
  EXPECT_GT(states, 10u);
  return why;
}

// A write-back write that extends the file and one before it in another
// block, one commit: a crash may keep either record alone, and the one
// kept must not give the file a size that no data makes (so a record
// carries its own data's end, not the file's size of the moment).
TEST(CrashExplorerTest, ARecordKeptAloneDoesNotExtendTheFile) {
  Explorer x(1, 1);
  x.Remount();
  x.WriteBackBatch({{kBlock + 4096, 8192}}, "fhA");
  x.WriteBackBatch({{0, 4096}}, "fhA");
  x.Fsync("fhA");
  EXPECT_EQ(ExploreAll(x), "");
}

// Rule 2a. A block copied on write (its old slot freed by the commit, that
// free written but not synced), then its new slot freed, by a truncate or
// by an eviction: the old claim must not come back alone after a crash,
// or its stale dirty page is flushed over the truncate or the newer write.
void OlderCopy(Explorer& x) {
  x.Remount();
  x.WriteBackBatch({{0, 8192}}, "fhA");
  x.Fsync("fhA");  // the first slot's record is durable
  x.WriteBackBatch({{4096, 8192}}, "fhA");  // over a declared page: a copy
  x.FlushFile("fhA");  // its commit frees the old slot (not synced)
  x.Fsync("fhA");      // (nothing to commit: the newer write is on the server)
}
TEST(CrashExplorerTest, ATruncateOfACopiedBlockNeverBringsBackItsOlderCopy) {
  Explorer x(1, 1);
  OlderCopy(x);
  x.Truncate("fhA", 0);
  // (And a second crash while a recovery frees the claims a tombstone
  // supersedes: the tombstone goes only after they are durably freed.)
  x.recovery_crashes_ = true;
  EXPECT_EQ(ExploreAll(x), "");
  EXPECT_GT(x.copies_, 0u);
  EXPECT_GT(x.tombstones_, 0u) << "the workload no longer frees a newest copy before the older one's free is durable";
}
TEST(CrashExplorerTest, AnEvictionOfACopiedBlockNeverBringsBackItsOlderCopy) {
  Explorer x(1, 1);
  OlderCopy(x);
  x.WriteAroundNew("fhC", 0, 17 * kBlock);
  for (uint64_t b = 0; b < 17; ++b) x.Fill("fhC", b);  // (the 16 slots are taken: evictions)
  EXPECT_EQ(ExploreAll(x, 16), "");
  EXPECT_GT(x.copies_, 0u);
  EXPECT_GT(x.tombstones_, 0u) << "the workload no longer evicts a newest copy before the older one's free is durable";
}

// A tombstone that won at load shares its index page with another claim
// the recovery frees; that page must not free the tombstone before the
// claim it beat is durably freed (a second crash during the recovery would
// keep that claim alone).
TEST(CrashExplorerTest, ARecoveryKeepsATombstoneUntilTheClaimItBeatIsDurablyFreed) {
  Explorer x(1, 2);
  x.Remount();
  x.WriteBackBatch({{0, 8192}}, "fhA");       // slot 0 (index page 0)
  x.WriteBackBatch({{kBlock, 4096}}, "fhB");  // slot 1 (page 0)
  x.WriteBackBatch({{0, 4096}}, "fhB");       // slot 2 (page 1)
  x.Fsync("fhA");
  x.Fsync("fhB");
  x.WriteBackBatch({{4096, 8192}}, "fhA");  // copied to slot 3 (page 1)
  x.FlushFile("fhA");                       // its commit frees slot 0 (not synced)
  x.WriteBackBatch({{0, 4096}}, "fhB");     // slot 2 copied: freed by the next commit
  x.Truncate("fhA", 0);                     // slot 3: a tombstone
  x.Fsync("fhB");                           // page 1 = {slot 2's claim, the tombstone}
  x.recovery_crashes_ = true;
  EXPECT_EQ(ExploreAll(x), "");
  EXPECT_GT(x.tombstones_, 0u);
}

// A tombstone left on disk is an empty claim at the next mount, held until
// the first sync; its slot is then usable again (its pin is taken back
// once only: taken back twice, the slot would never be handed out again).
TEST(CrashExplorerTest, ASlotHeldForATombstoneIsUsableAgainAfterTheNextMount) {
  Explorer x(1, 1);
  OlderCopy(x);
  x.Truncate("fhA", 0);
  ASSERT_GT(x.cache_->Stats().tombstones, 0u);
  x.Remount();
  x.WriteAroundNew("fhC", 0, 16 * kBlock);
  for (uint64_t b = 0; b < 16; ++b) x.Fill("fhC", b);
  EXPECT_EQ(x.cache_->Stats().slots_used, 16u) << "a slot of the 16 can no longer be used";
}

// The newest copy of a block loses its dirty pages to a checksum failure
// before the commit that frees the old copy; a truncate then must wait for
// that commit (nothing of the file is "cleaning").
TEST(CrashExplorerTest, ATruncateWaitsForTheFreeOfAnOldCopyWhoseNewCopyWasLost) {
  Explorer x(1, 1);
  x.Remount();
  x.WriteBackBatch({{0, 8192}}, "fhA");  // slot 0
  x.Fsync("fhA");
  x.WriteBackBatch({{0, 8192}}, "fhA");  // copied to slot 1; slot 0 waits for the commit
  ASSERT_EQ(x.cache_->Stats().copies, 1u);
  {
    auto f = x.disk_.Open(x.dir_ + "/data", O_RDWR);
    ASSERT_TRUE(static_cast<bool>(f));
    for (uint64_t pg : {0, 1}) {
      const uint64_t at = kBlock + pg * 4096 + 17;
      char b = 0;
      ASSERT_TRUE((*f)->ReadAt(&b, 1, at));
      b ^= 0x40;
      ASSERT_TRUE((*f)->WriteAt(&b, 1, at));
    }
  }
  x.FlushFile("fhA");  // both pages fail their checksum: the copy is clean
  ASSERT_EQ(x.cache_->Stats().checksum_failures, 2u);
  x.Truncate("fhA", 0);
  EXPECT_EQ(ExploreAll(x), "");
}

// A short random workload in the production layout (records share index
// pages), with a second crash during every recovery.
TEST(CrashExplorerTest, ASecondCrashDuringRecoveryKeepsTheSameRules) {
  Explorer x(Env("MPNFS_CRASH_SEED", 7), 2);
  x.Run(Env("MPNFS_CRASH_OPS", kSanitized ? 12 : 30));
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  x.recovery_crashes_ = true;
  size_t states = 0;
  EXPECT_EQ(x.Explore(Env("MPNFS_CRASH_SAMPLES", kSanitized ? 1 : 2), &states), "");
  EXPECT_GT(states, kSanitized ? 20u : 50u);
  // (Each state's recovery crashes at each of its operations: several each.)
  EXPECT_GT(x.recovery_states_, 4 * states) << "the second crashes were not explored";
}

// Rule 2a, the other order: the newest copy goes first (the file is gone
// from the server: Drop) and the commit then frees the old slot. Once the
// commit has answered, no crash state brings the old claim back.
TEST(CacheDiskFaultTest, ACommitAfterTheNewestCopyWentSyncsTheOlderCopysFree) {
  Explorer x(1, 1);
  std::string err;
  x.cache_ = x.OpenOn(x.disk_, &err);
  ASSERT_NE(x.cache_, nullptr) << err;
  x.cache_->Observe("fhA", FileVersion{});
  std::vector<std::string> keep;
  keep.reserve(4);
  auto store = [&x, &keep](uint64_t off, char v) {
    keep.push_back(std::string(8192, v));
    WbWrite w;
    w.fh = "fhA";
    w.off = off;
    w.data = keep.back().data();
    w.len = keep.back().size();
    std::promise<WbOutcome> got;
    x.cache_->WriteBack(std::move(w), [&got](WbOutcome o) { got.set_value(std::move(o)); });
    EXPECT_EQ(got.get_future().get().kind, WbOutcome::kStored);
  };
  store(0, '1');
  x.cache_->Quiesce(/*commit=*/true);
  store(4096, '2');  // a copy, not committed yet
  ASSERT_EQ(x.cache_->Stats().copies, 1u);
  x.cache_->Drop("fhA");
  x.cache_->Quiesce(/*commit=*/true);
  const size_t end = x.disk_.Mark();
  x.cache_.reset();  // (states at `end` leave out what the unmount wrote)
  const std::string why = EachCrashState(x.disk_, end, 1e9, 0, [&](CrashDisk& state) -> std::string {
    auto c = x.OpenOn(state, &err);
    if (!c) return "the cache does not open: " + err;
    if (!c->CollectDirty(UINT64_MAX, "", std::chrono::steady_clock::now()).empty()) {
      return "a crash after the commit brings back the dropped file's older copy";
    }
    return "";
  });
  EXPECT_EQ(why, "");
}

// Write-back writes answered whose data then cannot be synced: fsync
// (Durable) fails, so the filesystem sends them to the server; the cache
// goes out of service; the pages are still there for the flusher, no record
// ever declares them, and once flushed nothing is dirty, now or at the next
// mount.
TEST(CacheDiskFaultTest, AFailedDataSyncFailsFsyncKeepsThePagesForTheFlusherAndDeclaresNothing) {
  Explorer x(1, 0);
  std::string err;
  x.cache_ = x.OpenOn(x.disk_, &err);
  ASSERT_NE(x.cache_, nullptr) << err;
  x.cache_->Observe("fhA", FileVersion{});
  std::string data(8192, 'x');
  WbWrite w;
  w.fh = "fhA";
  w.off = 0;
  w.data = data.data();
  w.len = data.size();
  std::promise<WbOutcome> got;
  x.cache_->WriteBack(std::move(w), [&got](WbOutcome o) { got.set_value(std::move(o)); });
  ASSERT_EQ(got.get_future().get().kind, WbOutcome::kStored);
  x.disk_.set_fail([](const CrashDisk::Op& op) { return op.kind == CrashDisk::Op::kSync && op.inode == 0; });
  std::promise<bool> durable;
  x.cache_->Durable("fhA", [&durable](bool ok) { durable.set_value(ok); });
  EXPECT_FALSE(durable.get_future().get()) << "fsync succeeded although the data was never synced";
  x.disk_.set_fail(nullptr);
  EXPECT_EQ(x.cache_->Stats().state, "out");
  std::promise<bool> again;
  x.cache_->Durable("fhA", [&again](bool ok) { again.set_value(ok); });
  EXPECT_FALSE(again.get_future().get()) << "a later fsync trusted the cache again";
  ASSERT_TRUE(x.cache_->HasDirty("fhA", 0, data.size()));
  auto runs = x.cache_->CollectDirty(UINT64_MAX, "", std::chrono::steady_clock::now());
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].data, data) << "the flusher cannot get the answered write";
  x.cache_->Flushed(runs);
  EXPECT_FALSE(x.cache_->HasDirty("fhA", 0, data.size()));
  x.cache_.reset();
  x.cache_ = x.OpenOn(x.disk_, &err);
  ASSERT_NE(x.cache_, nullptr) << err;
  EXPECT_TRUE(x.cache_->CollectDirty(UINT64_MAX, "", std::chrono::steady_clock::now()).empty());
}

// A page invalidated (a write sent around the cache) while a copy-on-write
// is between its planning and its apply step must not come back valid in
// the block's new slot (a fresh one or the block's partner).
// (The read may miss; if it hits, it must be the server's new page.)
void InvalidationDuringACopy(bool partner) {
  Explorer x(1, 0);
  std::string err;
  x.cache_ = x.OpenOn(x.disk_, &err);
  ASSERT_NE(x.cache_, nullptr) << err;
  const FileVersion v1{kBlock, 1, 1}, v2{kBlock, 2, 2};
  x.cache_->Observe("fhA", v1);
  const std::string clean(kBlock, 'c');
  const uint64_t t0 = x.cache_->ReadStart("fhA");
  x.cache_->Fill("fhA", t0, 0, clean.data(), clean.size());
  x.cache_->Quiesce();
  std::vector<std::string> keep;
  auto store = [&x, &keep](char v) {
    keep.push_back(std::string(4096, v));
    WbWrite w;
    w.fh = "fhA";
    w.off = 2 * 4096;
    w.data = keep.back().data();
    w.len = 4096;
    std::promise<WbOutcome> got;
    x.cache_->WriteBack(std::move(w), [&got](WbOutcome o) { got.set_value(std::move(o)); });
    EXPECT_EQ(got.get_future().get().kind, WbOutcome::kStored);
    x.cache_->Quiesce();
  };
  keep.reserve(8);
  store('1');
  if (partner) {
    store('2');  // a copy to a fresh slot; the old one becomes the partner
  }
  std::atomic<bool> armed{true};
  uint64_t token = 0;
  x.disk_.set_fail([&](const CrashDisk::Op& op) {
    if (op.kind == CrashDisk::Op::kWrite && op.inode == 0 && armed.exchange(false)) {
      token = x.cache_->WriteStart("fhA", 5 * 4096, 4096);  // a write around the cache, page 5
    }
    return false;
  });
  store('3');
  x.disk_.set_fail(nullptr);
  EXPECT_FALSE(armed.load());
  const std::string server5(4096, 's');
  x.cache_->WriteDone("fhA", token, 5 * 4096, server5.data(), 4096, true, false, v1, v2);
  const auto k = x.cache_->Stats();
  EXPECT_EQ(k.copies, partner ? 2u : 1u);
  EXPECT_EQ(k.copies_to_partner, partner ? 1u : 0u);
  auto got = x.cache_->Read("fhA", 5 * 4096, 4096);
  if (got) {
    EXPECT_EQ(*got, server5) << "the cache serves page 5 as it was before the write sent around it";
  }
}
TEST(CacheDiskFaultTest, AnInvalidationDuringAFreshCopyIsNotUndone) { InvalidationDuringACopy(false); }
TEST(CacheDiskFaultTest, AnInvalidationDuringAPartnerCopyIsNotUndone) { InvalidationDuringACopy(true); }

// While a rewritten dirty block waits for its commit (as PostgreSQL's
// blocks do on a write-back mount), its old slot is still dirty; a flush
// round then must not send both copies (they could land in either order,
// the older last, and the newer would be marked clean).
TEST(CacheDiskFaultTest, AFlushDuringACopyOnWriteSendsOnlyTheNewestCopy) {
  Explorer x(1, 0);
  std::string err;
  x.cache_ = x.OpenOn(x.disk_, &err);
  ASSERT_NE(x.cache_, nullptr) << err;
  x.cache_->Observe("fhA", FileVersion{});
  auto store = [&x](const std::string& data) {
    WbWrite w;
    w.fh = "fhA";
    w.off = 8192;
    w.data = data.data();
    w.len = data.size();
    auto got = std::make_shared<std::promise<WbOutcome>>();
    auto f = got->get_future();
    x.cache_->WriteBack(std::move(w), [got](WbOutcome o) { got->set_value(std::move(o)); });
    return f;
  };
  const std::string older(8192, 'o'), newer(8192, 'n');
  ASSERT_EQ(store(older).get().kind, WbOutcome::kStored);
  x.cache_->Quiesce();  // committed: the older copy is durable and dirty
  // The newer copy goes to a new slot; no commit has freed the old one.
  ASSERT_EQ(store(newer).get().kind, WbOutcome::kStored);
  EXPECT_EQ(x.cache_->Stats().copies, 1u);
  auto runs = x.cache_->CollectDirty(UINT64_MAX, "", std::chrono::steady_clock::now());
  size_t covering = 0;
  for (const auto& r : runs) {
    if (r.off <= 8192 && r.off + r.data.size() >= 16384) {
      ++covering;
      EXPECT_EQ(r.data.substr(8192 - r.off, 8192), newer);
    }
  }
  EXPECT_EQ(covering, 1u);
}

// A record of the last commit (synced, before any mark or later page said
// so) whose dirty page, declared by an earlier commit too, is then damaged
// on the media: the write is reported lost (fsync, checksum_failures), not
// silently replaced by the slot's older record.
// (A page first declared by that last commit cannot be told from one a
// crash kept from the disk: index.h.)
TEST(CrashExplorerTest, ADamagedPageOfTheLastCommitIsReportedNotReverted) {
  Explorer x(1, 0);
  x.Remount();
  x.WriteBackBatch({{0, 4096}}, "fhA");     // page 0
  x.Fsync("fhA");                           // commit 1
  x.WriteBackBatch({{8192, 4096}}, "fhA");  // page 2, in place
  x.Fsync("fhA");                           // commit 2: synced, answered
  const size_t end = x.disk_.Mark();
  auto state = x.disk_.CrashState(end, [](size_t n) { return n - 1; });  // everything landed
  x.cache_.reset();  // (releases the directory lock; the state is taken)
  auto content = state->Content(x.dir_ + "/data");
  ASSERT_TRUE(content.has_value());
  // Page 0 of the block's slot (also holding page 2).
  const char v = Value(0, 0);
  int64_t at = -1;
  for (uint64_t s = 0; s < 16; ++s) {
    if ((*content)[s * kBlock] == v && (*content)[s * kBlock + 1] == Value(0, 1) &&
        (*content)[s * kBlock + 8192] == Value(1, 8192)) {
      at = static_cast<int64_t>(s * kBlock);
    }
  }
  ASSERT_GE(at, 0);
  {
    auto f = state->Open(x.dir_ + "/data", 0);
    ASSERT_TRUE(static_cast<bool>(f));
    char b = static_cast<char>(v ^ 0x40);
    ASSERT_TRUE((*f)->WriteAt(&b, 1, static_cast<uint64_t>(at) + 17));
  }
  std::string err;
  auto c = x.OpenOn(*state, &err);
  ASSERT_NE(c, nullptr) << err;
  c->Observe("fhA", x.Current("fhA"));
  auto runs = c->CollectDirty(UINT64_MAX, "", std::chrono::steady_clock::now());
  bool page0 = false, page2 = false;
  for (const auto& r : runs) {
    page0 = page0 || r.off == 0;
    page2 = page2 || (r.off <= 8192 && r.off + r.data.size() > 8192);
  }
  c->Flushed(runs);
  EXPECT_FALSE(page0) << "a damaged page was sent";
  EXPECT_TRUE(page2) << "the last commit's record was not kept";
  EXPECT_TRUE(c->TakeLost("fhA")) << "an fsync'd write vanished without a report";
  EXPECT_EQ(c->Stats().checksum_failures, 1u);
}

// After a clean unmount every record page is known synced (the mark covers
// them), so the next load checks nothing.
TEST(CrashExplorerTest, AfterACleanUnmountEveryRecordPageIsKnownSynced) {
  Explorer x(1, 0);
  CacheOptions o;
  o.dir = x.dir_;
  o.size = 16 * kBlock;
  o.block = kBlock;
  o.mode = CacheMode::kWriteBack;
  o.seq_cutoff = 0;
  o.disk = &x.disk_;
  o.commit_interval = std::chrono::milliseconds(100);
  auto opened = BlockCache::Open(o);
  ASSERT_TRUE(opened.ok());
  std::unique_ptr<BlockCache> c = std::move(*opened);
  c->Observe("fhA", FileVersion{0, 0, 0});
  c->Observe("fhC", FileVersion{kBlock, 1, 1});
  const std::string d(4096, 'w');
  auto wb = [&](uint64_t off) {
    WbWrite w;
    w.fh = "fhA";
    w.off = off;
    w.data = d.data();
    w.len = d.size();
    std::promise<WbOutcome> got;
    c->WriteBack(std::move(w), [&got](WbOutcome o2) { got.set_value(std::move(o2)); });
    EXPECT_EQ(got.get_future().get().kind, WbOutcome::kStored);
    std::promise<bool> done;
    c->Durable("fhA", [&done](bool ok) { done.set_value(ok); });
    EXPECT_TRUE(done.get_future().get());
  };
  wb(0);
  wb(8192);
  const std::string clean(kBlock, 'c');
  c->Fill("fhC", c->ReadStart("fhC"), 0, clean.data(), clean.size());  // a record write, no sync
  c->Quiesce(false);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // (an idle mark)
  c.reset();  // clean unmount
  auto data = x.disk_.Content(x.dir_ + "/data");
  ASSERT_TRUE(data.has_value());
  const uint64_t region = 16ull * kBlock;
  const uint64_t pages = (data->size() - region) / 4096;
  uint64_t max_seq = 0, synced = 0;
  for (uint64_t i = 0; i < pages; ++i) {
    const char* p = data->data() + region + i * 4096;
    uint32_t magic;
    std::memcpy(&magic, p, 4);
    if (magic != 0x474e504d) continue;  // (a page of this format)
    uint64_t seq, s;
    std::memcpy(&seq, p + 8, 8);
    std::memcpy(&s, p + 24, 8);
    synced = std::max(synced, s);
    if (i + 1 < pages) max_seq = std::max(max_seq, seq);  // (the last page is the mark)
  }
  EXPECT_GT(max_seq, 0u);
  EXPECT_GE(synced, max_seq) << "a record page is not known synced after a clean unmount";
}

}  // namespace
}  // namespace mpnfs::cache
