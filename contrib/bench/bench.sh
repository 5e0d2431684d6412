#!/bin/bash
# mpnfs benchmark: mpnfs side by side with raw libnfs (nfs-cat / nfs-cp, no
# FUSE) against the same NFS-Ganesha test bed, unshaped and on one path
# shaped with tbf. Prints a markdown report; with -o FILE also writes it there.
#   contrib/bench/bench.sh [-o contrib/bench/RESULTS.md] [SIZE_MIB]
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=
if [ "${1:-}" = "-o" ]; then OUT=$2; shift 2; fi
SIZE=${1:-1024}              # MiB for the unshaped sequential tests
SHAPED_SIZE=256              # MiB on the shaped path
RATE_MBIT=200
export MPNFS_TB=/tmp/mpnfs-bench MPNFS_TB_NS=mpnfsbench MPNFS_TB_NET=80 MPNFS_TB_LINK=mbn
SERVER=10.80.1.2
EXPORT=$MPNFS_TB/export
MNT=/tmp/mpnfs-bench-mnt
SRC=/dev/shm/mpnfs-bench-src
URL="nfs://$SERVER$EXPORT"
Q="version=3&nfsport=2049&mountport=20048"
. contrib/bench/lib.sh  # cleanup on exit, deps, build, helpers

bed_up() {
  contrib/testbed.sh down >/dev/null 2>&1 || true
  rm -rf "$MPNFS_TB"
  bed_start 1 ${1:-}
}

seq_suite() {  # $1 size MiB, $2 label
  local n=$1 label=$2 t0 t1 c0 c1
  rm -f "$EXPORT/raw.bin" "$EXPORT/m.bin" "$EXPORT/md.bin" 2>/dev/null || true
  t0=$(now); nfs-cp "$SRC" "$URL/raw.bin?$Q" >/dev/null; t1=$(now)
  local raw_w; raw_w=$(mbps "$n" "$(secs "$t0" "$t1")")
  drop; t0=$(now); nfs-cat "$URL/raw.bin?$Q" > /dev/null; t1=$(now)
  local raw_r; raw_r=$(mbps "$n" "$(secs "$t0" "$t1")")
  mount_mpnfs
  c0=$(cpu); t0=$(now); dd if="$SRC" of="$MNT/m.bin" bs=1M conv=fsync status=none; t1=$(now); c1=$(cpu)
  local w; w=$(mbps "$n" "$(secs "$t0" "$t1")"); local wcpu; wcpu=$(cpu_secs "$c0" "$c1")
  t0=$(now); dd if="$SRC" of="$MNT/md.bin" bs=1M oflag=direct status=none; t1=$(now)
  local wd; wd=$(mbps "$n" "$(secs "$t0" "$t1")")
  drop; c0=$(cpu); t0=$(now); dd if="$MNT/m.bin" of=/dev/null bs=1M status=none; t1=$(now); c1=$(cpu)
  local r; r=$(mbps "$n" "$(secs "$t0" "$t1")"); local rcpu; rcpu=$(cpu_secs "$c0" "$c1")
  t0=$(now); dd if="$MNT/md.bin" of=/dev/null bs=1M iflag=direct status=none; t1=$(now)
  local rd; rd=$(mbps "$n" "$(secs "$t0" "$t1")")
  umount_mpnfs
  local gib; gib=$(awk -v n="$n" 'BEGIN { print n / 1024 }')
  row "$label sequential write" "$w MB/s (O_DIRECT dd: $wd MB/s)" "$raw_w MB/s (nfs-cp)" \
      "$(awk -v a="$w" -v b="$raw_w" 'BEGIN { printf "%.0f%%", 100 * a / b }')" \
      "$(awk -v c="$wcpu" -v g="$gib" 'BEGIN { printf "%.2f s/GiB", c / g }')"
  row "$label sequential read" "$r MB/s (O_DIRECT dd: $rd MB/s)" "$raw_r MB/s (nfs-cat)" \
      "$(awk -v a="$r" -v b="$raw_r" 'BEGIN { printf "%.0f%%", 100 * a / b }')" \
      "$(awk -v c="$rcpu" -v g="$gib" 'BEGIN { printf "%.2f s/GiB", c / g }')"
}

