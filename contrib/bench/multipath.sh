#!/bin/bash
# mpnfs multipath benchmark: one NFS-Ganesha server reached over up to eight
# veth paths, each shaped with tbf (RATE mbit, default 200, both directions).
# Prints a markdown report; with -o FILE also writes it there.
#   contrib/bench/multipath.sh [-o contrib/bench/MULTIPATH.md] [RATE_MBIT]
#
# Measured: sequential write (dd conv=fsync) and single-stream read (dd
# bs=1M, empty page cache) over 1, 2, 3, 4 and 8 paths, as scaling efficiency
# T(N) / (N x T(1)); a 4-job fio read over 4 paths (the aggregate a single
# stream is compared with); three paths of 100, 200 and 400 mbit against the
# sum of what each carries alone (unweighted, with weight= and with the
# weights mpnfsctl calibrate --apply sets); throughput over time when a path dies in
# the middle of a write, a read and an O_DSYNC write; mpnfs CPU seconds per GiB moved.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=
if [ "${1:-}" = "-o" ]; then OUT=$2; shift 2; fi
RATE=${1:-200}
PER=128                      # MiB moved per path in each sequential test
export MPNFS_TB=/tmp/mpnfs-mpbench MPNFS_TB_NS=mpnfsmp MPNFS_TB_NET=81 MPNFS_TB_LINK=mmp
SERVER=10.81.1.2
EXPORT=$MPNFS_TB/export
MNT=/tmp/mpnfs-mpbench-mnt
SRC=/dev/shm/mpnfs-mpbench-src
. contrib/bench/lib.sh  # cleanup on exit, deps, build, helpers
CTL=$(dirname "${MPNFS_BIN:-build/src/mpnfs}")/mpnfsctl  # the one built with the mpnfs measured

mbps() { awk -v mib="$1" -v s="$2" 'BEGIN { printf "%.1f", mib * 1.048576 / s }'; }  # finer than lib.sh's
times() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a * b }'; }
plus() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", a + b }'; }
paths() { local n=$1 k out=; for k in $(seq 1 "$n"); do out+="${out:++}10.81.$k.2"; done; echo "path=$out"; }
pct() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f%%", 100 * a / b }'; }
per_gib() { awk -v c="$1" -v n="$2" 'BEGIN { printf "%.2f", c / (n / 1024) }'; }

# seq N MIB [OPTIONS]: sets W, R (MB/s) and WCPU, RCPU (CPU s/GiB) over the first N paths.
seq_run() {
  local n=$1 mib=$2 t0 t1 c0 c1
  mount_mpnfs "$(paths "$n")${3:+,$3}"
  rm -f "$MNT/seq.bin"
  c0=$(cpu); t0=$(now); dd if="$SRC" of="$MNT/seq.bin" bs=1M count="$mib" conv=fsync status=none; t1=$(now); c1=$(cpu)
  W=$(mbps "$mib" "$(secs "$t0" "$t1")"); WCPU=$(per_gib "$(cpu_secs "$c0" "$c1")" "$mib")
  drop
  c0=$(cpu); t0=$(now); dd if="$MNT/seq.bin" of=/dev/null bs=1M status=none; t1=$(now); c1=$(cpu)
  R=$(mbps "$mib" "$(secs "$t0" "$t1")"); RCPU=$(per_gib "$(cpu_secs "$c0" "$c1")" "$mib")
  umount_mpnfs
}

{
  echo "# mpnfs multipath benchmark results"
  echo
  echo "Recorded $(date -u '+%Y-%m-%d %H:%M UTC') on $(nproc) cores, kernel $(uname -r),"
  echo "NFS-Ganesha $(dpkg-query -W -f='${Version}' nfs-ganesha) (FSAL_VFS), libnfs $(pkg-config --modversion libnfs),"
  echo "mpnfs $(git rev-parse --short HEAD 2>/dev/null || echo '?'). Command: \`contrib/bench/multipath.sh $RATE\`."
  echo "Each path is a veth pair shaped with tbf at ${RATE} mbit in both directions; server and"
  echo "client share the machine's 2 cores. MB/s are 10^6 bytes per second."
  echo
} > "$REPORT"
cat "$REPORT"

contrib/testbed.sh down >/dev/null 2>&1 || true
rm -rf "$MPNFS_TB"
bed_start 8 "${RATE}mbit"
dd if=/dev/urandom of="$SRC" bs=1M count=$((8 * PER)) status=none

echo "## Scaling over paths of ${RATE} mbit" | tee -a "$REPORT"
row "paths" "write MB/s" "write scaling" "read MB/s (one dd)" "read scaling" "CPU s/GiB write / read"
echo "|---|---|---|---|---|---|" >> "$REPORT"
W1= R1=
for n in 1 2 3 4 8; do
  seq_run "$n" $((n * PER))
  [ -n "$W1" ] || { W1=$W; R1=$R; }
  row "$n" "$W" "$(pct "$W" "$(times "$n" "$W1")")" "$R" "$(pct "$R" "$(times "$n" "$R1")")" "$WCPU / $RCPU"
  [ "$n" != 4 ] || R4=$R
done

# The same four paths unshaped, for the CPU cost without tbf in the way.
for k in 1 2 3 4; do contrib/testbed.sh shape "$k" off; done
seq_run 4 $((4 * PER))
row "4, unshaped" "$W" "" "$R" "" "$WCPU / $RCPU"
for k in 1 2 3 4; do contrib/testbed.sh shape "$k" "${RATE}mbit"; done

