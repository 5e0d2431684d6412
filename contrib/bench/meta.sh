#!/bin/bash
# mpnfs metadata benchmark, on a one-path unshaped NFS-Ganesha bed (network
# 10.88.x) with a default mount:
#  - N x (create O_EXCL + 1 KiB write + close), N x stat, N x unlink, through
#    the FUSE mount, with the NFS calls per file by procedure (from
#    `mpnfsctl stats`, before and after each phase);
#  - RSS of the mpnfs process once the kernel knows 100k, 200k and 400k more
#    inodes (each file listed and stat-ed), and the slope per million inodes;
#  - time to list (getdents, `ls -f | wc -l`) fresh directories of 25k, 50k
#    and 100k entries, and the slope per 100k entries.
# Prints a markdown report; with -o FILE also writes it there.
#   contrib/bench/meta.sh [-o contrib/bench/META.md] [N] [--no-scale]
# (--no-scale: only the N-file figures.)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=
if [ "${1:-}" = "-o" ]; then OUT=$2; shift 2; fi
N=${1:-5000}
SCALE=1
[ "${2:-}" = "--no-scale" ] && SCALE=0
export MPNFS_TB=/tmp/mpnfs-benchmeta MPNFS_TB_NS=mpnfsbmeta MPNFS_TB_NET=88 MPNFS_TB_LINK=mbm
SERVER=10.88.1.2
EXPORT=$MPNFS_TB/export
MNT=/tmp/mpnfs-benchmeta-mnt
SRC=/dev/shm/mpnfs-benchmeta-src  # (unused; lib.sh removes it)
. contrib/bench/lib.sh  # cleanup on exit, deps, build, helpers

# MPNFS_BIN=/path/to/mpnfs measures another build (its mpnfsctl beside it).
BIN=${MPNFS_BIN:-build/src/mpnfs}
CTL=$(dirname "$BIN")/mpnfsctl
mount_mpnfs() {  # as lib.sh's, with $BIN
  mkdir -p "$MNT"
  "$BIN" "$SERVER:$EXPORT" "$MNT" -f -o "mountport=20048${1:+,$1}" 2>>"$MPNFS_TB/mpnfs.log" &
  PID=$!
  for _ in $(seq 100); do grep -q " $MNT fuse.mpnfs " /proc/mounts && return 0; sleep 0.1; done
  echo "mount failed" >&2; cat "$MPNFS_TB/mpnfs.log" >&2; exit 1
}

{
  echo "# mpnfs metadata benchmark"
  echo
  echo "Recorded $(date -u '+%Y-%m-%d %H:%M UTC') on $(nproc) cores, kernel $(uname -r),"
  echo "NFS-Ganesha $(dpkg-query -W -f='${Version}' nfs-ganesha) (FSAL_VFS), mpnfs $(git -C "$(dirname "$BIN")" rev-parse --short HEAD 2>/dev/null || echo '?') ($BIN)."
  echo "Command: \`contrib/bench/meta.sh $N\`. One unshaped path, default mount options;"
  echo "server and client share the machine's cores. Load average at start: $(cut -d' ' -f1-3 /proc/loadavg)."
  echo
} > "$REPORT"
cat "$REPORT"

contrib/testbed.sh down >/dev/null 2>&1 || true
rm -rf "$MPNFS_TB"
bed_start 1

# Files for the RAM and listing figures, made on the export before the
# server starts (changing it behind a running Ganesha is not allowed).
if [ "$SCALE" = 1 ]; then
  contrib/testbed.sh stop-server >/dev/null
  python3 - "$EXPORT" <<'PY'
import os, sys
root = sys.argv[1]
for name, n in [("ram0", 100000), ("ram1", 100000), ("ram2", 200000),
                ("list25k", 25000), ("list50k", 50000), ("list100k", 100000)]:
    d = os.path.join(root, name); os.mkdir(d)
    for i in range(n):
        os.close(os.open(f"{d}/f{i:06d}", os.O_CREAT | os.O_WRONLY, 0o644))
PY
  contrib/testbed.sh start-server >/dev/null
fi

mount_mpnfs

# Per-phase NFS calls per file, from the statistics before and after.
python3 - "$MNT" "$N" "$CTL" "$REPORT" <<'PY'
import json, os, subprocess, sys, time
mnt, n, ctl, report = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def ops():
    j = json.loads(subprocess.check_output([ctl, "stats", mnt]))
    return {k: v["ops"] for k, v in j["ops"].items()}
def per_file(a, b):
    d = {k: b.get(k, 0) - a.get(k, 0) for k in b}
    return ", ".join(f"{k} {v / n:.2f}" for k, v in sorted(d.items()) if v) or "none"
