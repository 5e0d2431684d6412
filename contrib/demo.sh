#!/bin/bash
# The embedded default: on a fresh Debian 12 machine (as root) installs what
# is missing, builds mpnfs, starts a local NFS-Ganesha test bed in a network
# namespace, mounts it with mpnfs, runs a short real workload, prints what
# happened, then unmounts and tears everything down.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export MPNFS_TB=/tmp/mpnfs-demo MPNFS_TB_NS=mpnfsdemo MPNFS_TB_NET=79 MPNFS_TB_LINK=mdemo
SERVER=10.79.1.2
EXPORT=$MPNFS_TB/export
MNT=/tmp/mpnfs-demo-mnt
PID=

cleanup() {
  set +e
  if grep -q " $MNT fuse.mpnfs " /proc/mounts; then fusermount3 -u "$MNT" || umount -l "$MNT"; fi
  if [ -n "$PID" ]; then
    for _ in $(seq 50); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
    kill "$PID" 2>/dev/null
  fi
  "$ROOT/contrib/testbed.sh" down >/dev/null 2>&1
  rm -rf "$MPNFS_TB" "$MNT"
}
trap cleanup EXIT

step() { printf '\n== %s\n' "$*"; }

step "installing what is missing"
contrib/deps.sh
step "building"
contrib/build.sh build >/dev/null
echo "built $ROOT/build/src/mpnfs ($(build/src/mpnfs --version))"

step "starting NFS-Ganesha in network namespace $MPNFS_TB_NS ($SERVER)"
contrib/testbed.sh down >/dev/null 2>&1 || true
rm -rf "$MPNFS_TB"
contrib/testbed.sh up 1
mkdir -p "$MNT"

step "mounting $SERVER:$EXPORT on $MNT"
build/src/mpnfs "$SERVER:$EXPORT" "$MNT" -f -o mountport=20048 2>"$MPNFS_TB/mpnfs.log" &
PID=$!
for _ in $(seq 100); do grep -q " $MNT fuse.mpnfs " /proc/mounts && break; sleep 0.1; done
grep " $MNT " /proc/mounts
df -h "$MNT"

step "workload: write, read back, list, checksum"
t0=$(date +%s.%N)
dd if=/dev/urandom of="$MPNFS_TB/src.bin" bs=1M count=256 status=none
dd if="$MPNFS_TB/src.bin" of="$MNT/big.bin" bs=1M conv=fsync 2>&1 | tail -1 | sed 's/^/write 256 MiB: /'
dd if="$MNT/big.bin" of=/dev/null bs=1M iflag=direct 2>&1 | tail -1 | sed 's/^/read  256 MiB (O_DIRECT): /'
mkdir -p "$MNT/tree"
for i in $(seq 1 200); do echo "file $i" > "$MNT/tree/f$i.txt"; done
echo "created 200 small files; listing shows $(ls "$MNT/tree" | wc -l) entries"
ln -s big.bin "$MNT/link-to-big"
mv "$MNT/tree/f1.txt" "$MNT/tree/renamed.txt"
a=$(md5sum < "$MPNFS_TB/src.bin" | cut -d' ' -f1)
b=$(md5sum < "$MNT/big.bin" | cut -d' ' -f1)
c=$(md5sum < "$EXPORT/big.bin" | cut -d' ' -f1)
echo "md5 source        $a"
echo "md5 through mpnfs $b"
echo "md5 on the server $c"
ls -la "$MNT" | head
t1=$(date +%s.%N)
awk -v a="$t0" -v b="$t1" 'BEGIN { printf "workload took %.1f s\n", b - a }'
if [ "$a" = "$b" ] && [ "$b" = "$c" ]; then
  echo "RESULT: checksums match"
else
  echo "RESULT: CHECKSUM MISMATCH" >&2
  exit 1
fi

step "unmounting and tearing down"
fusermount3 -u "$MNT"
wait "$PID" || true
PID=
echo "mpnfs log:"; sed 's/^/  /' "$MPNFS_TB/mpnfs.log"