# The aggregate with four readers at once, to compare the single stream with.
mount_mpnfs "$(paths 4)"
for j in 0 1 2 3; do dd if="$SRC" of="$MNT/job.$j" bs=1M count=$PER conv=fsync status=none; done
drop
agg=$(fio --name=agg --rw=read --bs=1M --ioengine=psync --numjobs=4 --group_reporting \
  --filename_format="$MNT/job.\$jobnum" --size=${PER}M --output-format=terse --terse-version=3 |
  awk -F';' '{ printf "%.1f", $7 * 1.024 / 1000 }')
umount_mpnfs
echo | tee -a "$REPORT"
row "single dd read over 4 paths vs fio 4 jobs" "$R4 MB/s vs $agg MB/s" "$(pct "$R4" "$agg")" "" "" ""
echo "|---|---|---|---|---|---|" >> "$REPORT"

# Heterogeneous: 100, 200 and 400 mbit.
echo | tee -a "$REPORT"
echo "## Paths of different speeds (100, 200, 400 mbit)" | tee -a "$REPORT"
row "paths" "write MB/s" "read MB/s (one dd)" "" "" ""
echo "|---|---|---|---|---|---|" >> "$REPORT"
contrib/testbed.sh shape 1 100mbit; contrib/testbed.sh shape 2 200mbit; contrib/testbed.sh shape 3 400mbit
sumw=0 sumr=0
for k in 1 2 3; do
  mount_mpnfs "path=10.81.$k.2"
  mib=$((32 * (1 << (k - 1))))
  t0=$(now); dd if="$SRC" of="$MNT/h.bin" bs=1M count=$((mib * 2)) conv=fsync status=none; t1=$(now)
  w=$(mbps $((mib * 2)) "$(secs "$t0" "$t1")")
  drop; t0=$(now); dd if="$MNT/h.bin" of=/dev/null bs=1M status=none; t1=$(now)
  r=$(mbps $((mib * 2)) "$(secs "$t0" "$t1")")
  umount_mpnfs
  row "path $k alone ($((100 * (1 << (k - 1)))) mbit)" "$w" "$r" "" "" ""
  sumw=$(plus "$sumw" "$w"); sumr=$(plus "$sumr" "$r")
done
# Unweighted, then with weight= saying the speeds (mpnfs(8): the balancer
# divides outstanding bytes by it; it measures no speed itself), then
# mounted unweighted with the weights `mpnfsctl calibrate --apply` measured
# and set on the live mount.
for weights in "" "1+2+4" calibrate; do
  if [ "$weights" = calibrate ]; then
    mount_mpnfs "path=10.81.1.2+10.81.2.2+10.81.3.2"
    # The mount answers once one path is up; calibrate measures the paths up now.
    for _ in $(seq 100); do
      [ "$("$CTL" path list "$MNT" | awk 'NR > 1 && $3 != "up"' | wc -l)" = 0 ] && break
      sleep 0.1
    done
    # --apply sets every weight or none (then mpnfsctl exits 1, set -e ends the run).
    "$CTL" calibrate "$MNT" --size 64M --time 1 --apply >"$MPNFS_TB/calibrate.out"
    weights="calibrate --apply: $("$CTL" path list "$MNT" |
      awk 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "WEIGHT") c = i; next } { printf "%s%s", sep, $c; sep = "+" }')"
  else
    mount_mpnfs "path=10.81.1.2+10.81.2.2+10.81.3.2${weights:+,weight=$weights}"
  fi
  t0=$(now); dd if="$SRC" of="$MNT/h3.bin" bs=1M count=$((4 * PER)) conv=fsync status=none; t1=$(now)
  w=$(mbps $((4 * PER)) "$(secs "$t0" "$t1")")
  drop; t0=$(now); dd if="$MNT/h3.bin" of=/dev/null bs=1M status=none; t1=$(now)
  r=$(mbps $((4 * PER)) "$(secs "$t0" "$t1")")
  umount_mpnfs
  case $weights in calibrate*) label=", $weights" ;; ?*) label=", weight=$weights" ;; *) label= ;; esac
  row "all three at once$label" "$w ($(pct "$w" "$sumw") of $sumw)" \
    "$r ($(pct "$r" "$sumr") of $sumr)" "" "" ""
done
for k in 1 2 3; do contrib/testbed.sh shape "$k" "${RATE}mbit"; done

# A path dies 3 s into a write and into a read (4 paths).
echo | tee -a "$REPORT"
echo "## A path fails during a transfer (4 paths, path 2, 3 or 4 taken down 3 s in)" | tee -a "$REPORT"
echo "(write: buffered, fsync at the end; read: cold cache; syncwrite: O_DSYNC, whose WRITE caught" | tee -a "$REPORT"
echo "on the lost path waits resend_fence)" | tee -a "$REPORT"
echo '```' >> "$REPORT"
mount_mpnfs "$(paths 4)"
python3 contrib/bench/timeline.py write "$MNT/fail.bin" $((8 * PER)) 2 3 | tee -a "$REPORT"
contrib/testbed.sh link up 2
umount_mpnfs
drop
mount_mpnfs "$(paths 4)"
python3 contrib/bench/timeline.py read "$MNT/fail.bin" $((8 * PER)) 3 3 | tee -a "$REPORT"
contrib/testbed.sh link up 3
umount_mpnfs
mount_mpnfs "$(paths 4)"
python3 contrib/bench/timeline.py syncwrite "$MNT/fail.bin" $((4 * PER)) 4 3 | tee -a "$REPORT"
contrib/testbed.sh link up 4
umount_mpnfs
echo '```' >> "$REPORT"

if [ -n "$OUT" ]; then cp "$REPORT" "$OUT"; echo "written to $OUT"; /usr/bin/python3 contrib/bench/plot.py; fi
