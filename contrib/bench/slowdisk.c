/* slowdisk: an LD_PRELOAD library that makes a process's disk slow per
 * operation rather than per byte, as a disk-bound NAS is (every random
 * access pays a seek, whatever its size). Loaded into ganesha.nfsd by
 * contrib/testbed.sh (MPNFS_TB_GANESHA_PRELOAD) for contrib/bench/pgbench.sh.
 *
 * Each data read, write or sync on a regular file under SLOWDISK_ROOT
 * (pread/pwrite/preadv/pwritev/preadv2/pwritev2 and their *64 names,
 * fsync, fdatasync; FSAL_VFS of NFS-Ganesha 4.3 uses preadv64, pwritev64
 * and fsync) first takes one of SLOWDISK_SPINDLES slots (default 4: at
 * most that many operations in service at once, the others queue), sleeps
 * SLOWDISK_US microseconds (default 5000) holding it, then does the real
 * call and gives the slot back. Other calls and other files are untouched.
 *
 * Ganesha dlopen()s its FSALs with RTLD_DEEPBIND, which would bind their
 * calls to libc ahead of this library; dlopen is wrapped to drop that flag
 * for libraries named libfsal* (FSAL_VFS needs no private symbol scope).
 *
 * Environment: SLOWDISK_US, SLOWDISK_SPINDLES, SLOWDISK_ROOT (a path
 * prefix; unset: every regular file), SLOWDISK_STATS (a file: on each
 * 1000th delayed operation and at exit, the counts of delayed reads,
 * writes and syncs are written there, "reads N writes N syncs N").
 *
 * Build: contrib/bench/meson.build (build/contrib/bench/libslowdisk.so).
 * Thread safety: the slot count is guarded by a mutex and condition
 * variable; the counters are atomics. */
/* Both the plain and the *64 names are defined here: no redirection. */
#undef _FILE_OFFSET_BITS
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static long delay_us = 5000;
static int spindles = 4;
static const char* root;
static size_t root_len;
static const char* stats_path;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int busy;
static atomic_long n_reads, n_writes, n_syncs;

static void dump_stats(void) {
  if (!stats_path) return;
  char tmp[PATH_MAX];
  snprintf(tmp, sizeof tmp, "%s.tmp", stats_path);
  FILE* f = fopen(tmp, "w");
  if (!f) return;
  fprintf(f, "reads %ld writes %ld syncs %ld\n", atomic_load(&n_reads), atomic_load(&n_writes),
          atomic_load(&n_syncs));
  fclose(f);
  rename(tmp, stats_path);
}

__attribute__((constructor)) static void init(void) {
  const char* s;
  if ((s = getenv("SLOWDISK_US"))) delay_us = atol(s);
  if ((s = getenv("SLOWDISK_SPINDLES")) && atoi(s) > 0) spindles = atoi(s);
  if ((s = getenv("SLOWDISK_ROOT")) && *s) {
    root = s;
    root_len = strlen(s);
  }
  stats_path = getenv("SLOWDISK_STATS");
}

__attribute__((destructor)) static void fini(void) { dump_stats(); }

/* Whether fd is a regular file under the root. */
static int slow_fd(int fd) {
  struct stat st;
  if (delay_us <= 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return 0;
  if (!root) return 1;
  char link[64], path[PATH_MAX];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, path, sizeof path - 1);
  if (n < 0) return 0;
  path[n] = 0;
  return strncmp(path, root, root_len) == 0 && (path[root_len] == '/' || path[root_len] == 0);
}

static void take(atomic_long* counter) {
  int e = errno;
  pthread_mutex_lock(&mu);
  while (busy >= spindles) pthread_cond_wait(&cv, &mu);
  busy++;
  pthread_mutex_unlock(&mu);
  struct timespec ts = {delay_us / 1000000, (delay_us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
  if ((atomic_fetch_add(counter, 1) + 1) % 1000 == 0) dump_stats();
  errno = e;
}

static void give(void) {
  int e = errno;
  pthread_mutex_lock(&mu);
  busy--;
  pthread_cond_signal(&cv);
  pthread_mutex_unlock(&mu);
  errno = e;
}

#define REAL(name) \
  static __typeof__(name)* real; \
  if (!real) real = (__typeof__(name)*)dlsym(RTLD_NEXT, #name)

/* One wrapper per name: NAME(ARGS) delayed as KIND when fd is slow. */
#define WRAP(ret, name, kind, params, args)          \
  ret name params {                                  \
    REAL(name);                                      \
    if (!slow_fd(fd)) return real args;              \
    take(&kind);                                     \
    ret r = real args;                               \
    give();                                          \
    return r;                                        \
  }

WRAP(ssize_t, pread, n_reads, (int fd, void* buf, size_t n, off_t off), (fd, buf, n, off))
WRAP(ssize_t, pread64, n_reads, (int fd, void* buf, size_t n, off64_t off), (fd, buf, n, off))
WRAP(ssize_t, pwrite, n_writes, (int fd, const void* buf, size_t n, off_t off), (fd, buf, n, off))
WRAP(ssize_t, pwrite64, n_writes, (int fd, const void* buf, size_t n, off64_t off),
     (fd, buf, n, off))
WRAP(ssize_t, preadv, n_reads, (int fd, const struct iovec* iov, int cnt, off_t off),
     (fd, iov, cnt, off))
WRAP(ssize_t, preadv64, n_reads, (int fd, const struct iovec* iov, int cnt, off64_t off),
     (fd, iov, cnt, off))
WRAP(ssize_t, pwritev, n_writes, (int fd, const struct iovec* iov, int cnt, off_t off),
     (fd, iov, cnt, off))
WRAP(ssize_t, pwritev64, n_writes, (int fd, const struct iovec* iov, int cnt, off64_t off),
     (fd, iov, cnt, off))
WRAP(ssize_t, preadv2, n_reads, (int fd, const struct iovec* iov, int cnt, off_t off, int fl),
     (fd, iov, cnt, off, fl))
WRAP(ssize_t, preadv64v2, n_reads,
     (int fd, const struct iovec* iov, int cnt, off64_t off, int fl), (fd, iov, cnt, off, fl))
WRAP(ssize_t, pwritev2, n_writes, (int fd, const struct iovec* iov, int cnt, off_t off, int fl),
     (fd, iov, cnt, off, fl))
WRAP(ssize_t, pwritev64v2, n_writes,
     (int fd, const struct iovec* iov, int cnt, off64_t off, int fl), (fd, iov, cnt, off, fl))
WRAP(int, fsync, n_syncs, (int fd), (fd))
WRAP(int, fdatasync, n_syncs, (int fd), (fd))

/* Ganesha's FSAL loader: without RTLD_DEEPBIND, so that the FSAL's calls
 * find the wrappers above. */
void* dlopen(const char* file, int flags) {
  REAL(dlopen);
  const char* base = file ? strrchr(file, '/') : NULL;
  base = base ? base + 1 : file;
  if (base && strncmp(base, "libfsal", 7) == 0) flags &= ~RTLD_DEEPBIND;
  return real(file, flags);
}
