#!/bin/bash
# mpnfs against the limits a peer cannot beat, and against any other
# system given in PEERS, all measured in the same run on the same
# NFS-Ganesha bed: mpnfs on a default one-path mount; the limits are raw
# libnfs with no FUSE (nfs-cat, nfs-cp, nfs-qd1) and FUSE with no NFS
# (fuse-null); the median of ROUNDS rounds each, the systems taking turns
# within a round (in reverse order every other round). Each system in turn:
# a sequential write and a cold read of its own file, random 4 KiB reads at
# QD1, 4 jobs and QD32, and META_N (5000; 0 skips it) files created with
# 1 KiB each, stat-ed and removed. Then random reads over 1, 2 and 4 paths
# (PATHS=0 skips them). Prints a markdown report; with -o FILE also writes it there.
#   contrib/bench/compare.sh [-o FILE] [ROUNDS] [SIZE_MIB]
# (With PEERS, an even ROUNDS gives each system each place equally often.)
# PEERS: systems built by hand outside the repository (another mpnfs
# binary, fuse-nfs, turbonfs), as "NAME=COMMAND" entries separated by ';'.
# COMMAND mounts the bed's export in the foreground (the benchmark charges
# its process's CPU); {server}, {export} and {mnt} are replaced. Example:
#   PEERS='mpnfs-ade1922=/tmp/old/build/src/mpnfs {server}:{export} {mnt} -f -o mountport=20048'
# A peer's step that fails is listed under the table and left out of its
# median; a failure of mpnfs ends the run. The report prints
# only what it measured.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=
if [ "${1:-}" = "-o" ]; then OUT=$2; shift 2; fi
ROUNDS=${1:-3}
SIZE=${2:-1024}
FIO_SECS=${FIO_SECS:-10}
META_N=${META_N:-5000}  # files of the metadata step (0: none)
export MPNFS_TB=/tmp/mpnfs-cbench MPNFS_TB_NS=mpnfscb MPNFS_TB_NET=82 MPNFS_TB_LINK=mcb
SERVER=10.82.1.2
EXPORT=$MPNFS_TB/export
MNT=/tmp/mpnfs-cbench-mnt
NULLMNT=/tmp/mpnfs-cbench-null
SRC=/dev/shm/mpnfs-cbench-src
URL="nfs://$SERVER$EXPORT"
Q="version=3&nfsport=2049&mountport=20048"
. contrib/bench/lib.sh

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
# CPU seconds (user + system) of a command run to completion.
timed_cpu() { /usr/bin/time -f "%e %U %S" -o "$MPNFS_TB/time.out" "$@" >/dev/null; awk '{ printf "%s %.2f\n", $1, $2 + $3 }' "$MPNFS_TB/time.out"; }
fio_iops() {  # FILE RW-OPTIONS...: IOPS and mean completion latency (us); fails on no I/O
  local f=$1; shift
  fio --name=c --filename="$f" --rw=randread --bs=4k --direct=1 --runtime="$FIO_SECS" --time_based \
      --group_reporting --output-format=terse --terse-version=3 "$@" 2>/dev/null |
    awk -F';' '$8 > 0 { printf "%d %.0f\n", $8, $40; ok = 1 } END { exit !ok }'
}
# META_N x (create + 1 KiB write + close), then (the kernel's caches
# dropped; a daemon's own caches stay) stat, then unlink, in a new
# directory: the seconds of each phase. A system that holds the data past
# close is not charged for sending it.
meta() {  # DIR
  /usr/bin/python3 - "$1" "$META_N" <<'PY'
import os, sys, time
d, n = sys.argv[1], int(sys.argv[2])
os.mkdir(d)  # a new name each round: what a failed round left is not met
names = [os.path.join(d, "f%d" % i) for i in range(n)]
buf = b"x" * 1024
t0 = time.monotonic()
for p in names:
    fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    os.write(fd, buf)
    os.close(fd)
t1 = time.monotonic()
os.sync()  # (not timed: sync(2) sends a FUSE daemon nothing, so it would time the host's disks)
with open("/proc/sys/vm/drop_caches", "w") as f:
    f.write("3")
t2 = time.monotonic()
for p in names:
    if os.stat(p).st_size != 1024:
        sys.exit("wrong size: " + p)
t3 = time.monotonic()
for p in names:
    os.unlink(p)
t4 = time.monotonic()
os.rmdir(d)
print("%.2f %.2f %.2f" % (t1 - t0, t3 - t2, t4 - t3))
PY
}

