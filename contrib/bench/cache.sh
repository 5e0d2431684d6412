#!/bin/bash
# mpnfs SSD cache benchmark: an OLTP-like fio workload against a slow server
# (the one path shaped with tbf to RATE mbit, default 20: an 8 KiB request
# then takes ~3 ms on the wire, HDD-like), without a cache, with a cache of
# 30% of the data set and with one larger than it; the 30% cache again after
# and during a sequential scan twice the cache size; the 70/30 mix again
# with cache_mode=writeback; and cached reads against a plain read of the
# cache's own data file (the local ceiling).
# Each cached run is warmed first with the same workload, unshaped (and,
# for the cache larger than the data, one random pass over all of it).
# Prints a markdown report; with -o FILE also writes it there.
#   contrib/bench/cache.sh [-o contrib/bench/CACHE.md] [RATE_MBIT]
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=
if [ "${1:-}" = "-o" ]; then OUT=$2; shift 2; fi
RATE=${1:-20}
DATA=512                      # MiB: the data set
RUN=20                        # seconds per measured run
WARM=40                       # seconds of unshaped warm-up
export MPNFS_TB=/tmp/mpnfs-cbench MPNFS_TB_NS=mpnfscb MPNFS_TB_NET=83 MPNFS_TB_LINK=mcb
SERVER=10.83.1.2
EXPORT=$MPNFS_TB/export
MNT=/tmp/mpnfs-cbench-mnt
SRC=/tmp/mpnfs-cbench-cache   # the cache directories (removed on exit)
. contrib/bench/lib.sh  # cleanup on exit, deps, build, helpers

ZONED="zoned:80/10:15/20:5/70"   # 80% of I/O to 10% of the data, 15% to 20%, 5% to 70%
fio_oltp() {  # SECONDS MIX DIST -> "iops read_lat_us write_lat_us"
  fio --name=oltp --filename="$MNT/db.bin" --size=${DATA}M --rw=randrw --rwmixread="$2" --bs=8k \
    --direct=1 --ioengine=libaio --iodepth=8 --numjobs=2 --runtime="$1" --time_based \
    --random_distribution="$3" --group_reporting --output-format=terse --terse-version=3 |
    awk -F';' '{ printf "%.0f %.0f %.0f", $8 + $49, $40, $81 }'
}
stat_of() { build/src/mpnfsctl stats "$MNT" | python3 -c "import json,sys; print(json.load(sys.stdin)['cache']['$1'])"; }
hit_ratio() {  # HITS0 MISSES0 -> read hit ratio since then
  awk -v h0="$1" -v m0="$2" -v h="$(stat_of read_hits)" -v m="$(stat_of read_misses)" \
    'BEGIN { printf "%.1f%%", 100 * (h - h0) / ((h - h0) + (m - m0)) }'
}
write_hit_ratio() {  # WRITE_HITS0 WRITES0 -> write hit ratio since then ("-" without writes)
  awk -v h0="$1" -v w0="$2" -v h="$(stat_of write_hits)" -v w="$(stat_of writes)" \
    'BEGIN { if (w == w0) print "-"; else printf "%.1f%%", 100 * (h - h0) / (w - w0) }'
}
shape() { contrib/testbed.sh shape 1 "$1" >/dev/null; }

{
  echo "# mpnfs SSD cache benchmark results"
  echo
  echo "Recorded $(date -u '+%Y-%m-%d %H:%M UTC') on $(nproc) cores, kernel $(uname -r), NFS-Ganesha"
  echo "$(dpkg-query -W -f='${Version}' nfs-ganesha), mpnfs $(git rev-parse --short HEAD 2>/dev/null || echo '?')."
  echo "Command: \`contrib/bench/cache.sh $RATE\`. Data set: one ${DATA} MiB file; fio 8 KiB random I/O,"
  echo "O_DIRECT, 2 jobs x iodepth 8, ${RUN} s per run, distribution \`$ZONED\` unless noted."
  echo "The server is reached over one path shaped to ${RATE} mbit (HDD-like service times); the"
  echo "cache directory is on this machine's disk. cache_mode=writethrough unless noted, cache_block=64."
  echo
  echo "| run | IOPS | read lat (us) | write lat (us) | read hits | write hits | vs no cache |"
  echo "|---|---|---|---|---|---|---|"
} > "$REPORT"
cat "$REPORT"

fresh_bed_with_data "$DATA" $((DATA * 6 / 10))

run() {  # LABEL CACHE_MIB(0 = none) MIX DIST [scan] [MODE] [MORE_OPTIONS]
  local label=$1 size=$2 mix=$3 dist=$4 scan=${5:-} mode=${6:-writethrough} more=${7:-} opts=""
  local h0=0 m0=0 wh0=0 w0=0 res hits="-" whits="-"
  if [ "$size" -gt 0 ]; then
    rm -rf "$SRC/c"; mkdir -p "$SRC/c"
    opts="cache_dir=$SRC/c,cache_size=${size}M,cache_mode=$mode,cache_block=64${more:+,$more}"
  fi
  mount_mpnfs "$opts"
  if [ "$size" -gt "$DATA" ]; then
    # A cache larger than the data: one random pass over all of it first.
    fio --name=warm --filename="$MNT/db.bin" --size=${DATA}M --rw=randread --bs=64k --direct=1 \
      --ioengine=libaio --iodepth=8 --output-format=terse >/dev/null
  fi
  if [ "$size" -gt 0 ]; then fio_oltp "$WARM" "$mix" "$dist" >/dev/null; fi
  # Write-back: the warm-up's backlog goes to the server before the measured
  # run (which then flushes only what it writes itself).
  if [ "$mode" = writeback ]; then build/src/mpnfsctl cache flush "$MNT" >/dev/null; fi
  if [ "$scan" = after ]; then dd if="$MNT/scan.bin" of=/dev/null bs=1M status=none; fi
  shape "${RATE}mbit"
  if [ "$size" -gt 0 ]; then
    h0=$(stat_of read_hits); m0=$(stat_of read_misses); wh0=$(stat_of write_hits); w0=$(stat_of writes)
  fi
  local sp=
  if [ "$scan" = during ]; then dd if="$MNT/scan.bin" of=/dev/null bs=1M status=none & sp=$!; fi
  res=$(fio_oltp "$RUN" "$mix" "$dist")
  if [ -n "$sp" ]; then kill "$sp" 2>/dev/null || true; wait "$sp" 2>/dev/null || true; fi
  if [ "$size" -gt 0 ]; then hits=$(hit_ratio "$h0" "$m0"); whits=$(write_hit_ratio "$wh0" "$w0"); fi
  shape off
  umount_mpnfs
  read -r iops rlat wlat <<< "$res"
  echo "$label $iops $rlat $wlat $hits $whits"
}