{
  echo "# mpnfs benchmark results"
  echo
  echo "Recorded $(date -u '+%Y-%m-%d %H:%M UTC') on $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB,"
  echo "kernel $(uname -r), NFS-Ganesha $(dpkg-query -W -f='${Version}' nfs-ganesha) (FSAL_VFS),"
  echo "libnfs $(pkg-config --modversion libnfs), libfuse $(pkg-config --modversion fuse3), mpnfs $(git rev-parse --short HEAD 2>/dev/null || echo '?')."
  echo "Command: \`contrib/bench/bench.sh $SIZE\`. Server and client share the machine's 2 cores."
  echo
  echo "| test | mpnfs | raw libnfs / line rate | mpnfs share | mpnfs CPU |"
  echo "|---|---|---|---|---|"
} > "$REPORT"
cat "$REPORT"

dd if=/dev/urandom of="$SRC" bs=1M count="$SIZE" status=none
bed_up
seq_suite "$SIZE" "unshaped, $SIZE MiB,"

# 4 KiB random read IOPS (fio, O_DIRECT, 4 jobs x iodepth 16).
mount_mpnfs
dd if=/dev/urandom of="$MNT/fio.bin" bs=1M count=1024 conv=fsync status=none
iops=$(fio --name=rr --filename="$MNT/fio.bin" --rw=randread --bs=4k --direct=1 \
  --ioengine=libaio --iodepth=16 --numjobs=4 --runtime=15 --time_based --group_reporting \
  --output-format=terse --terse-version=3 | awk -F';' '{ print $8 }')
lat=$(fio --name=rr1 --filename="$MNT/fio.bin" --rw=randread --bs=4k --direct=1 --ioengine=psync \
  --runtime=8 --time_based --output-format=terse --terse-version=3 | awk -F';' '{ printf "%.0f", $40 }')
row "4 KiB random read, fio 4 jobs x QD16, O_DIRECT" "$iops IOPS" "" "" ""
row "4 KiB random read latency, 1 job QD1" "$lat us mean" "" "" ""

# Metadata: 5000 x (create + 1 KiB write + close), stat, unlink.
meta=$(python3 - "$MNT/meta" <<'PY'
import os, sys, time
d = sys.argv[1]; os.mkdir(d); data = b"m" * 1024
t0 = time.time()
for i in range(5000):
    fd = os.open(f"{d}/f{i}", os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644); os.write(fd, data); os.close(fd)
t1 = time.time()
for i in range(5000): os.stat(f"{d}/f{i}")
t2 = time.time()
for i in range(5000): os.unlink(f"{d}/f{i}")
t3 = time.time()
print(f"{t1-t0:.2f} {t2-t1:.2f} {t3-t2:.2f}")
PY
)
read -r mc ms mu <<< "$meta"
row "metadata, 5000 files" "create+1KiB write+close $mc s, stat $ms s, unlink $mu s" "" "" ""
umount_mpnfs

# One path shaped with tbf.
bed_up "${RATE_MBIT}mbit"
dd if=/dev/urandom of="$SRC" bs=1M count="$SHAPED_SIZE" status=none
line=$(awk -v r="$RATE_MBIT" 'BEGIN { printf "%.1f", r / 8 * 1.0 }')   # MB/s
mount_mpnfs
t0=$(now); dd if="$SRC" of="$MNT/s.bin" bs=1M conv=fsync status=none; t1=$(now)
sw=$(awk -v n="$SHAPED_SIZE" -v s="$(secs "$t0" "$t1")" 'BEGIN { printf "%.1f", n * 1.048576 / s }')
drop; t0=$(now); dd if="$MNT/s.bin" of=/dev/null bs=1M iflag=direct status=none; t1=$(now)
sr=$(awk -v n="$SHAPED_SIZE" -v s="$(secs "$t0" "$t1")" 'BEGIN { printf "%.1f", n * 1.048576 / s }')
umount_mpnfs
row "tbf ${RATE_MBIT}mbit path, $SHAPED_SIZE MiB write" "$sw MB/s" "$line MB/s line rate" \
    "$(awk -v a="$sw" -v b="$line" 'BEGIN { printf "%.0f%%", 100 * a / b }')" ""
row "tbf ${RATE_MBIT}mbit path, $SHAPED_SIZE MiB read" "$sr MB/s" "$line MB/s line rate" \
    "$(awk -v a="$sr" -v b="$line" 'BEGIN { printf "%.0f%%", 100 * a / b }')" ""

if [ -n "$OUT" ]; then cp "$REPORT" "$OUT"; echo "written to $OUT"; fi
