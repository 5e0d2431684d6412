#!/bin/bash
# What keeping the cache's page checksums out of RAM costs a cache hit
# (cache_crc_ram=, src/cache/crc_store.h): 4 KiB random reads that all hit
# a warm cache larger than the data, with every checksum in RAM (the
# default for a cache this small) and with RAM for 1/8 of them (the rest
# read back from the file `crcs` on demand). One unshaped path; the cache
# directory on this machine's disk. Prints a markdown table; with -o FILE
# also writes it there.
#   contrib/bench/crc_ram.sh [-o FILE]
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=
if [ "${1:-}" = "-o" ]; then OUT=$2; shift 2; fi
DATA=512                      # MiB: the data set
RUN=20                        # seconds per measured run
export MPNFS_TB=/tmp/mpnfs-crcbench MPNFS_TB_NS=mpnfscr MPNFS_TB_NET=84 MPNFS_TB_LINK=mcr
SERVER=10.84.1.2
EXPORT=$MPNFS_TB/export
MNT=/tmp/mpnfs-crcbench-mnt
SRC=/tmp/mpnfs-crcbench-cache   # the cache directory (removed on exit)
. contrib/bench/lib.sh  # cleanup on exit, deps, build, helpers

stat_of() { build/src/mpnfsctl stats "$MNT" | python3 -c "import json,sys; print(json.load(sys.stdin)['cache']['$1'])"; }
fio_hits() {  # JOBS DEPTH -> "iops mean_lat_us"
  fio --name=hits --filename="$MNT/db.bin" --size=${DATA}M --rw=randread --bs=4k --direct=1 \
    --ioengine=libaio --iodepth="$2" --numjobs="$1" --runtime="$RUN" --time_based \
    --group_reporting --output-format=terse --terse-version=3 |
    awk -F';' '{ printf "%.0f %.0f", $8, $40 }'
}

{
  echo "Recorded $(date -u '+%Y-%m-%d %H:%M UTC') on $(nproc) cores, mpnfs $(git rev-parse --short HEAD 2>/dev/null || echo '?')."
  echo "Command: \`contrib/bench/crc_ram.sh\`. One ${DATA} MiB file, a cache of $((DATA * 12 / 10)) MiB"
  echo "(256 KiB blocks: $((DATA * 12 / 10)) KiB of checksums), warmed by one random 64 KiB pass;"
  echo "fio 4 KiB random reads, O_DIRECT, ${RUN} s, every read a cache hit."
  echo
  echo "| checksums in RAM | jobs x depth | IOPS | mean lat (us) | checksum frames read | per read |"
  echo "|---|---|---|---|---|---|"
} > "$REPORT"
cat "$REPORT"

fresh_bed_with_data "$DATA"
for ram in default 64K; do
  rm -rf "$SRC/c"; mkdir -p "$SRC/c"
  opts="cache_dir=$SRC/c,cache_size=$((DATA * 12 / 10))M,cache_mode=readonly"
  [ "$ram" = default ] || opts="$opts,cache_crc_ram=$ram"
  mount_mpnfs "$opts"
  fio --name=warm --filename="$MNT/db.bin" --size=${DATA}M --rw=randread --bs=64k --direct=1 \
    --ioengine=libaio --iodepth=8 --output-format=terse >/dev/null
  for load in "1 1" "2 8"; do
    read -r jobs depth <<< "$load"
    h0=$(stat_of read_hits); m0=$(stat_of read_misses); c0=$(stat_of checksum_reads)
    read -r iops lat <<< "$(fio_hits "$jobs" "$depth")"
    h=$(stat_of read_hits); m=$(stat_of read_misses); c=$(stat_of checksum_reads)
    [ $((m - m0)) -eq 0 ] || echo "warning: $((m - m0)) misses in a run meant to hit" >&2
    label=$([ "$ram" = default ] && echo "all ($((DATA * 12 / 10)) KiB)" || echo "$ram (1/$((DATA * 12 / 10 / 64)))")
    row "$label" "${jobs} x ${depth}" "$iops" "$lat" "$((c - c0))" \
        "$(awk -v c="$((c - c0))" -v h="$((h - h0))" 'BEGIN { printf "%.2f", h ? c / h : 0 }')"
  done
  umount_mpnfs
done
[ -z "$OUT" ] || cp "$REPORT" "$OUT"
