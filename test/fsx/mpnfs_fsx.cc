// mpnfs_fsx: a randomized file-operation tester. It drives one file through a
// seeded random sequence of operations (overlapping writes, reads, truncates
// that shrink and extend, mmap reads and writes, several descriptors, close and
// reopen, fsync, page-cache drops, times set right after writes, mode changes,
// writes by another user, optional remounts) and checks every result against a
// copy of the file it keeps in memory, its mode and its mtime included. The
// same seed and options give the same sequence of operations.
//
// On the first difference it prints the offset, the expected and the actual
// byte, which operation wrote each of them (when it can tell), the last
// operations, and exits 1. Exit 2 is a usage error.
#include <fcntl.h>
#include <getopt.h>
#include <setjmp.h>
#include <signal.h>
#include <grp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <vector>

namespace {

struct Options {
  uint64_t seed = 0;
  bool seed_given = false;
  uint64_t ops = 10000;
  uint64_t maxlen = 64 << 10;    // longest read or write
  uint64_t maxsize = 256 << 10;  // the file never grows past this
  int fds = 3;
  bool mmap = true;
  int msync = -1;  // -1: at random, 0: never, 1: always
  bool direct = false;
  uint64_t align = 4096;      // offsets and lengths of I/O with --direct
  double reopen_prob = 5;     // per cent of operations that close and reopen
  double trunc_open_prob = 10;  // per cent of reopens with O_TRUNC
  double append_prob = 10;    // per cent of reopens with O_APPEND (not with --direct)
  bool attrs = true;   // set times and modes, and check them
  long other_uid = -1;  // writes by this user too (the file's mode then lets others write)
  std::string remount_cmd;
  uint64_t remount_every = 500;
  uint64_t verify_every = 20;
  uint64_t progress = 0;
  size_t log_len = 30;
  bool quiet = false;
  bool verbose = false;
  std::string path;
};

Options opt;

// A PRNG whose output depends on the seed alone (not on the C++ library's
// distributions, which differ between implementations).
class Rng {
 public:
  explicit Rng(uint64_t seed) : g_(seed) {}
  uint64_t below(uint64_t n) { return n ? g_() % n : 0; }
  uint64_t range(uint64_t lo, uint64_t hi) { return lo + below(hi - lo + 1); }  // inclusive
  bool percent(double p) { return static_cast<double>(g_() % 1000000) < p * 10000.0; }