d = f"{mnt}/meta"; os.mkdir(d); data = b"m" * 1024
rows = []
s0 = ops(); t0 = time.perf_counter()
for i in range(n):
    fd = os.open(f"{d}/f{i}", os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
    os.write(fd, data)
    os.close(fd)
t1 = time.perf_counter(); s1 = ops()
rows.append((f"{n} x create + 1 KiB write + close", t1 - t0, per_file(s0, s1)))
s1 = ops(); t1 = time.perf_counter()
for i in range(n): os.stat(f"{d}/f{i}")
t2 = time.perf_counter(); s2 = ops()
rows.append((f"{n} x stat", t2 - t1, per_file(s1, s2)))
t2 = time.perf_counter()
for i in range(n): os.unlink(f"{d}/f{i}")
t3 = time.perf_counter(); s3 = ops()
rows.append((f"{n} x unlink", t3 - t2, per_file(s2, s3)))
os.rmdir(d)
out = ["| operation | time | per file | NFS calls per file |", "|---|---|---|---|"]
for name, t, calls in rows:
    out.append(f"| {name} | {t:.2f} s | {t / n * 1e6:.0f} us | {calls} |")
text = "\n".join(out) + "\n\n"
print(text, end=""); open(report, "a").write(text)
PY

if [ "$SCALE" = 1 ]; then
  rss() { awk '/^VmRSS:/ { print $2 }' "/proc/$PID/status"; }  # KiB
  python3 - "$MNT" "$PID" "$REPORT" <<'PY'
import os, subprocess, sys, time
mnt, pid, report = sys.argv[1], sys.argv[2], sys.argv[3]
def rss_kib():
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"): return int(line.split()[1])
def visit(d):
    n = 0
    with os.scandir(d) as it:  # READDIRPLUS: each entry becomes a kernel inode
        for e in it:
            e.stat(follow_symlinks=False); os.stat(e.path); n += 1
    return n
out = ["| inodes known to the kernel (more than at mount) | mpnfs RSS | time to list and stat them |", "|---|---|---|"]
base = rss_kib(); pts = [(0, base)]
out.append(f"| 0 | {base / 1024:.1f} MiB | |")
total = 0
for d in ["ram0", "ram1", "ram2"]:
    t0 = time.perf_counter(); total += visit(f"{mnt}/{d}"); t = time.perf_counter() - t0
    r = rss_kib(); pts.append((total, r))
    out.append(f"| {total:,} | {r / 1024:.1f} MiB | {t:.1f} s |")
# Least-squares slope, and each step's own slope (linear: they agree).
xs = [p[0] for p in pts]; ys = [p[1] for p in pts]
mx = sum(xs) / len(xs); my = sum(ys) / len(ys)
slope = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x in xs)  # KiB per inode
steps = ", ".join(f"{(pts[i+1][1] - pts[i][1]) / (pts[i+1][0] - pts[i][0]) * 1e6 / 1024:.0f}"
                  for i in range(len(pts) - 1))
text = "\n".join(out) + f"\n\nRAM slope: {slope * 1e6 / 1024:.0f} MiB per million inodes " \
       f"({slope * 1024:.0f} bytes per inode); per step: {steps} MiB per million.\n\n"
print(text, end=""); open(report, "a").write(text)
PY

  # Listing: a fresh mount, each directory listed once (getdents through ls -f).
  umount_mpnfs
  drop
  mount_mpnfs
  pts=()
  {
    echo "| directory entries | ls -f \\| wc -l (fresh mount) |"
    echo "|---|---|"
  } | tee -a "$REPORT"
  for n in 25k 50k 100k; do
    t0=$(now); got=$(ls -f "$MNT/list$n" | wc -l); t1=$(now)
    s=$(secs "$t0" "$t1")
    pts+=("$((got - 2)):$s")
    row "$((got - 2))" "$s s"
  done
  python3 - "$REPORT" "${pts[@]}" <<'PY'
import sys
report = sys.argv[1]
pts = [(int(a), float(b)) for a, b in (p.split(":") for p in sys.argv[2:])]
xs = [p[0] for p in pts]; ys = [p[1] for p in pts]
mx = sum(xs) / len(xs); my = sum(ys) / len(ys)
slope = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x in xs)
steps = ", ".join(f"{(pts[i+1][1] - pts[i][1]) / (pts[i+1][0] - pts[i][0]) * 1e5:.2f}"
                  for i in range(len(pts) - 1))
text = f"\nListing slope: {slope * 1e5:.2f} s per 100k entries ({slope * 1e6:.1f} us per entry); " \
       f"per step: {steps} s per 100k.\n"
print(text, end=""); open(report, "a").write(text)
PY
fi
umount_mpnfs

if [ -n "$OUT" ]; then cp "$REPORT" "$OUT"; echo "written to $OUT"; fi
