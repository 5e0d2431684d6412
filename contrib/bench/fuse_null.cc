// fuse-null: the floor under any FUSE filesystem. A low-level libfuse
// filesystem with one read-only file, /f, of SIZE MiB whose reads are
// answered at once from memory (zeros), served by the same multi-threaded
// loop configuration as mpnfs (clone_fd, up to 64 threads). A 4 KiB O_DIRECT
// read at queue depth 1 on it costs the two thread wake-ups and the copies
// that FUSE itself adds to every request; mpnfs's queue-depth-1 latency is
// compared against this plus one NFS round trip (contrib/bench/bench.sh).
//   fuse-null MOUNTPOINT [SIZE_MIB]     (runs in the foreground; unmount with
//                                        fusermount3 -u MOUNTPOINT)
#define FUSE_USE_VERSION 314  // as mpnfs: the loop configuration of 3.12+
#include <fuse_lowlevel.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

uint64_t g_size = 1ull << 30;
std::vector<char> g_zeros(1 << 20);
constexpr fuse_ino_t kFile = 2;

void Stat(fuse_ino_t ino, struct stat* st) {
  memset(st, 0, sizeof(*st));
  st->st_ino = ino;
  if (ino == FUSE_ROOT_ID) {
    st->st_mode = S_IFDIR | 0755;
    st->st_nlink = 2;
  } else {
    st->st_mode = S_IFREG | 0444;
    st->st_nlink = 1;
    st->st_size = static_cast<off_t>(g_size);
  }
}

void Lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  if (parent != FUSE_ROOT_ID || strcmp(name, "f") != 0) return (void)fuse_reply_err(req, ENOENT);
  fuse_entry_param e{};
  e.ino = kFile;
  e.attr_timeout = e.entry_timeout = 3600;
  Stat(kFile, &e.attr);
  fuse_reply_entry(req, &e);
}

void Getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  struct stat st;
  Stat(ino, &st);
  fuse_reply_attr(req, &st, 3600);
}

void Open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if (ino != kFile) return (void)fuse_reply_err(req, EISDIR);
  fi->direct_io = 0;
  fuse_reply_open(req, fi);
}

void Read(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info*) {
  const uint64_t o = static_cast<uint64_t>(off);
  size_t n = o >= g_size ? 0 : static_cast<size_t>(std::min<uint64_t>(size, g_size - o));
  n = std::min(n, g_zeros.size());
  fuse_reply_buf(req, g_zeros.data(), n);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: fuse-null MOUNTPOINT [SIZE_MIB]\n");
    return 2;
  }
  if (argc > 2) g_size = strtoull(argv[2], nullptr, 10) << 20;
  fuse_lowlevel_ops ops{};
  ops.lookup = Lookup;
  ops.getattr = Getattr;
  ops.open = Open;
  ops.read = Read;
  char arg0[] = "fuse-null";
  char* fargv[] = {arg0};
  fuse_args args = FUSE_ARGS_INIT(1, fargv);
  fuse_session* se = fuse_session_new(&args, &ops, sizeof(ops), nullptr);
  if (se == nullptr || fuse_set_signal_handlers(se) != 0 || fuse_session_mount(se, argv[1]) != 0) {
    fprintf(stderr, "fuse-null: cannot mount on %s\n", argv[1]);
    return 1;
  }
  fuse_loop_config* cfg = fuse_loop_cfg_create();
  fuse_loop_cfg_set_clone_fd(cfg, 1);
  fuse_loop_cfg_set_max_threads(cfg, 64);
  fuse_loop_cfg_set_idle_threads(cfg, 8);
  int rc = fuse_session_loop_mt(se, cfg);
  fuse_loop_cfg_destroy(cfg);
  fuse_session_unmount(se);
  fuse_remove_signal_handlers(se);
  fuse_session_destroy(se);
  return rc == 0 ? 0 : 1;
}
