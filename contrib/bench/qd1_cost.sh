#!/bin/bash
# What one 4 KiB read at queue depth 1 costs mpnfs: system calls and context
# switches of the mpnfs process (all its threads, counted by perf) and of
# the reader (fio), per read, with the IOPS and mean latency of the same
# run; and, in the same run, the two round trips a read through FUSE
# cannot avoid: one NFS READ with no FUSE (nfs-qd1, libnfs) and one FUSE
# read with no NFS (fuse-null), whose latencies add up to the floor of a
# FUSE gateway that waits for each. One unshaped path to the local
# NFS-Ganesha bed; O_DIRECT random reads of a 1 GiB file warmed in the
# server's page cache.
#   contrib/bench/qd1_cost.sh [-o FILE] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=
if [ "${1:-}" = "-o" ]; then OUT=$2; shift 2; fi
SECS=${1:-10}
export MPNFS_TB=/tmp/mpnfs-qd1cost MPNFS_TB_NS=mpnfsqc MPNFS_TB_NET=84 MPNFS_TB_LINK=mqc
SERVER=10.84.1.2
EXPORT=$MPNFS_TB/export
MNT=/tmp/mpnfs-qd1cost-mnt
SRC=/dev/shm/mpnfs-qd1cost-src  # (unused; lib.sh removes it)
NULLMNT=/tmp/mpnfs-qd1cost-null
. contrib/bench/lib.sh
fio_qd1() {  # FILE: reads, IOPS and mean latency (us)
  fio --name=q --filename="$1" --rw=randread --bs=4k --direct=1 --ioengine=psync --runtime="$SECS" \
    --time_based --output-format=terse --terse-version=3 2>/dev/null |
    awk -F';' '{ printf "%d %d %.1f\n", $6 / 4, $8, $40 }'
}

contrib/testbed.sh down >/dev/null 2>&1 || true
rm -rf "$MPNFS_TB"
bed_start 1
mount_mpnfs
dd if=/dev/urandom of="$MNT/rand.bin" bs=1M count=1024 conv=fsync status=none
cat "$EXPORT/rand.bin" > /dev/null
# fio under perf (its own calls and switches); mpnfs under a second perf
# attached to every thread for the same seconds.
perf stat -x, -e raw_syscalls:sys_enter,context-switches -p "$PID" -o "$MPNFS_TB/perf.mpnfs" -- sleep "$SECS" &
PERF=$!
perf stat -x, -e raw_syscalls:sys_enter,context-switches -o "$MPNFS_TB/perf.fio" -- \
  fio --name=q --filename="$MNT/rand.bin" --rw=randread --bs=4k --direct=1 --ioengine=psync \
  --runtime="$SECS" --time_based --output-format=terse --terse-version=3 > "$MPNFS_TB/fio.out" 2>/dev/null
wait "$PERF"
umount_mpnfs
read -r reads iops lat < <(awk -F';' '{ printf "%d %d %.1f\n", $6 / 4, $8, $40 }' "$MPNFS_TB/fio.out")
# The two round trips alone.
rtt_iops=$(build/contrib/bench/nfs-qd1 "nfs://$SERVER$EXPORT/rand.bin?version=3&nfsport=2049&mountport=20048" "$SECS" |
           /usr/bin/python3 -c 'import json,sys; print(int(json.load(sys.stdin)["iops"]))')
start_null
read -r _ null_iops _ < <(fio_qd1 "$NULLMNT/f")
kill_null
floor=$(awk -v a="$rtt_iops" -v b="$null_iops" 'BEGIN { printf "%d", 1 / (1 / a + 1 / b) }')
count() { awk -F, -v e="$2" '$3 == e { print $1 }' "$1"; }
per() { awk -v a="$1" -v n="$reads" 'BEGIN { printf "%.2f", a / n }'; }
{
  echo "# What a 4 KiB read at queue depth 1 costs"
  echo
  echo "Recorded $(date -u '+%Y-%m-%d %H:%M UTC') on $(nproc) cores, kernel $(uname -r), NFS-Ganesha"
  echo "$(dpkg-query -W -f='${Version}' nfs-ganesha), libfuse $(pkg-config --modversion fuse3),"
  echo "mpnfs $(git rev-parse --short HEAD 2>/dev/null || echo '?'). Command: \`contrib/bench/qd1_cost.sh $SECS\`."
  echo "fio psync, 4 KiB O_DIRECT random reads, $SECS s; perf stat counts."
  echo
  echo "| reads | IOPS | mean latency us | mpnfs syscalls / read | mpnfs context switches / read | fio syscalls / read | fio context switches / read |"
  echo "|---|---|---|---|---|---|---|"
  echo "| $reads | $iops | $lat | $(per "$(count "$MPNFS_TB/perf.mpnfs" raw_syscalls:sys_enter)") |" \
       "$(per "$(count "$MPNFS_TB/perf.mpnfs" context-switches)") | $(per "$(count "$MPNFS_TB/perf.fio" raw_syscalls:sys_enter)") |" \
       "$(per "$(count "$MPNFS_TB/perf.fio" context-switches)") |"
  echo
  echo "| same run | IOPS | mpnfs / it |"
  echo "|---|---|---|"
  echo "| one NFS READ round trip, no FUSE (nfs-qd1) | $rtt_iops | $(awk -v a="$iops" -v b="$rtt_iops" 'BEGIN { printf "%.2f", a / b }') |"
  echo "| one FUSE read, no NFS (fuse-null) | $null_iops | $(awk -v a="$iops" -v b="$null_iops" 'BEGIN { printf "%.2f", a / b }') |"
  echo "| both in turn (1 / (1/nfs-qd1 + 1/fuse-null)) | $floor | $(awk -v a="$iops" -v b="$floor" 'BEGIN { printf "%.2f", a / b }') |"
} | tee "$REPORT"
if [ -n "$OUT" ]; then cp "$REPORT" "$OUT"; echo "written to $OUT"; fi