contrib/testbed.sh down >/dev/null 2>&1 || true
rm -rf "$MPNFS_TB"
bed_start 1
dd if=/dev/urandom of="$SRC" bs=1M count="$SIZE" status=none
mount_mpnfs
dd if=/dev/urandom of="$MNT/rand.bin" bs=1M count=1024 conv=fsync status=none
umount_mpnfs
start_null

# The systems: mpnfs (this tree's build, or MPNFS_BIN), then each of PEERS.
SYS=(mpnfs "${PEER_NAMES[@]}")
mount_sys() { if [ "$1" = mpnfs ]; then mount_mpnfs; else mount_peer "${PEER_CMD[$1]}"; fi; }

declare -A V
add() { V[$1]+="$2 "; }
# A step of a peer that fails is reported, not fatal: the run goes on and
# the table shows what that system did not do. A step of mpnfs that fails
# ends the run.
FAILED=()
failed() {  # SYSTEM WHAT
  echo "$1: $2 failed" >&2
  [ "$1" != mpnfs ] || exit 1
  FAILED+=("$1: $2 failed")
}
step() {  # SYSTEM WHAT COMMAND...
  local x=$1 what=$2; shift 2
  "$@" && return 0
  failed "$x" "$what"
  return 1
}
# As step, for a command whose output is wanted: GOT holds it.
GOT=
outstep() {  # SYSTEM WHAT COMMAND...
  local x=$1 what=$2; shift 2
  GOT=$("$@") && return 0
  failed "$x" "$what"
  return 1
}
for r in $(seq "$ROUNDS"); do
  echo "round $r of $ROUNDS" >&2
  # The limits. Sequential write, 1 GiB: nfs-cp; read back cold: nfs-cat.
  rm -f "$EXPORT/raw.bin"
  read -r s c < <(timed_cpu nfs-cp "$SRC" "$URL/raw.bin?$Q")
  add raw_w "$(mbps "$SIZE" "$s")"; add raw_wcpu "$c"
  drop; read -r s c < <(timed_cpu nfs-cat "$URL/raw.bin?$Q")
  add raw_r "$(mbps "$SIZE" "$s")"; add raw_rcpu "$c"
  # Queue depth 1: one NFS round trip (nfs-qd1) and the FUSE floor. The
  # drops empty the server's page cache too (same machine): the file is
  # warmed there first (a read on the server side changes nothing), so
  # that these measure round trips, not the virtual disk.
  cat "$EXPORT/rand.bin" > /dev/null
  add rtt_iops "$(build/contrib/bench/nfs-qd1 "$URL/rand.bin?$Q" "$FIO_SECS" |
                  /usr/bin/python3 -c 'import json,sys; print(int(json.load(sys.stdin)["iops"]))')"
  outstep mpnfs "round $r, the limit fuse-null at QD1" fio_iops "$NULLMNT/f" --ioengine=psync
  read -r i l <<< "$GOT"; add null1 "$i"
  # The systems take turns, in reverse order every other round (what runs
  # first meets the server's page cache and write-back as the limits left them).
  order=("${SYS[@]}")
  if [ $((r % 2)) = 0 ]; then order=(); for ((i = ${#SYS[@]} - 1; i >= 0; i--)); do order+=("${SYS[$i]}"); done; fi
  for x in "${order[@]}"; do
    # Each system writes a file of its own name, fresh, and removes it
    # through its own mount: no system meets a name another one (or the
    # script, behind the server's back) has just changed.
    f=seq-$x.bin
    mount_sys "$x"
    # Sequential write, 1 GiB, fsync at the end, from the same start for
    # every system (nothing dirty on the server: the same machine's page
    # cache); then read back cold.
    drop; c0=$(cpu); t0=$(now)
    if step "$x" "round $r, sequential write" dd if="$SRC" of="$MNT/$f" bs=1M conv=fsync status=none; then
      t1=$(now); c1=$(cpu)
      add "$x.w" "$(mbps "$SIZE" "$(secs "$t0" "$t1")")"; add "$x.wcpu" "$(cpu_secs "$c0" "$c1")"
    fi
    drop
    if [ "$(stat -c %s "$MNT/$f" 2>/dev/null)" != $((SIZE << 20)) ]; then
      failed "$x" "round $r, the written file's size (so its read)"
    elif c0=$(cpu) && t0=$(now) && step "$x" "round $r, sequential read" dd if="$MNT/$f" of=/dev/null bs=1M status=none; then
      t1=$(now); c1=$(cpu)
      add "$x.r" "$(mbps "$SIZE" "$(secs "$t0" "$t1")")"; add "$x.rcpu" "$(cpu_secs "$c0" "$c1")"
    fi
    step "$x" "round $r, removing $f" rm -f "$MNT/$f" || true
    cat "$EXPORT/rand.bin" > /dev/null
    c0=$(cpu)
    if outstep "$x" "round $r, QD1" fio_iops "$MNT/rand.bin" --ioengine=psync; then
      c1=$(cpu); read -r i l <<< "$GOT"; add "$x.qd1" "$i"; add "$x.qd1_lat" "$l"
      add "$x.qd1cores" "$(awk -v c="$(cpu_secs "$c0" "$c1")" -v s="$FIO_SECS" 'BEGIN { printf "%.2f", c / s }')"
    fi
    if outstep "$x" "round $r, 4 jobs" fio_iops "$MNT/rand.bin" --ioengine=psync --numjobs=4; then
      read -r i l <<< "$GOT"; add "$x.j4" "$i"
    fi
    c0=$(cpu)
    if outstep "$x" "round $r, QD32" fio_iops "$MNT/rand.bin" --ioengine=libaio --iodepth=32; then
      c1=$(cpu); read -r i l <<< "$GOT"
      add "$x.qd32" "$i"; add "$x.qd32cores" "$(awk -v c="$(cpu_secs "$c0" "$c1")" -v s="$FIO_SECS" 'BEGIN { printf "%.2f", c / s }')"
    fi
    if [ "$META_N" -gt 0 ] && outstep "$x" "round $r, metadata" meta "$MNT/meta-$x-$r"; then
      read -r a b c <<< "$GOT"; add "$x.mcreate" "$a"; add "$x.mstat" "$b"; add "$x.munlink" "$c"
    fi
    umount_mpnfs
  done
done
kill_null

# Random reads over 1, 2 and 4 paths (one bed of 4 paths, mounts of the first N).
[ "${PATHS:-1}" = 0 ] || {
contrib/testbed.sh down >/dev/null 2>&1 || true
rm -rf "$MPNFS_TB"
bed_start 4
mount_mpnfs
dd if=/dev/urandom of="$MNT/rand.bin" bs=1M count=1024 conv=fsync status=none
umount_mpnfs
cat "$EXPORT/rand.bin" > /dev/null
for n in 1 2 4; do
  paths=$(seq -s+ -f "10.82.%g.2" 1 "$n")
  mount_mpnfs "path=$paths"
  for r in $(seq "$ROUNDS"); do
    outstep mpnfs "$n paths, QD32" fio_iops "$MNT/rand.bin" --ioengine=libaio --iodepth=32
    read -r i l <<< "$GOT"; add "p${n}_qd32" "$i"
    outstep mpnfs "$n paths, 4 jobs x QD32" fio_iops "$MNT/rand.bin" --ioengine=libaio --iodepth=32 --numjobs=4
    read -r i l <<< "$GOT"; add "p${n}_4x32" "$i"
  done
  umount_mpnfs
done
}

m() { if [ -n "${V[$1]:-}" ]; then echo "${V[$1]}" | median; else echo "n/a"; fi; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a != "n/a" && b > 0) printf "%.2f", a / b; else print "n/a" }'; }
gib=$(awk -v n="$SIZE" 'BEGIN { print n / 1024 }')
perg() { awk -v c="$1" -v g="$gib" 'BEGIN { if (c == "n/a") print "n/a"; else printf "%.2f", c / g }'; }
cols() {  # KEY [per-GiB]: the median of KEY for each system, as table cells
  local x out=
  for x in "${SYS[@]}"; do
    if [ "${2:-}" = cpu ]; then out+=" $(m "$x.$1") ($(perg "$(m "$x.${1}cpu")")) |"
    else out+=" $(m "$x.$1") |"; fi
  done
  echo "$out"
}
dashes() { local x out=; for x in "${SYS[@]}"; do out+="---|"; done; echo "$out"; }
{
  echo "# mpnfs against the limits, same run"
  echo
  echo "Recorded $(date -u '+%Y-%m-%d %H:%M UTC') on $(nproc) cores, kernel $(uname -r), NFS-Ganesha"
  echo "$(dpkg-query -W -f='${Version}' nfs-ganesha) (FSAL_VFS), libnfs $(pkg-config --modversion libnfs),"
  echo "libfuse $(pkg-config --modversion fuse3), mpnfs $(git describe --always --dirty 2>/dev/null || echo '?')${MPNFS_BIN:+ (binary $MPNFS_BIN)}."
  echo "Command: \`contrib/bench/compare.sh $ROUNDS $SIZE\` (FIO_SECS=$FIO_SECS META_N=$META_N PATHS=${PATHS:-1}). Medians of $ROUNDS rounds;"
  echo "server and client share the 2 cores."
  for x in "${SYS[@]:1}"; do echo "Peer $x: \`${PEER_CMD[$x]}\`."; done
  echo
  echo "| test |$(printf ' %s |' "${SYS[@]}") limit, same run | mpnfs / limit |"
  echo "|---|$(dashes)---|---|"
  echo "| seq read ${SIZE} MiB, dd bs=1M, MB/s (daemon CPU s/GiB) |$(cols r cpu) nfs-cat $(m raw_r) ($(perg "$(m raw_rcpu)")) | $(ratio "$(m mpnfs.r)" "$(m raw_r)") |"
  echo "| seq write ${SIZE} MiB, dd bs=1M conv=fsync, MB/s (daemon CPU s/GiB) |$(cols w cpu) nfs-cp $(m raw_w) ($(perg "$(m raw_wcpu)")) | $(ratio "$(m mpnfs.w)" "$(m raw_w)") |"
  # A FUSE gateway at queue depth 1 waits for one FUSE round trip and one
  # NFS round trip in turn: a reference is the two latencies added. Not a
  # floor: each includes a thread's wake-up, which a gateway that polls
  # (busy_poll) need not pay.
  floor=$(awk -v a="$(m rtt_iops)" -v b="$(m null1)" 'BEGIN { if (a > 0 && b > 0) printf "%d", 1 / (1 / a + 1 / b); else print 0 }')
  echo "| 4 KiB random read O_DIRECT, 1 job QD1, IOPS |$(cols qd1) one NFS round trip (nfs-qd1) $(m rtt_iops); FUSE alone (fuse-null) $(m null1); both in turn $floor | $(ratio "$(m mpnfs.qd1)" "$(m rtt_iops)") of nfs-qd1; $(ratio "$(m mpnfs.qd1)" "$(m null1)") of fuse-null; $(ratio "$(m mpnfs.qd1)" "$floor") of both in turn |"
  echo "| same, mean latency, us |$(cols qd1_lat) | |"
  echo "| same, daemon cores busy |$(cols qd1cores) | |"
  echo "| same, 4 jobs psync, IOPS |$(cols j4) | |"
  echo "| same, libaio QD32, IOPS |$(cols qd32) | |"
  echo "| same, daemon cores busy |$(cols qd32cores) | |"
  if [ "$META_N" -gt 0 ]; then
    echo "| $META_N x create O_EXCL + 1 KiB write + close, s |$(cols mcreate) | |"
    echo "| same files, stat (kernel caches dropped), s |$(cols mstat) | |"
    echo "| same files, unlink, s |$(cols munlink) | |"
  fi
  if [ "${PATHS:-1}" != 0 ]; then
    echo
    echo "mpnfs, random 4 KiB reads, O_DIRECT, libaio, over 1, 2 and 4 paths of one bed (IOPS):"
    echo
    echo "| paths | 1 job QD32 | 4 jobs x QD32 |"
    echo "|---|---|---|"
    for n in 1 2 4; do echo "| $n | $(m "p${n}_qd32") | $(m "p${n}_4x32") |"; done
  fi
  if [ ${#FAILED[@]} -gt 0 ]; then
    echo
    echo "Failed steps (not in the medians):"
    echo
    for f in "${FAILED[@]}"; do echo "- $f"; done
  fi
  echo
  echo "All rounds:"
  echo
  echo '```'
  for k in $(echo "${!V[@]}" | tr ' ' '\n' | sort); do echo "$k: ${V[$k]}"; done
  echo '```'
} > "$REPORT"
cat "$REPORT"
if [ -n "$OUT" ]; then cp "$REPORT" "$OUT"; echo "written to $OUT"; fi
