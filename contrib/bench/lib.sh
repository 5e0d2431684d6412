# Shared part of the benchmark scripts (sourced, not run, from the top of
# the repository). The caller sets SERVER, EXPORT, MNT, MPNFS_TB and SRC
# first. Sourcing installs what is missing, builds, and arranges for the
# mount, the test bed and the scratch files to go away on exit.
PID=
REPORT=$(mktemp)

NULLPID=
cleanup() {
  set +e
  kill_null
  grep -q " $MNT fuse" /proc/mounts && { fusermount3 -u "$MNT" || umount -l "$MNT"; }
  [ -n "$PID" ] && { wait "$PID" 2>/dev/null; }
  contrib/testbed.sh down >/dev/null 2>&1
  rm -rf "$MPNFS_TB" "$SRC" "$MNT" "$REPORT"
}
trap cleanup EXIT

contrib/deps.sh --bench
contrib/build.sh build >/dev/null

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }
mbps() { awk -v mib="$1" -v s="$2" 'BEGIN { printf "%.0f", mib * 1.048576 / s }'; }
cpu() { awk '{ print ($14 + $15) }' "/proc/$PID/stat"; }
cpu_secs() { awk -v a="$1" -v b="$2" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.2f", (b - a) / hz }'; }
row() { local line; line="|$(printf ' %s |' "$@")"; echo "$line" >> "$REPORT"; echo "$line"; }
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
# The test bed with N paths [RATE], once its server's grace period after a
# start (5 s, testbed.sh, lifted at its next check) is over: in it the
# server answers truncations with NFS3ERR_JUKEBOX, which libnfs's tools do
# not retry.
bed_start() { contrib/testbed.sh up "$@" >/dev/null; sleep 7; }

mount_mpnfs() {  # [OPTIONS]
  mkdir -p "$MNT"
  "${MPNFS_BIN:-build/src/mpnfs}" "$SERVER:$EXPORT" "$MNT" -f -o "mountport=20048${1:+,$1}" 2>>"$MPNFS_TB/mpnfs.log" &
  PID=$!
  for _ in $(seq 100); do grep -q " $MNT fuse.mpnfs " /proc/mounts && return 0; sleep 0.1; done
  echo "mount failed" >&2; cat "$MPNFS_TB/mpnfs.log" >&2; exit 1
}
# FUSE with no NFS (fuse-null, its file `f`) at $NULLMNT, which the caller
# sets: the floor of a FUSE round trip. kill_null (and cleanup) ends it.
start_null() {
  mkdir -p "$NULLMNT"
  build/contrib/bench/fuse-null "$NULLMNT" 1024 &
  NULLPID=$!
  for _ in $(seq 50); do [ -e "$NULLMNT/f" ] && return 0; sleep 0.1; done
  echo "fuse-null did not mount" >&2; exit 1
}
kill_null() {
  [ -n "${NULLMNT:-}" ] || return 0
  if [ -n "$NULLPID" ]; then fusermount3 -u "$NULLMNT" 2>/dev/null || true; wait "$NULLPID" 2>/dev/null || true; NULLPID=; fi
  rmdir "$NULLMNT" 2>/dev/null || true
}
umount_mpnfs() {
  fusermount3 -u "$MNT"
  # A forked daemon is no child: wait for it to go, 10 s at most.
  wait "$PID" 2>/dev/null || for _ in $(seq 200); do kill -0 "$PID" 2>/dev/null || break; sleep 0.05; done
  PID=
}

# Mounts with another system's COMMAND ({server}, {export} and {mnt}
# replaced), run in the foreground as PID so that its CPU is charged. A
# peer that cannot stay in the foreground (fuse-nfs) forks its daemon and
# exits: PID is then the newest process whose arguments name the mount
# point.
mount_peer() {  # COMMAND
  local cmd=${1//\{server\}/$SERVER}
  cmd=${cmd//\{export\}/$EXPORT}
  cmd=${cmd//\{mnt\}/$MNT}
  mkdir -p "$MNT"
  bash -c "exec $cmd" 2>>"$MPNFS_TB/peer.log" &
  PID=$!
  for _ in $(seq 100); do
    if grep -q " $MNT fuse" /proc/mounts; then
      # A foreground peer is still running a moment later; one that forked
      # its daemon has exited (or exits now: wait for it, boundedly).
      local i
      for i in $(seq 20); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
      if ! kill -0 "$PID" 2>/dev/null; then
        wait "$PID" || true
        PID=$(pgrep -n -f -- " $MNT( |\$)") || { echo "no daemon for: $cmd" >&2; exit 1; }
      fi
      return 0
    fi
    sleep 0.1
  done
  echo "mount failed: $cmd" >&2; cat "$MPNFS_TB/peer.log" >&2; exit 1
}

# PEERS ("NAME=COMMAND" entries separated by ';', see compare.sh) parsed
# once: PEER_NAMES in order, PEER_CMD[NAME] the command for mount_peer.
PEER_NAMES=()
declare -A PEER_CMD
IFS=';' read -ra _peers <<< "${PEERS:-}"
for _e in "${_peers[@]}"; do
  _e=$(echo "$_e" | sed 's/^ *//; s/ *$//')
  [ -n "$_e" ] || continue
  PEER_NAMES+=("${_e%%=*}"); PEER_CMD[${_e%%=*}]=${_e#*=}
done
unset _peers _e

fresh_bed_with_data() {  # MIB [SCAN_MIB]: a new one-path bed holding db.bin (and scan.bin)
  contrib/testbed.sh down >/dev/null 2>&1 || true
  rm -rf "$MPNFS_TB" "$SRC"
  bed_start 1
  mkdir -p "$SRC"
  mount_mpnfs
  dd if=/dev/urandom of="$MNT/db.bin" bs=1M count="$1" conv=fsync status=none
  [ -z "${2:-}" ] || dd if=/dev/urandom of="$MNT/scan.bin" bs=1M count="$2" conv=fsync status=none
  umount_mpnfs
}
