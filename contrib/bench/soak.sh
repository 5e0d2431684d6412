#!/bin/bash
# False path deaths under saturation: four paths shaped with tbf (RATE mbit,
# default 200, both directions) carry a mixed load for MINUTES (default 10)
# with no path failing: two sequential writers (buffered, an fsync every
# 64 MiB), two sequential O_DIRECT readers and a 4 KiB random read/write job
# at queue depth 16, all at once, so that every link and both cores stay
# busy. Then a path is taken down once, to show that the same mount does
# declare a dead path dead. Prints, from the mount's own statistics, every
# path death (failovers) and every connection lost (reconnects), per path,
# with the data each path moved; the target is zero deaths in the soak.
# Exits 1 if a path was declared dead in the soak, or not when taken down.
# Prints a markdown report; with -o FILE also appends it there.
#   contrib/bench/soak.sh [-o FILE] [MINUTES] [RATE_MBIT]
# MOUNT_OPTS adds mount options (e.g. path_timeout=400).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=
if [ "${1:-}" = "-o" ]; then OUT=$2; shift 2; fi
MINUTES=${1:-10}
RATE=${2:-200}
export MPNFS_TB=/tmp/mpnfs-soak MPNFS_TB_NS=mpnfssk MPNFS_TB_NET=85 MPNFS_TB_LINK=msk
SERVER=10.85.1.2
EXPORT=$MPNFS_TB/export
MNT=/tmp/mpnfs-soak-mnt
SRC=/dev/shm/mpnfs-soak-src  # (unused; lib.sh removes it)
. contrib/bench/lib.sh  # cleanup on exit, deps, build, helpers
CTL=$(dirname "${MPNFS_BIN:-build/src/mpnfs}")/mpnfsctl

contrib/testbed.sh down >/dev/null 2>&1 || true
rm -rf "$MPNFS_TB"
bed_start 4 "${RATE}mbit"
OPTS="path=10.85.1.2+10.85.2.2+10.85.3.2+10.85.4.2${MOUNT_OPTS:+,$MOUNT_OPTS}"
mount_mpnfs "$OPTS"

stats() { "$CTL" stats "$MNT" > "$MPNFS_TB/$1.json"; }
stats before
secs=$((MINUTES * 60))
fio --output-format=json --output="$MPNFS_TB/fio.json" --directory="$MNT" --time_based --runtime="$secs" \
    --group_reporting=0 \
    --name=seqw --rw=write --bs=1M --size=256M --numjobs=2 --fsync=64 \
    --name=seqr --rw=read --bs=1M --size=256M --numjobs=2 --direct=1 \
    --name=rand --rw=randrw --bs=4k --size=256M --ioengine=libaio --iodepth=16 --direct=1 >/dev/null
stats after

# The same mount, a path taken down under two readers: it must be seen.
fio --directory="$MNT" --time_based --runtime=8 --name=seqr --rw=read --bs=1M --size=256M --numjobs=2 \
    --direct=1 >/dev/null &
FIO=$!
sleep 3
contrib/testbed.sh link down 2
wait "$FIO"
contrib/testbed.sh link up 2
stats final

# The report, from the three snapshots; exits 1 on a death in the soak or
# none when the path went down.
/usr/bin/python3 - "$MPNFS_TB" "$MINUTES" "$RATE" "${MOUNT_OPTS:-}" "$(git rev-parse --short HEAD 2>/dev/null || echo '?')" \
    "$(uname -r)" "$(dpkg-query -W -f='${Version}' nfs-ganesha)" "$(nproc)" > "$MPNFS_TB/report" <<'PY' || fail=1
import json, sys, time
d, minutes, rate, opts, rev, kernel, ganesha, cores = sys.argv[1:]
snap = {k: {c["endpoint"]: c for c in json.load(open(f"{d}/{k}.json"))["connections"]}
        for k in ("before", "after", "final")}
fio = json.load(open(f"{d}/fio.json"))["jobs"]
def mbs(job, rw):
    return sum(j[rw]["bw_bytes"] for j in fio if j["jobname"] == job) / 1e6
iops = sum(j["read"]["iops"] + j["write"]["iops"] for j in fio if j["jobname"] == "rand")
def delta(a, b, ep, key):
    return snap[b][ep][key] - snap[a].get(ep, {key: 0})[key]
print(f"## No path fails: {minutes} minutes of saturation, four {rate} mbit paths")
print()
print(f"Recorded {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {cores} cores, kernel {kernel},")
print(f"NFS-Ganesha {ganesha}, mpnfs {rev}.")
print(f"Command: `{'MOUNT_OPTS=' + opts + ' ' if opts else ''}contrib/bench/soak.sh {minutes} {rate}`.")
print(f"Load: 2 sequential writers {mbs('seqw', 'write'):.1f} MB/s, 2 O_DIRECT sequential readers "
      f"{mbs('seqr', 'read'):.1f} MB/s, 4 KiB random read/write at QD16 {iops:.0f} IOPS.")
print()
print("| connection | declared dead (failovers) | lost, any cause (reconnects; failovers included) | MiB moved, both ways |")
print("|---|---|---|---|")
deaths = lost = 0
for ep in snap["after"]:
    f, r = delta("before", "after", ep, "failovers"), delta("before", "after", ep, "reconnects")
    mib = (delta("before", "after", ep, "bytes_in") + delta("before", "after", ep, "bytes_out")) >> 20
    deaths += f
    lost += r
    print(f"| {ep} | {f} | {r} | {mib} |")
print(f"| all | {deaths} | {lost} | |")
seen = sum(delta("after", "final", ep, "failovers") for ep in snap["final"] if ep.startswith("10.85.2.2:"))
print()
print(f"Then path 10.85.2.2 was taken down under two readers: declared dead {seen} time(s) "
      "(once expected).")
sys.exit(0 if deaths == 0 and seen >= 1 else 1)
PY
cat "$MPNFS_TB/report"
if [ -n "$OUT" ]; then { echo; cat "$MPNFS_TB/report"; } >> "$OUT"; echo "appended to $OUT"; fi
exit "${fail:-0}"