 private:
  std::mt19937_64 g_;
};

// The byte that operation `op` writes at file offset `pos`: different for every
// operation and offset, never zero (zero is what holes and extensions read as).
uint8_t pattern(uint64_t op, uint64_t pos) {
  uint64_t x = op * 0x9E3779B97F4A7C15ull ^ (pos + 1) * 0xC2B2AE3D27D4EB4Full;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  auto b = static_cast<uint8_t>(x);
  return b ? b : 0xA5;
}

struct Written {  // a write, kept to name the writer of a stray byte
  uint64_t op, off, len;
};

struct Fd {
  int fd = -1;
  bool append = false;
};

// ---- state --------------------------------------------------------------

std::vector<uint8_t> ref;       // the file as it should be; its size is the file's size
std::vector<uint32_t> owner;    // per byte: the operation that wrote it, 0 = zero fill
std::vector<Written> history;   // every write, in order
std::vector<Fd> fds;
std::deque<std::string> oplog;  // the last operations, for a failure report
uint64_t opno = 0;              // the operation running now (1-based)
long pagesize = 4096;

// The attributes as they should be. The mode is always known; the mtime
// only after the tester set it and until the data changes (each change sets
// it to "now"). Pages written through a mapping and not yet written back
// (`map_dirty`) may reach the server after a later utimensat and move the
// mtime there, as FUSE without writeback_cache does not write them back
// before a SETATTR: times set meanwhile are not checked.
mode_t want_mode = 0644;
bool mtime_known = false;
timespec want_mtime{};
bool map_dirty = false;

struct Counters {
  uint64_t write = 0, append = 0, read = 0, mapread = 0, mapwrite = 0, truncate = 0, sync = 0,
           fadvise = 0, reopen = 0, remount = 0, verify = 0, skipped = 0, times = 0, chmod = 0,
           other_write = 0;
} count;

// ---- reporting ----------------------------------------------------------

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

void log_op(const std::string& s) {
  std::string line = fmt("#%-7" PRIu64 " ", opno) + s;
  if (opt.verbose) printf("%s\n", line.c_str());
  oplog.push_back(std::move(line));
  while (oplog.size() > opt.log_len) oplog.pop_front();
}

std::string rerun_hint() {
  std::string s = fmt("--seed %" PRIu64 " --ops %" PRIu64 " --maxlen %" PRIu64 " --maxsize %" PRIu64
                      " --fds %d",
                      opt.seed, opt.ops, opt.maxlen, opt.maxsize, opt.fds);
  if (!opt.mmap) s += " --no-mmap";
  if (opt.msync == 0) s += " --no-msync";
  if (opt.msync == 1) s += " --msync";
  if (opt.direct) s += " --direct";
  if (!opt.attrs) s += " --no-attrs";
  if (opt.other_uid >= 0) s += fmt(" --other-uid %ld", opt.other_uid);
  s += fmt(" --reopen-prob %g --trunc-prob %g --append-prob %g --verify-every %" PRIu64, opt.reopen_prob,
           opt.trunc_open_prob, opt.append_prob, opt.verify_every);
  if (!opt.remount_cmd.empty()) s += fmt(" --remount-every %" PRIu64 " --remount-cmd ...", opt.remount_every);
  return s;
}

[[noreturn]] void fail(const std::string& what) {
  fflush(stdout);
  fprintf(stderr, "mpnfs_fsx: FAILED at op #%" PRIu64 ": %s\n", opno, what.c_str());
  fprintf(stderr, "mpnfs_fsx: reference size 0x%zx (%zu)\n", ref.size(), ref.size());
  fprintf(stderr, "mpnfs_fsx: last %zu operations (offsets and sizes in hex):\n", oplog.size());
  for (auto& l : oplog) fprintf(stderr, "  %s\n", l.c_str());
  fprintf(stderr, "mpnfs_fsx: seed %" PRIu64 "; same run: mpnfs_fsx %s %s\n", opt.seed,
              rerun_hint().c_str(), opt.path.c_str());
  exit(1);
}

[[noreturn]] void fail_errno(const std::string& what) { fail(what + ": " + strerror(errno)); }

// Who put the byte `b` at offset `pos`: the newest write whose pattern there is `b`.
std::string whose(uint8_t b, uint64_t pos) {
  if (b == 0) return "zero (a hole, a truncate or an extension)";
  for (auto it = history.rbegin(); it != history.rend(); ++it)
    if (pos >= it->off && pos < it->off + it->len && pattern(it->op, pos) == b)
      return fmt("data of op #%" PRIu64 " (write 0x%" PRIx64 "+0x%" PRIx64 ")", it->op, it->off, it->len);
  return "no write of this run put it there";
}

// Compares `got` (n bytes read at file offset off) with the reference.
void check_bytes(const char* where, uint64_t off, const uint8_t* got, uint64_t n) {
  if (n == 0) return;  // (nothing to compare; and ref may be empty: no pointer past it)
  const uint8_t* want = ref.data() + off;
  if (memcmp(want, got, n) == 0) return;
  uint64_t i = 0;
  while (want[i] == got[i]) i++;
  uint64_t j = i, bad = 0;
  while (j < n && want[j] != got[j]) j++;
  for (uint64_t k = i; k < n; k++) bad += want[k] != got[k];
  uint64_t pos = off + i;
  std::string exp_src = owner[pos] ? fmt("written by op #%" PRIu32, owner[pos]) : std::string("zero (a hole, a truncate or an extension)");
  fail(fmt("data mismatch (%s) at file offset 0x%" PRIx64 " (%" PRIu64 "): expected 0x%02x, got 0x%02x; "
           "0x%" PRIx64 " bytes differ from there on in a row, 0x%" PRIx64 " in the 0x%" PRIx64
           " bytes checked at 0x%" PRIx64 "\n  expected byte: %s\n  actual byte: %s",
           where, pos, pos, want[i], got[i], j - i, bad, n, off, exp_src.c_str(), whose(got[i], pos).c_str()));
}

// ---- I/O helpers ----------------------------------------------------------

struct Buf {  // an aligned buffer for O_DIRECT
  uint8_t* p = nullptr;
  size_t cap = 0;
  uint8_t* get(size_t n) {
    if (n > cap) {
      free(p);
      cap = (n + 65535) & ~size_t(65535);
      if (posix_memalign(reinterpret_cast<void**>(&p), 4096, cap) != 0) {
        fprintf(stderr, "mpnfs_fsx: out of memory\n");
        exit(1);
      }
    }
    return p;
  }
} iobuf, cmpbuf;

uint64_t read_full(int fd, uint8_t* buf, uint64_t len, uint64_t off, const char* what) {
  uint64_t done = 0;
  while (done < len) {
    ssize_t r = pread(fd, buf + done, len - done, static_cast<off_t>(off + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      fail_errno(fmt("%s: pread(0x%" PRIx64 "+0x%" PRIx64 ")", what, off + done, len - done));
    }
    if (r == 0) break;
    done += static_cast<uint64_t>(r);
    if (opt.direct && done % opt.align) break;  // a short direct read ends at EOF
  }
  return done;
}

void write_full(int fd, const uint8_t* buf, uint64_t len, uint64_t off, bool append) {
  uint64_t done = 0;
  while (done < len) {
    ssize_t r = append ? write(fd, buf + done, len - done)
                       : pwrite(fd, buf + done, len - done, static_cast<off_t>(off + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      fail_errno(fmt("%s(0x%" PRIx64 "+0x%" PRIx64 ")", append ? "write" : "pwrite", off + done, len - done));
    }
    if (r == 0) fail(fmt("pwrite at 0x%" PRIx64 " wrote nothing", off + done));
    done += static_cast<uint64_t>(r);
  }
}

void set_size(uint64_t n) {
  ref.resize(n, 0);
  owner.resize(n, 0);
}

// The data changed: the mtime is the server's "now".
void data_changed() { mtime_known = false; }

// A write or truncate by `uid`: one by a user other than root clears
// setuid, and setgid on a group-executable file (the kernel's and the
// server's rule; root keeps them: CAP_FSETID).
void kill_priv(uid_t uid) {
  if (uid == 0) return;
  want_mode &= ~static_cast<mode_t>(S_ISUID);
  if (want_mode & S_IXGRP) want_mode &= ~static_cast<mode_t>(S_ISGID);
}

void apply_write(uint64_t off, uint64_t len, const uint8_t* data) {
  data_changed();
  if (off + len > ref.size()) set_size(off + len);
  memcpy(ref.data() + off, data, len);
  std::fill(owner.begin() + static_cast<long>(off), owner.begin() + static_cast<long>(off + len),
            static_cast<uint32_t>(opno));
  history.push_back({opno, off, len});
}

int open_flags(bool trunc, bool append) {
  int f = O_RDWR | (opt.direct ? O_DIRECT : 0);
  if (trunc) f |= O_TRUNC;
  if (append) f |= O_APPEND;
  return f;
}

// ---- SIGBUS protection for mapped accesses ---------------------------------

sigjmp_buf bus_jmp;
volatile sig_atomic_t bus_armed = 0;

void on_bus(int) {
  if (bus_armed) siglongjmp(bus_jmp, 1);
  signal(SIGBUS, SIG_DFL);
  raise(SIGBUS);
}

// ---- whole-file verification ------------------------------------------------

void verify(const char* why, int fd) {
  count.verify++;
  if (opt.attrs) {
    // The mode alone first, as stat -c %a asks for it (statx with
    // STATX_MODE: the kernel may answer from the attributes it holds),
    // before fstat below fetches everything.
    struct statx sx;
    if (statx(fd, "", AT_EMPTY_PATH, STATX_MODE, &sx) != 0) fail_errno("statx");
    if ((sx.stx_mode & 07777) != want_mode)
      fail(fmt("mode mismatch (%s, statx STATX_MODE): %04o, expected %04o", why,
               static_cast<unsigned>(sx.stx_mode & 07777), static_cast<unsigned>(want_mode)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) fail_errno("fstat");
  if (opt.attrs && (st.st_mode & 07777) != want_mode)
    fail(fmt("mode mismatch (%s): %04o, expected %04o", why, static_cast<unsigned>(st.st_mode & 07777),
             static_cast<unsigned>(want_mode)));
  if (opt.attrs && mtime_known &&
      (st.st_mtim.tv_sec != want_mtime.tv_sec || st.st_mtim.tv_nsec != want_mtime.tv_nsec))
    fail(fmt("mtime mismatch (%s): %lld.%09ld, expected %lld.%09ld (set by the tester)", why,
             static_cast<long long>(st.st_mtim.tv_sec), st.st_mtim.tv_nsec,
             static_cast<long long>(want_mtime.tv_sec), want_mtime.tv_nsec));
  if (static_cast<uint64_t>(st.st_size) != ref.size())
    fail(fmt("size mismatch (%s): st_size 0x%" PRIx64 " (%" PRIu64 "), expected 0x%zx (%zu)", why,
             static_cast<uint64_t>(st.st_size), static_cast<uint64_t>(st.st_size), ref.size(), ref.size()));
  const uint64_t chunk = 256 << 10;
  uint64_t off = 0;
  for (;;) {
    uint8_t* b = cmpbuf.get(chunk);
    uint64_t got = read_full(fd, b, chunk, off, why);
    uint64_t want = ref.size() > off ? std::min<uint64_t>(chunk, ref.size() - off) : 0;
    check_bytes(why, off, b, std::min(got, want));
    if (got != want)
      fail(fmt("short or long read (%s) at 0x%" PRIx64 ": read 0x%" PRIx64 " bytes, the file has 0x%" PRIx64
               " there (size 0x%zx)",
               why, off, got, want, ref.size()));
    if (want < chunk) break;
    off += chunk;
  }
}

// ---- descriptors ----------------------------------------------------------

void open_fd(Fd& f, bool trunc, bool append) {
  f.fd = open(opt.path.c_str(), open_flags(trunc, append));
  if (f.fd < 0) fail_errno("open " + opt.path);
  f.append = append;
  if (trunc) {
    set_size(0);
    data_changed();  // (O_TRUNC sets mtime, even on an empty file)
    kill_priv(geteuid());
  }
}

void close_fd(Fd& f) {
  if (close(f.fd) != 0) fail_errno(fmt("close fd %d", f.fd));
  f.fd = -1;
}

void close_all() {
  for (auto& f : fds) close_fd(f);
  map_dirty = false;  // (the last close writes the mapped pages back)
}

void reopen_all_and_verify(const char* why) {
  for (auto& f : fds) open_fd(f, false, false);
  verify(why, fds[0].fd);
}

// ---- operations -------------------------------------------------------------

uint64_t align_down(uint64_t v) { return opt.direct ? v / opt.align * opt.align : v; }
uint64_t align_up(uint64_t v) { return opt.direct ? (v + opt.align - 1) / opt.align * opt.align : v; }

// A random range for a write: anywhere up to maxsize, sometimes at or past EOF.
void pick_write_range(Rng& r, uint64_t& off, uint64_t& len) {
  len = r.range(1, opt.maxlen);
  switch (r.below(8)) {
    case 0: off = ref.size() + r.below(opt.maxlen); break;  // past EOF: leaves a hole
    case 1: off = ref.size(); break;                        // at EOF
    default: off = r.below(opt.maxsize); break;
  }
  off = align_down(off);
  if (off >= opt.maxsize) off = align_down(r.below(opt.maxsize));
  len = align_up(len);
  if (off + len > opt.maxsize) len = opt.maxsize - off;
}

void op_write(Rng& r) {
  Fd& f = fds[r.below(fds.size())];
  uint64_t off, len;
  pick_write_range(r, off, len);
  if (f.append) off = ref.size();  // O_APPEND: the data goes at EOF whatever the offset
  if (f.append && off + len > opt.maxsize) {
    count.skipped++;
    log_op(fmt("append fd%d skipped (file at maxsize)", f.fd));
    return;
  }
  uint8_t* b = iobuf.get(len);
  for (uint64_t i = 0; i < len; i++) b[i] = pattern(opno, off + i);
  size_t old = ref.size();
  log_op(fmt("%s fd%d 0x%" PRIx64 "+0x%" PRIx64 " size 0x%zx->0x%" PRIx64, f.append ? "append" : "write ",
             f.fd, off, len, old, std::max<uint64_t>(old, off + len)));
  write_full(f.fd, b, len, off, f.append);
  apply_write(off, len, b);
  kill_priv(geteuid());
  (f.append ? count.append : count.write)++;
}

void op_read(Rng& r) {
  Fd& f = fds[r.below(fds.size())];
  uint64_t len = align_up(r.range(1, opt.maxlen));
  uint64_t off = r.below(8) == 0 && ref.size() ? ref.size() - std::min<uint64_t>(ref.size(), r.below(opt.maxlen))
                                               : r.below(opt.maxsize);
  off = align_down(off);
  log_op(fmt("read   fd%d 0x%" PRIx64 "+0x%" PRIx64 " (size 0x%zx)", f.fd, off, len, ref.size()));
  uint8_t* b = iobuf.get(len);
  uint64_t got = read_full(f.fd, b, len, off, "read");
  uint64_t want = ref.size() > off ? std::min<uint64_t>(len, ref.size() - off) : 0;
  check_bytes("read", off, b, std::min(got, want));
  if (got != want)
    fail(fmt("read at 0x%" PRIx64 " of 0x%" PRIx64 " returned 0x%" PRIx64 " bytes, expected 0x%" PRIx64
             " (size 0x%zx)",
             off, len, got, want, ref.size()));
  count.read++;
}

bool do_msync(Rng& r) { return opt.msync == 1 || (opt.msync == -1 && r.below(2) == 0); }

void op_mapread(Rng& r) {
  Fd& f = fds[r.below(fds.size())];
  if (ref.empty()) {
    count.skipped++;
    log_op("mapread skipped (empty file)");
    return;
  }
  uint64_t off = r.below(ref.size());
  uint64_t len = std::min<uint64_t>(r.range(1, opt.maxlen), ref.size() - off);
  uint64_t base = off / static_cast<uint64_t>(pagesize) * static_cast<uint64_t>(pagesize);
  uint64_t mlen = off + len - base;
  log_op(fmt("mapread fd%d 0x%" PRIx64 "+0x%" PRIx64 " (size 0x%zx)", f.fd, off, len, ref.size()));
  void* m = mmap(nullptr, mlen, PROT_READ, MAP_SHARED, f.fd, static_cast<off_t>(base));
  if (m == MAP_FAILED) fail_errno("mmap for reading");
  uint8_t* b = iobuf.get(len);
  if (sigsetjmp(bus_jmp, 1)) {
    bus_armed = 0;
    fail(fmt("SIGBUS reading the mapping at 0x%" PRIx64 "+0x%" PRIx64 " (the file is shorter than 0x%zx?)", off,
             len, ref.size()));
  }
  bus_armed = 1;
  memcpy(b, static_cast<uint8_t*>(m) + (off - base), len);
  bus_armed = 0;
  if (munmap(m, mlen) != 0) fail_errno("munmap");
  check_bytes("mapread", off, b, len);
  count.mapread++;
}

void op_mapwrite(Rng& r) {
  Fd& f = fds[r.below(fds.size())];
  uint64_t off, len;
  pick_write_range(r, off, len);
  bool sync = do_msync(r);
  size_t old = ref.size();
  log_op(fmt("mapwrite fd%d 0x%" PRIx64 "+0x%" PRIx64 " size 0x%zx->0x%" PRIx64 "%s", f.fd, off, len, old,
             std::max<uint64_t>(old, off + len), sync ? " msync" : ""));
  if (off + len > ref.size()) {  // a mapping cannot extend the file: ftruncate first
    if (ftruncate(f.fd, static_cast<off_t>(off + len)) != 0) fail_errno("ftruncate before mapwrite");
    set_size(off + len);
  }
  uint64_t base = off / static_cast<uint64_t>(pagesize) * static_cast<uint64_t>(pagesize);
  uint64_t mlen = off + len - base;
  void* m = mmap(nullptr, mlen, PROT_READ | PROT_WRITE, MAP_SHARED, f.fd, static_cast<off_t>(base));
  if (m == MAP_FAILED) fail_errno("mmap for writing");
  uint8_t* b = iobuf.get(len);
  for (uint64_t i = 0; i < len; i++) b[i] = pattern(opno, off + i);
  if (sigsetjmp(bus_jmp, 1)) {
    bus_armed = 0;
    fail(fmt("SIGBUS writing the mapping at 0x%" PRIx64 "+0x%" PRIx64, off, len));
  }
  bus_armed = 1;
  memcpy(static_cast<uint8_t*>(m) + (off - base), b, len);
  bus_armed = 0;
  if (sync && msync(m, mlen, MS_SYNC) != 0) fail_errno("msync");
  if (munmap(m, mlen) != 0) fail_errno("munmap");
  apply_write(off, len, b);
  if (!sync) map_dirty = true;
  count.mapwrite++;
}

void op_truncate(Rng& r) {
  Fd& f = fds[r.below(fds.size())];
  uint64_t n;
  switch (r.below(4)) {
    case 0: n = r.below(ref.size() + 1); break;                              // shrink (or keep)
    case 1: n = ref.size() + r.below(opt.maxsize - std::min<uint64_t>(ref.size(), opt.maxsize) + 1); break;  // extend
    case 2: n = ref.size() ? r.below(std::min<uint64_t>(ref.size(), opt.maxlen)) : 0; break;  // near zero
    default: n = r.below(opt.maxsize + 1); break;
  }
  log_op(fmt("truncate fd%d 0x%zx->0x%" PRIx64, f.fd, ref.size(), n));
  if (ftruncate(f.fd, static_cast<off_t>(n)) != 0) fail_errno("ftruncate");
  set_size(n);  // an extension reads as zeros
  data_changed();
  kill_priv(geteuid());
  count.truncate++;
}

void op_sync(Rng& r) {
  Fd& f = fds[r.below(fds.size())];
  bool data = r.below(2);
  log_op(fmt("%s fd%d", data ? "fdatasync" : "fsync", f.fd));
  if ((data ? fdatasync(f.fd) : fsync(f.fd)) != 0) fail_errno(data ? "fdatasync" : "fsync");
  map_dirty = false;  // (fsync writes the mapped pages back)
  count.sync++;
}

// Drops the file's clean cached pages, so that the next reads come from the server.
void op_fadvise(Rng& r) {
  Fd& f = fds[r.below(fds.size())];
  log_op(fmt("fadvise DONTNEED fd%d", f.fd));
  int e = posix_fadvise(f.fd, 0, 0, POSIX_FADV_DONTNEED);
  if (e != 0) {
    errno = e;
    fail_errno("posix_fadvise");
  }
  count.fadvise++;
}

void op_reopen(Rng& r) {
  bool all = r.below(4) == 0;
  bool trunc = r.percent(opt.trunc_open_prob);
  bool append = !opt.direct && r.percent(opt.append_prob);
  size_t which = r.below(fds.size());
  std::string how = std::string(trunc ? " O_TRUNC" : "") + (append ? " O_APPEND" : "");
  if (all) {
    log_op(fmt("reopen all %zu fds (close all; fd%d gets%s)", fds.size(), fds[which].fd,
               how.empty() ? " O_RDWR" : how.c_str()));
    close_all();
    for (size_t i = 0; i < fds.size(); i++) {
      if (i == which) open_fd(fds[i], trunc, append);
      else open_fd(fds[i], false, false);
    }
  } else {
    log_op(fmt("reopen fd%d%s", fds[which].fd, how.c_str()));
    close_fd(fds[which]);
    open_fd(fds[which], trunc, append);
  }
  log_op(fmt("  -> fds now%s", [] {
           std::string s;
           for (auto& f : fds) s += fmt(" %d%s", f.fd, f.append ? "(append)" : "");
           return s;
         }().c_str()));
  count.reopen++;
}

// Sets the file's times right after whatever came before (tar x, cp -p
// and rsync -a do so with futimens on the open descriptor, touch -d with
// utimensat on the path), then checks them at once and at every later
// verification until the data changes.
void op_times(Rng& r) {
  timespec ts[2];
  ts[0].tv_sec = static_cast<time_t>(r.range(1000000000, 1900000000));
  ts[0].tv_nsec = static_cast<long>(r.below(1000000000));
  ts[1].tv_sec = static_cast<time_t>(r.range(1000000000, 1900000000));
  ts[1].tv_nsec = static_cast<long>(r.below(1000000000));
  const bool by_path = r.below(2) == 0;
  Fd& f = fds[r.below(fds.size())];
  log_op(fmt("utimes %s mtime %lld.%09ld%s", by_path ? "path" : fmt("fd%d", f.fd).c_str(),
             static_cast<long long>(ts[1].tv_sec), ts[1].tv_nsec, map_dirty ? " (mapped pages dirty: unchecked)" : ""));
  if ((by_path ? utimensat(AT_FDCWD, opt.path.c_str(), ts, 0) : futimens(f.fd, ts)) != 0)
    fail_errno(by_path ? "utimensat" : "futimens");
  want_mtime = ts[1];
  mtime_known = !map_dirty;
  count.times++;
  verify("right after setting the times", fds[r.below(fds.size())].fd);
}

// A new mode, owner read and write kept (the descriptors reopen); with
// --other-uid every mode lets others write. setuid and setgid come and go.
// (Not setgid without group execute where another user writes: Linux
// clears it for a writer outside the file's group, NFS servers keep it.)
void op_chmod(Rng& r) {
  static const mode_t kOwn[] = {0644, 0600, 0664, 0755, 04755, 02755, 06755, 02745};
  static const mode_t kShared[] = {0666, 0777, 04777, 02777, 06777, 04767};
  const bool shared = opt.other_uid >= 0;
  mode_t m = shared ? kShared[r.below(std::size(kShared))] : kOwn[r.below(std::size(kOwn))];
  if (geteuid() != 0) m &= ~static_cast<mode_t>(S_ISUID | S_ISGID);  // (a user may not set them at will)
  Fd& f = fds[r.below(fds.size())];
  log_op(fmt("chmod fd%d %04o", f.fd, static_cast<unsigned>(m)));
  if (fchmod(f.fd, m) != 0) fail_errno("fchmod");
  want_mode = m;
  count.chmod++;
}

// A write by --other-uid (a process of its own, opening the file by path):
// it clears setuid, and setgid on a group-executable file, and the writer's
// own stat must show that at once.
void op_other_write(Rng& r) {
  uint64_t off, len;
  pick_write_range(r, off, len);
  uint8_t* b = iobuf.get(len);
  for (uint64_t i = 0; i < len; i++) b[i] = pattern(opno, off + i);
  log_op(fmt("write by uid %ld 0x%" PRIx64 "+0x%" PRIx64 " (mode %04o)", opt.other_uid, off, len,
             static_cast<unsigned>(want_mode)));
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) fail_errno("fork");
  if (pid == 0) {
    const auto id = static_cast<uid_t>(opt.other_uid);
    if (setgroups(0, nullptr) != 0 || setresgid(id, id, id) != 0 || setresuid(id, id, id) != 0) _exit(3);
    int fd = open(opt.path.c_str(), O_WRONLY | (opt.direct ? O_DIRECT : 0));
    if (fd < 0) _exit(4);
    uint64_t done = 0;
    while (done < len) {
      ssize_t w = pwrite(fd, b + done, len - done, static_cast<off_t>(off + done));
      if (w <= 0) _exit(5);
      done += static_cast<uint64_t>(w);
    }
    _exit(close(fd) == 0 ? 0 : 6);
  }
  int st = 0;
  if (waitpid(pid, &st, 0) != pid) fail_errno("waitpid");
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
    fail(fmt("the write by uid %ld failed (child status 0x%x: 3 setuid, 4 open, 5 pwrite, 6 close)", opt.other_uid,
             st));
  apply_write(off, len, b);
  kill_priv(static_cast<uid_t>(opt.other_uid));
  count.other_write++;
  verify("right after another user's write", fds[r.below(fds.size())].fd);
}

void remount(const char* why) {
  log_op(fmt("remount (%s): close all, run the remount command, reopen, verify", why));
  close_all();
  fflush(stdout);
  int st = system(opt.remount_cmd.c_str());
  if (st == -1) fail_errno("running the remount command");
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
    fail(fmt("the remount command failed (status 0x%x): %s", st, opt.remount_cmd.c_str()));
  reopen_all_and_verify("after remount");
  count.remount++;
}

// ---- command line -----------------------------------------------------------

void usage(FILE* out) {
  fprintf(out,
          "usage: mpnfs_fsx [options] FILE\n"
          "Randomized operations on FILE (created anew), checked against an in-memory copy.\n"
          "  --seed N           PRNG seed (default: from the clock; always printed)\n"
          "  --ops N            operations to run (default 10000)\n"
          "  --maxlen N         longest read or write (default 64K; K/M/G suffixes)\n"
          "  --maxsize N        largest file size (default 256K)\n"
          "  --fds N            descriptors open on FILE at once (default 3)\n"
          "  --mmap|--no-mmap   mapped reads and writes (default on; off with --direct)\n"
          "  --msync|--no-msync msync after each mapped write (default: at random)\n"
          "  --direct           O_DIRECT descriptors; I/O aligned to --align (default 4096)\n"
          "  --reopen-prob P    per cent of operations that close and reopen (default 5)\n"
          "  --trunc-prob P     per cent of reopens with O_TRUNC (default 10)\n"
          "  --append-prob P    per cent of reopens with O_APPEND (default 10)\n"
          "  --no-attrs         no times set, no mode changes (and neither checked)\n"
          "  --other-uid UID    also writes by this user (the file's modes then let others\n"
          "                     write; its setuid and setgid must go by the kernel's rule)\n"
          "  --remount-cmd CMD  at random points close everything, run CMD with /bin/sh\n"
          "                     (it remounts), reopen and verify the whole file; again at the end\n"
          "  --remount-every N  a remount every N operations on average (default 500)\n"
          "  --verify-every N   verify the whole file every N operations (default 20)\n"
          "  --progress N       print a line every N operations (default off)\n"
          "  --log N            operations shown on a failure (default 30)\n"
          "  --quiet            print only the seed, failures and the final line\n"
          "  --verbose          print every operation\n");
}

uint64_t parse_num(const char* name, const char* s) {
  char* end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 0);
  if (errno || end == s || *s == '-') goto bad;
  switch (*end) {
    case 'k': case 'K': v <<= 10; end++; break;
    case 'm': case 'M': v <<= 20; end++; break;
    case 'g': case 'G': v <<= 30; end++; break;
    default: break;
  }
  if (*end == 0) return v;
bad:
  fprintf(stderr, "mpnfs_fsx: bad number for --%s: %s\n", name, s);
  exit(2);
}

double parse_pct(const char* name, const char* s) {
  char* end;
  double v = strtod(s, &end);
  if (end == s || *end || v < 0 || v > 100) {
    fprintf(stderr, "mpnfs_fsx: --%s takes a per cent from 0 to 100: %s\n", name, s);
    exit(2);
  }
  return v;
}

void parse_args(int argc, char** argv) {
  enum { SEED = 256, OPS, MAXLEN, MAXSIZE, FDS, MMAP, NOMMAP, MSYNC, NOMSYNC, DIRECT, ALIGN, REOPEN, TRUNCP,
         APPENDP, RCMD, REVERY, VEVERY, PROGRESS, LOG, QUIET, VERBOSE, HELP, NOATTRS, OTHERUID };
  static const option longopts[] = {
      {"seed", required_argument, nullptr, SEED},        {"ops", required_argument, nullptr, OPS},
      {"maxlen", required_argument, nullptr, MAXLEN},    {"maxsize", required_argument, nullptr, MAXSIZE},
      {"fds", required_argument, nullptr, FDS},          {"mmap", no_argument, nullptr, MMAP},
      {"no-mmap", no_argument, nullptr, NOMMAP},         {"msync", no_argument, nullptr, MSYNC},
      {"no-msync", no_argument, nullptr, NOMSYNC},       {"direct", no_argument, nullptr, DIRECT},
      {"align", required_argument, nullptr, ALIGN},      {"reopen-prob", required_argument, nullptr, REOPEN},
      {"trunc-prob", required_argument, nullptr, TRUNCP}, {"append-prob", required_argument, nullptr, APPENDP},
      {"remount-cmd", required_argument, nullptr, RCMD}, {"remount-every", required_argument, nullptr, REVERY},
      {"verify-every", required_argument, nullptr, VEVERY}, {"progress", required_argument, nullptr, PROGRESS},
      {"log", required_argument, nullptr, LOG},          {"quiet", no_argument, nullptr, QUIET},
      {"verbose", no_argument, nullptr, VERBOSE},        {"help", no_argument, nullptr, HELP},
      {"no-attrs", no_argument, nullptr, NOATTRS},       {"other-uid", required_argument, nullptr, OTHERUID},
      {nullptr, 0, nullptr, 0}};
  bool mmap_given = false;
  int c;
  while ((c = getopt_long(argc, argv, "hqv", longopts, nullptr)) != -1) {
    const char* name = nullptr;
    for (auto* o = longopts; o->name; o++)
      if (o->val == c) name = o->name;
    switch (c) {
      case SEED: opt.seed = parse_num(name, optarg); opt.seed_given = true; break;
      case OPS: opt.ops = parse_num(name, optarg); break;
      case MAXLEN: opt.maxlen = parse_num(name, optarg); break;
      case MAXSIZE: opt.maxsize = parse_num(name, optarg); break;
      case FDS: opt.fds = static_cast<int>(parse_num(name, optarg)); break;
      case MMAP: opt.mmap = true; mmap_given = true; break;
      case NOMMAP: opt.mmap = false; mmap_given = true; break;
      case MSYNC: opt.msync = 1; break;
      case NOMSYNC: opt.msync = 0; break;
      case DIRECT: opt.direct = true; break;
      case ALIGN: opt.align = parse_num(name, optarg); break;
      case REOPEN: opt.reopen_prob = parse_pct(name, optarg); break;
      case TRUNCP: opt.trunc_open_prob = parse_pct(name, optarg); break;
      case APPENDP: opt.append_prob = parse_pct(name, optarg); break;
      case RCMD: opt.remount_cmd = optarg; break;
      case REVERY: opt.remount_every = parse_num(name, optarg); break;
      case VEVERY: opt.verify_every = parse_num(name, optarg); break;
      case PROGRESS: opt.progress = parse_num(name, optarg); break;
      case LOG: opt.log_len = parse_num(name, optarg); break;
      case 'q': case QUIET: opt.quiet = true; break;
      case 'v': case VERBOSE: opt.verbose = true; break;
      case NOATTRS: opt.attrs = false; break;
      case OTHERUID: opt.other_uid = static_cast<long>(parse_num(name, optarg)); break;
      case 'h': case HELP: usage(stdout); exit(0);
      default: usage(stderr); exit(2);
    }
  }
  if (optind != argc - 1) {
    usage(stderr);
    exit(2);
  }
  opt.path = argv[optind];
  auto bad = [](const char* m) {
    fprintf(stderr, "mpnfs_fsx: %s\n", m);
    exit(2);
  };
  if (opt.fds < 1 || opt.fds > 64) bad("--fds must be 1..64");
  if (opt.maxlen < 1 || opt.maxsize < 1) bad("--maxlen and --maxsize must be positive");
  if (opt.maxsize > (1ull << 32)) bad("--maxsize is at most 4G");
  if (opt.remount_every < 1 || opt.verify_every < 1) bad("--remount-every and --verify-every must be positive");
  if (opt.direct) {
    if (opt.align < 512 || (opt.align & (opt.align - 1))) bad("--align must be a power of two >= 512");
    if (mmap_given && opt.mmap) bad("--mmap and --direct do not mix (O_DIRECT files of a FUSE mount cannot be mapped)");
    opt.mmap = false;
    opt.maxsize = opt.maxsize / opt.align * opt.align;
    opt.maxlen = std::max(opt.align, opt.maxlen / opt.align * opt.align);
    if (opt.maxsize < opt.align) bad("--maxsize is smaller than --align");
  }
  if (opt.maxlen > opt.maxsize) opt.maxlen = opt.maxsize;
  if (opt.other_uid >= 0 && !opt.attrs) bad("--other-uid needs the attributes (not with --no-attrs)");
  if (opt.other_uid >= 0 && geteuid() != 0) bad("--other-uid needs root (to become that user)");
  if (!opt.seed_given)
    opt.seed = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
               (static_cast<uint64_t>(getpid()) << 32);
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  parse_args(argc, argv);
  pagesize = sysconf(_SC_PAGESIZE);
  struct sigaction sa {};
  sa.sa_handler = on_bus;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, nullptr);

  printf("mpnfs_fsx: seed %" PRIu64 "\n", opt.seed);
  if (!opt.quiet)
    printf("mpnfs_fsx: %s, %" PRIu64 " ops, maxlen 0x%" PRIx64 ", maxsize 0x%" PRIx64
           ", %d fds, mmap %s, %s%s\n",
           opt.path.c_str(), opt.ops, opt.maxlen, opt.maxsize, opt.fds, opt.mmap ? "on" : "off",
           opt.direct ? "O_DIRECT" : "buffered", opt.remount_cmd.empty() ? "" : ", remounts");
  Rng r(opt.seed);

  // A new file: removed first, so that an old file's contents (or a broken
  // O_TRUNC) cannot be what the first operations see.
  if (unlink(opt.path.c_str()) != 0 && errno != ENOENT) fail_errno("unlink " + opt.path);
  int fd0 = open(opt.path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0644);
  if (fd0 < 0) fail_errno("create " + opt.path);
  if (opt.other_uid >= 0 && fchmod(fd0, 0666) != 0) fail_errno("fchmod");  // (others write too)
  {
    struct stat st;
    if (fstat(fd0, &st) != 0) fail_errno("fstat");
    want_mode = st.st_mode & 07777;  // (0644 less the umask)
  }
  if (close(fd0) != 0) fail_errno("close");
  fds.resize(static_cast<size_t>(opt.fds));
  for (auto& f : fds) open_fd(f, false, false);

  // Weights of the operations (reopen is drawn first, by --reopen-prob).
  struct Choice {
    void (*fn)(Rng&);
    unsigned weight;
  };
  std::vector<Choice> choices = {{op_write, 30}, {op_read, 20}, {op_truncate, 8}, {op_sync, 4}, {op_fadvise, 2}};
  if (opt.attrs) {
    choices.push_back({op_times, 4});
    choices.push_back({op_chmod, 2});
  }
  if (opt.other_uid >= 0) choices.push_back({op_other_write, 4});
  if (opt.mmap) {
    choices.push_back({op_mapread, 8});
    choices.push_back({op_mapwrite, 8});
  }
  unsigned total = 0;
  for (auto& ch : choices) total += ch.weight;

  auto next_remount = [&r](uint64_t from) { return from + opt.remount_every / 2 + r.below(opt.remount_every + 1); };
  uint64_t remount_at = opt.remount_cmd.empty() ? UINT64_MAX : next_remount(0);
  auto t0 = std::chrono::steady_clock::now();

  for (opno = 1; opno <= opt.ops; opno++) {
    if (opno == remount_at) {
      remount("scheduled");
      remount_at = next_remount(opno);
    }
    if (r.percent(opt.reopen_prob)) {
      op_reopen(r);
    } else {
      unsigned w = static_cast<unsigned>(r.below(total));
      for (auto& ch : choices) {
        if (w < ch.weight) {
          ch.fn(r);
          break;
        }
        w -= ch.weight;
      }
    }
    if (opno % opt.verify_every == 0) verify("periodic check", fds[r.below(fds.size())].fd);
    if (opt.progress && opno % opt.progress == 0) printf("mpnfs_fsx: op %" PRIu64 " size 0x%zx\n", opno, ref.size());
  }
  opno = opt.ops;

  // The end: through a descriptor open now, after the others are closed (close-to-open),
  // then through a remount.
  verify("final check", fds[0].fd);
  log_op("final: close all, reopen, verify");
  close_all();
  reopen_all_and_verify("final check after close and reopen");
  if (!opt.remount_cmd.empty()) remount("final");
  close_all();

  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!opt.quiet)
    printf("mpnfs_fsx: writes %" PRIu64 " appends %" PRIu64 " reads %" PRIu64 " mapreads %" PRIu64
           " mapwrites %" PRIu64 " truncates %" PRIu64 " syncs %" PRIu64 " fadvises %" PRIu64 " reopens %" PRIu64
           " remounts %" PRIu64 " verifies %" PRIu64 " skipped %" PRIu64 " times %" PRIu64 " chmods %" PRIu64
           " other-user writes %" PRIu64 "\n",
           count.write, count.append, count.read, count.mapread, count.mapwrite, count.truncate, count.sync,
           count.fadvise, count.reopen, count.remount, count.verify, count.skipped, count.times, count.chmod,
           count.other_write);
  printf("mpnfs_fsx: %" PRIu64 " ops OK in %.1f s (seed %" PRIu64 ")\n", opt.ops, secs, opt.seed);
  return 0;
}
