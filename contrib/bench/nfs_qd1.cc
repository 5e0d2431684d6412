// nfs-qd1: the floor under a queue-depth-1 read. Issues synchronous READs of
// BS bytes at random aligned offsets of an existing file through libnfs (one
// TCP connection, one call outstanding, no FUSE, no threads), for SECONDS,
// and prints one JSON line: calls, IOPS, and latency mean / p50 / p99 in
// microseconds. mpnfs's 4 KiB O_DIRECT read at QD1 is compared against this
// (contrib/bench/bench.sh).
//   nfs-qd1 'nfs://SERVER/EXPORT/FILE?version=3&nfsport=2049&mountport=20048' SECONDS [BS]
#include <fcntl.h>
#include <nfsc/libnfs.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace {

int Fail(const char* what, struct nfs_context* nfs) {
  fprintf(stderr, "nfs-qd1: %s: %s\n", what, nfs ? nfs_get_error(nfs) : "");
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: nfs-qd1 NFS-URL SECONDS [BS]\n");
    return 2;
  }
  const double seconds = atof(argv[2]);
  const uint64_t bs = argc > 3 ? strtoull(argv[3], nullptr, 10) : 4096;
  struct nfs_context* nfs = nfs_init_context();
  if (!nfs) return Fail("no context", nullptr);
  struct nfs_url* url = nfs_parse_url_full(nfs, argv[1]);
  if (!url) return Fail("bad URL", nfs);
  if (nfs_mount(nfs, url->server, url->path) != 0) return Fail("mount", nfs);
  struct nfsfh* fh = nullptr;
  if (nfs_open(nfs, url->file, O_RDONLY, &fh) != 0) return Fail("open", nfs);
  struct nfs_stat_64 st {};
  if (nfs_fstat64(nfs, fh, &st) != 0) return Fail("fstat", nfs);
  if (st.nfs_size < bs) return Fail("file smaller than one block", nfs);
  const uint64_t blocks = st.nfs_size / bs;
  std::vector<char> buf(bs);
  std::mt19937_64 rng(1);
  std::vector<double> lat;
  lat.reserve(1 << 20);
  using Clock = std::chrono::steady_clock;
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  for (auto now = Clock::now(); now < end;) {
    const uint64_t off = (rng() % blocks) * bs;
    const int n = nfs_pread(nfs, fh, off, bs, buf.data());
    const auto after = Clock::now();
    if (n < 0) return Fail("read", nfs);
    lat.push_back(std::chrono::duration<double, std::micro>(after - now).count());
    now = after;
  }
  double sum = 0;
  for (double v : lat) sum += v;
  std::sort(lat.begin(), lat.end());
  const auto pct = [&](double p) { return lat[std::min(lat.size() - 1, size_t(p * lat.size()))]; };
  printf("{\"calls\": %zu, \"iops\": %.0f, \"lat_mean_us\": %.1f, \"lat_p50_us\": %.1f, \"lat_p99_us\": %.1f}\n",
         lat.size(), lat.size() / (sum / 1e6), sum / lat.size(), pct(0.5), pct(0.99));
  nfs_close(nfs, fh);
  nfs_destroy_url(url);
  nfs_destroy_context(nfs);
  return 0;
}
