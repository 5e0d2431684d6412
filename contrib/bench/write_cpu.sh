#!/bin/bash
# Daemon CPU per GiB written, for one or more mpnfs binaries mounted in turn
# on the same one-path bed: the write-CPU target (0.6 s/GiB).
# Each round mounts each binary, writes a 1 GiB file once, then overwrites it
# WRITES times (dd bs=1M conv=notrunc,fsync) with `perf stat -e
# task-clock,page-faults -p PID` around each overwrite (task-clock counts
# what the daemon ran, not /proc ticks). Alternating the binaries spreads the
# VM's drift over all of them. Prints every figure, then per binary the
# median task-clock, page faults and MB/s.
#   contrib/bench/write_cpu.sh [-o FILE] ROUNDS BINARY...
# A BINARY may be a wrapper script that execs mpnfs (to set an environment).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=
if [ "${1:-}" = "-o" ]; then OUT=$2; shift 2; fi
ROUNDS=${1:?usage: write_cpu.sh [-o FILE] ROUNDS BINARY...}
shift
[ $# -gt 0 ] || set -- build/src/mpnfs
WRITES=${WRITES:-3}
export MPNFS_TB=/tmp/mpnfs-wbench MPNFS_TB_NS=mpnfswb MPNFS_TB_NET=83 MPNFS_TB_LINK=mwb
SERVER=10.83.1.2
EXPORT=$MPNFS_TB/export
MNT=/tmp/mpnfs-wbench-mnt
SRC=/dev/shm/mpnfs-wbench-unused
. contrib/bench/lib.sh

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.1f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

contrib/testbed.sh down >/dev/null 2>&1 || true
rm -rf "$MPNFS_TB"
bed_start 1
RAW=$(mktemp)
for r in $(seq "$ROUNDS"); do
  echo "round $r of $ROUNDS" >&2
  for bin in "$@"; do
    MPNFS_BIN=$bin mount_mpnfs
    # The daemon, also when $bin is a wrapper that exec'd it.
    dd if=/dev/zero of="$MNT/w" bs=1M count=1024 conv=notrunc,fsync status=none
    for _ in $(seq "$WRITES"); do
      perf stat -e task-clock,page-faults -x, -p "$PID" -o "$MPNFS_TB/perf.out" -- \
        dd if=/dev/zero of="$MNT/w" bs=1M count=1024 conv=notrunc,fsync 2>"$MPNFS_TB/dd.out"
      tc=$(awk -F, '$3 == "task-clock" { printf "%.0f", $1 }' "$MPNFS_TB/perf.out")
      pf=$(awk -F, '$3 == "page-faults" { print $1 }' "$MPNFS_TB/perf.out")
      mb=$(tail -1 "$MPNFS_TB/dd.out" | awk '{ print $(NF - 1) }')
      echo "$bin $tc $pf $mb" | tee -a "$RAW" >&2
    done
    umount_mpnfs
  done
done
{
  echo "Write CPU: daemon task-clock per GiB overwritten ($ROUNDS rounds x $WRITES writes, $(date -u +%F), $(git rev-parse --short HEAD))"
  echo
  echo "| binary | task-clock ms per GiB (all) | median | page faults (median) | MB/s (median) |"
  echo "|---|---|---|---|---|"
  for bin in "$@"; do
    all=$(awk -v b="$bin" '$1 == b { print $2 }' "$RAW" | sort -g | tr '\n' ' ')
    med=$(awk -v b="$bin" '$1 == b { print $2 }' "$RAW" | median)
    pf=$(awk -v b="$bin" '$1 == b { print $3 }' "$RAW" | median)
    mb=$(awk -v b="$bin" '$1 == b { print $4 }' "$RAW" | median)
    echo "| $bin | $all| **$med** | $pf | $mb |"
  done
} | tee "${OUT:-/dev/null}"
rm -f "$RAW"
