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

# Per path: failovers, reconnects, MiB moved (both ways), from the stats.
per_path() {
  "$CTL" stats "$MNT" | /usr/bin/python3 -c '
import json, sys
s = json.load(sys.stdin)
for c in s["connections"]:
    print(c["endpoint"], c["failovers"], c["reconnects"], (c["bytes_in"] + c["bytes_out"]) >> 20)'
}
per_path > "$MPNFS_TB/before"
secs=$((MINUTES * 60))
fio --output-format=json --output="$MPNFS_TB/fio.json" --directory="$MNT" --time_based --runtime="$secs" \
    --group_reporting=0 \
    --name=seqw --rw=write --bs=1M --size=256M --numjobs=2 --fsync=64 \
    --name=seqr --rw=read --bs=1M --size=256M --numjobs=2 --direct=1 \
    --name=rand --rw=randrw --bs=4k --size=256M --ioengine=libaio --iodepth=16 --direct=1 >/dev/null
per_path > "$MPNFS_TB/after"
mbs() {  # JOB rw: MB/s summed over the job's processes
  /usr/bin/python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
print("%.1f" % (sum(x[sys.argv[3]]["bw_bytes"] for x in j["jobs"] if x["jobname"] == sys.argv[2]) / 1e6))' \
    "$MPNFS_TB/fio.json" "$1" "$2"
}
iops() {
  /usr/bin/python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
print("%d" % sum(x["read"]["iops"] + x["write"]["iops"] for x in j["jobs"] if x["jobname"] == "rand"))' \
    "$MPNFS_TB/fio.json"
}
deaths=0 losses=0
{
  echo "## No path fails: $MINUTES minutes of saturation, four ${RATE} mbit paths"
  echo
  echo "Recorded $(date -u '+%Y-%m-%d %H:%M UTC') on $(nproc) cores, kernel $(uname -r),"
  echo "NFS-Ganesha $(dpkg-query -W -f='${Version}' nfs-ganesha), mpnfs $(git rev-parse --short HEAD 2>/dev/null || echo '?')."
  echo "Command: \`${MOUNT_OPTS:+MOUNT_OPTS=$MOUNT_OPTS }contrib/bench/soak.sh $MINUTES $RATE\`."
  echo "Load: 2 sequential writers $(mbs seqw write) MB/s, 2 O_DIRECT sequential readers"
  echo "$(mbs seqr read) MB/s, 4 KiB random read/write at QD16 $(iops) IOPS."
  echo
  echo "| path | declared dead (failovers) | connections lost (reconnects) | MiB moved |"
  echo "|---|---|---|---|"
} > "$MPNFS_TB/report"
while read -r ep f r m; do
  read -r _ f0 r0 m0 < <(grep "^$ep " "$MPNFS_TB/before")
  deaths=$((deaths + f - f0)); losses=$((losses + r - r0))
  echo "| $ep | $((f - f0)) | $((r - r0)) | $((m - m0)) |" >> "$MPNFS_TB/report"
done < "$MPNFS_TB/after"
echo "| all | $deaths | $losses | |" >> "$MPNFS_TB/report"

# The same mount, a path taken down under the same load: it must be seen.
fio --directory="$MNT" --time_based --runtime=8 --name=seqr --rw=read --bs=1M --size=256M --numjobs=2 \
    --direct=1 >/dev/null &
FIO=$!
sleep 3
contrib/testbed.sh link down 2
wait "$FIO"
contrib/testbed.sh link up 2
dead=$("$CTL" stats "$MNT" | /usr/bin/python3 -c '
import json, sys
print(sum(c["failovers"] + c["reconnects"] for c in json.load(sys.stdin)["connections"] if c["endpoint"].startswith("10.85.2.2")))')
read -r _ f2 r2 _ < <(grep "^10.85.2.2" "$MPNFS_TB/after")
{
  echo
  echo "Then path 10.85.2.2 was taken down under two readers: it was declared dead or lost"
  echo "$((dead - f2 - r2)) time(s) (at least once expected)."
} >> "$MPNFS_TB/report"
cat "$MPNFS_TB/report"
if [ -n "$OUT" ]; then { echo; cat "$MPNFS_TB/report"; } >> "$OUT"; echo "appended to $OUT"; fi