declare -A BASE
c30=$((DATA * 3 / 10))
c120=$((DATA * 12 / 10))
# LABEL CACHE_MIB MIX [MODE] [MORE_OPTIONS]: one row of the table.
case_row() {
  local r iops rlat wlat hits whits
  r=$(run "c" "$2" "$3" "$ZONED" "" "${4:-writethrough}" "${5:-}")
  read -r _ iops rlat wlat hits whits <<< "$r"
  row "$1" "$iops" "$rlat" "$wlat" "$hits" "$whits" \
      "$(awk -v a="$iops" -v b="${BASE[$3]}" 'BEGIN { printf "%.1fx", a / b }')"
}
for mix in 100 70; do
  r=$(run "none" 0 "$mix" "$ZONED"); read -r _ iops rlat wlat hits whits <<< "$r"; BASE[$mix]=$iops
  row "reads $mix%, no cache" "$iops" "$rlat" "$wlat" "-" "-" "1.0x"
done
case_row "reads 100%, cache 30% of the data" "$c30" 100
case_row "reads 100%, cache 30%, admit=second" "$c30" 100 writethrough admit=second
case_row "reads 100%, cache 120% of the data" "$c120" 100
case_row "reads 100%, cache 120%, cache_direct" "$c120" 100 writethrough cache_direct
case_row "reads 70%, cache 30%, writethrough" "$c30" 70
case_row "reads 70%, cache 30%, writeback" "$c30" 70 writeback
case_row "reads 70%, cache 30%, writeback, admit=second" "$c30" 70 writeback admit=second
case_row "reads 70%, cache 30%, writeback, dirty_age=600" "$c30" 70 writeback dirty_age=600
case_row "reads 70%, cache 30%, writeback, dirty_high=90, dirty_low=80, dirty_age=600" "$c30" 70 writeback \
  dirty_high=90,dirty_low=80,dirty_age=600
case_row "reads 70%, cache 120%, writethrough" "$c120" 70
case_row "reads 70%, cache 120%, writeback" "$c120" 70 writeback
case_row "reads 70%, cache 120%, writeback, cache_direct" "$c120" 70 writeback cache_direct
for scan in after during; do
  r=$(run "c" "$c30" 100 "$ZONED" "$scan"); read -r _ iops rlat wlat hits whits <<< "$r"
  row "reads 100%, cache 30%, scan of 2x the cache $scan" "$iops" "$rlat" "$wlat" "$hits" "-" \
      "$(awk -v a="$iops" -v b="${BASE[100]}" 'BEGIN { printf "%.1fx", a / b }')"
done
r=$(run "c" "$c30" 100 "zipf:1.2"); read -r _ iops rlat wlat hits whits <<< "$r"
row "reads 100%, cache 30%, zipf:1.2 (hot pages scattered)" "$iops" "$rlat" "$wlat" "$hits" "-" \
    "$(awk -v a="$iops" -v b="${BASE[100]}" 'BEGIN { printf "%.1fx", a / b }')"

# The local ceiling: every read a hit, against reading the cache's data file
# directly (through the page cache, as mpnfs reads it without cache_direct).
rm -rf "$SRC/c"; mkdir -p "$SRC/c"
mount_mpnfs "cache_dir=$SRC/c,cache_size=$((DATA * 12 / 10))M,cache_block=64,seq_cutoff=0"
dd if="$MNT/db.bin" of=/dev/null bs=1M iflag=direct status=none   # fills the cache
cached=$(fio --name=hit --filename="$MNT/db.bin" --rw=randread --bs=64k --direct=1 --ioengine=psync \
  --numjobs=2 --runtime=10 --time_based --group_reporting --output-format=terse --terse-version=3 |
  awk -F';' '{ printf "%.0f", $7 * 1.024 / 1000 }')
hits=$(stat_of read_hit_ratio)
umount_mpnfs
local_mbs=$(fio --name=local --filename="$SRC/c/data" --rw=randread --bs=64k --ioengine=psync \
  --numjobs=2 --runtime=10 --time_based --group_reporting --output-format=terse --terse-version=3 |
  awk -F';' '{ printf "%.0f", $7 * 1.024 / 1000 }')
echo | tee -a "$REPORT"
echo "| cached 64 KiB random reads through mpnfs | the cache's data file read directly | share |" | tee -a "$REPORT"
echo "|---|---|---|" >> "$REPORT"
row "$cached MB/s (hit ratio $hits)" "$local_mbs MB/s" \
    "$(awk -v a="$cached" -v b="$local_mbs" 'BEGIN { printf "%.0f%%", 100 * a / b }')"

if [ -n "$OUT" ]; then cp "$REPORT" "$OUT"; echo "written to $OUT"; fi
