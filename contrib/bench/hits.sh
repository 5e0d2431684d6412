#!/bin/bash
# The SSD cache's read hit ratio over time, from a cold cache: the OLTP-like
# fio read workload of cache.sh (8 KiB random reads, zoned 80/10:15/20:5/70,
# O_DIRECT, 2 jobs x iodepth 8) on a 512 MiB data set behind one path shaped
# to RATE mbit, with caches of 30% (admit=first and admit=second) and 120%
# of the data. `mpnfsctl stats` is sampled every second; the report has one
# JSON line per configuration (hit ratio of each second, and cumulative) and
# contrib/bench/plot.py draws it (charts/cache-hits.svg).
#   contrib/bench/hits.sh [-o contrib/bench/HITS.md] [SECONDS] [RATE_MBIT]
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=
if [ "${1:-}" = "-o" ]; then OUT=$2; shift 2; fi
SECS=${1:-120}
RATE=${2:-20}
DATA=512
export MPNFS_TB=/tmp/mpnfs-hbench MPNFS_TB_NS=mpnfshb MPNFS_TB_NET=87 MPNFS_TB_LINK=mhb
SERVER=10.87.1.2
EXPORT=$MPNFS_TB/export
MNT=/tmp/mpnfs-hbench-mnt
SRC=/tmp/mpnfs-hbench-cache
. contrib/bench/lib.sh
ZONED="zoned:80/10:15/20:5/70"

{
  echo "# mpnfs SSD cache hit ratio over time"
  echo
  echo "Recorded $(date -u '+%Y-%m-%d %H:%M UTC') on $(nproc) cores, kernel $(uname -r), NFS-Ganesha"
  echo "$(dpkg-query -W -f='${Version}' nfs-ganesha), mpnfs $(git rev-parse --short HEAD 2>/dev/null || echo '?')."
  echo "Command: \`contrib/bench/hits.sh $SECS $RATE\`. Cold cache, one path shaped to $RATE mbit,"
  echo "fio 8 KiB random reads, \`$ZONED\`, O_DIRECT, 2 jobs x iodepth 8, on a $DATA MiB file;"
  echo "cache_mode=readonly, cache_block=64. Chart: charts/cache-hits.svg (contrib/bench/plot.py)."
  echo
  echo '```'
} > "$REPORT"
cat "$REPORT"

fresh_bed_with_data "$DATA"

series() {  # LABEL CACHE_MIB [MORE_OPTIONS]
  rm -rf "$SRC/c"; mkdir -p "$SRC/c"
  mount_mpnfs "cache_dir=$SRC/c,cache_size=$2M,cache_block=64${3:+,$3}"
  contrib/testbed.sh shape 1 "${RATE}mbit" >/dev/null
  fio --name=oltp --filename="$MNT/db.bin" --size=${DATA}M --rw=randread --bs=8k --direct=1 \
    --ioengine=libaio --iodepth=8 --numjobs=2 --runtime="$SECS" --time_based \
    --random_distribution="$ZONED" --output-format=terse >/dev/null &
  local fp=$!
  # One stats sample a second while fio runs; python turns them into ratios.
  while kill -0 "$fp" 2>/dev/null; do
    build/src/mpnfsctl stats "$MNT" | tr -d '\n'; echo
    sleep 1
  done > "$MPNFS_TB/samples"
  wait "$fp"
  contrib/testbed.sh shape 1 off >/dev/null
  umount_mpnfs
  python3 - "$1" "$MPNFS_TB/samples" <<'PY' | tee -a "$REPORT"
import json, sys
label, path = sys.argv[1], sys.argv[2]
rows = [json.loads(l)["cache"] for l in open(path) if l.strip()]
per_s, cum = [], []
for a, b in zip(rows, rows[1:]):
    h, m = b["read_hits"] - a["read_hits"], b["read_misses"] - a["read_misses"]
    per_s.append(round(h / (h + m), 4) if h + m else None)
    H, M = b["read_hits"] - rows[0]["read_hits"], b["read_misses"] - rows[0]["read_misses"]
    cum.append(round(H / (H + M), 4) if H + M else None)
last = [x for x in per_s[-10:] if x is not None]
print(json.dumps({"label": label, "last_10s_hit_ratio": round(sum(last) / len(last), 4) if last else None,
                  "per_second": per_s, "cumulative": cum}))
PY
}
series "cache 30% of the data, admit=first" $((DATA * 3 / 10))
series "cache 30% of the data, admit=second" $((DATA * 3 / 10)) admit=second
series "cache 120% of the data" $((DATA * 12 / 10))
echo '```' >> "$REPORT"

if [ -n "$OUT" ]; then
  cp "$REPORT" "$OUT"; echo "written to $OUT"
  /usr/bin/python3 contrib/bench/plot.py
fi
