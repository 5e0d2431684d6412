#!/bin/bash
# mpnfs lock benchmark: two gateways on one NFS-Ganesha export (one unshaped
# path), locks through Ganesha's NLM v4. Prints a markdown report; with
# -o FILE also appends it there.
#   contrib/bench/locks.sh [-o contrib/bench/LOCKS.md] [ROUNDS]
#
# Measured in one run:
# - an uncontended fcntl lock + unlock pair through mpnfs, against the same
#   pair sent raw (NLM LOCK + UNLOCK over one TCP connection, no FUSE, from
#   the same kind of Python loop), medians of ROUNDS (default 2000) pairs;
# - the time from an unlock through gateway A to the grant of a waiting
#   F_SETLKW through gateway B (median and max of 20);
# - appends per second from both gateways at once, each append under an
#   exclusive flock, open-append-close, for 10 s, and lines lost (must be 0).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=
if [ "${1:-}" = "-o" ]; then OUT=$2; shift 2; fi
ROUNDS=${1:-2000}
export MPNFS_TB=/tmp/mpnfs-lkbench MPNFS_TB_NS=mpnfslk MPNFS_TB_NET=85 MPNFS_TB_LINK=mlk
SERVER=10.85.1.2
EXPORT=$MPNFS_TB/export
MNT=/tmp/mpnfs-lkbench-a
MNT2=/tmp/mpnfs-lkbench-b
SRC=/dev/shm/mpnfs-lkbench-src
. contrib/bench/lib.sh  # cleanup on exit, deps, build, helpers
PID2=
cleanup2() {
  set +e
  grep -q " $MNT2 fuse.mpnfs " /proc/mounts && { fusermount3 -u "$MNT2" || umount -l "$MNT2"; }
  [ -n "$PID2" ] && wait "$PID2" 2>/dev/null
  rm -rf "$MNT2"
  cleanup
}
trap cleanup2 EXIT

contrib/testbed.sh down >/dev/null 2>&1 || true
bed_start 1
mount_mpnfs
mkdir -p "$MNT2"
"${MPNFS_BIN:-build/src/mpnfs}" "$SERVER:$EXPORT" "$MNT2" -f -o mountport=20048 2>>"$MPNFS_TB/mpnfs2.log" &
PID2=$!
for _ in $(seq 100); do grep -q " $MNT2 fuse.mpnfs " /proc/mounts && break; sleep 0.1; done
echo 0 > "$MNT/lockfile"

python3 - "$MNT" "$MNT2" "$SERVER" "$EXPORT" "$ROUNDS" >> "$REPORT" <<'PY'
import fcntl, os, socket, statistics, struct, subprocess, sys, threading, time
a, b, server, export, rounds = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])

def W(*v): return b"".join(struct.pack(">I", x & 0xFFFFFFFF) for x in v)
def S(x):
    x = x.encode() if isinstance(x, str) else x
    return W(len(x)) + x + b"\0" * (-len(x) % 4)
xid = [int(time.time())]
def call(sock, prog, vers, proc, args):
    xid[0] += 1
    cred = W(0) + S("bench") + W(0, 0, 0)
    msg = W(xid[0], 0, 2, prog, vers, proc) + W(1) + S(cred) + W(0, 0) + args
    sock.sendall(struct.pack(">I", 0x80000000 | len(msg)) + msg)
    buf = b""
    while len(buf) < 4: buf += sock.recv(65536)
    n = struct.unpack(">I", buf[:4])[0] & 0x7FFFFFFF
    while len(buf) < 4 + n: buf += sock.recv(65536)
    rep = buf[4:4 + n]
    vl = struct.unpack(">I", rep[16:20])[0]
    return rep[20 + vl + (-vl % 4) + 4:]
def opaque(r, at):
    n = struct.unpack(">I", r[at:at + 4])[0]
    return r[at + 4:at + 4 + n]
def port_of(prog, vers):
    s = socket.create_connection((server, 111))
    return struct.unpack(">I", call(s, 100000, 2, 3, W(prog, vers, 6, 0))[:4])[0]

# Raw: MOUNT, LOOKUP, then NLM LOCK + UNLOCK pairs on one connection.
root = opaque(call(socket.create_connection((server, 20048)), 100005, 3, 1, S(export)), 4)
fh = opaque(call(socket.create_connection((server, 2049)), 100003, 3, 3, S(root) + S("lockfile")), 4)
nlm = socket.create_connection((server, port_of(100021, 4)))
nlm.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
lock = lambda: S("ck") + W(0, 1) + S("bench-raw") + S(fh) + S("raw-owner") + W(7) + W(0, 0, 0, 0) + W(0, 1)
unlock = lambda: S("ck") + S("bench-raw") + S(fh) + S("raw-owner") + W(7) + W(0, 0, 0, 0)
def pairs(fn):
    t = []
    for _ in range(rounds):
        t0 = time.perf_counter(); fn(); t.append(time.perf_counter() - t0)
    return statistics.median(t) * 1e6, statistics.quantiles(t, n=100)[98] * 1e6
def raw_pair():
    assert struct.unpack(">I", call(nlm, 100021, 4, 2, lock())[8:12])[0] == 0
    call(nlm, 100021, 4, 4, unlock())
fd = os.open(os.path.join(a, "lockfile"), os.O_RDWR)
def mpnfs_pair():
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
    fcntl.lockf(fd, fcntl.LOCK_UN, 1, 0)
raw = pairs(raw_pair)
mp = pairs(mpnfs_pair)
print("| measure | median | p99 |")
print("|---|---|---|")
print(f"| lock + unlock pair, raw NLM (no FUSE), us | {raw[0]:.0f} | {raw[1]:.0f} |")
print(f"| lock + unlock pair through mpnfs (fcntl), us | {mp[0]:.0f} | {mp[1]:.0f} |")
print(f"| mpnfs / raw | {mp[0] / raw[0]:.2f}x | |")

# Release on A -> grant on B (B waits in F_SETLKW).
lat = []
for _ in range(20):
    fcntl.lockf(fd, fcntl.LOCK_EX, 0, 0)
    w = subprocess.Popen([sys.executable, "-c",
                          "import fcntl,os,sys,time;fd=os.open(sys.argv[1],os.O_RDWR);"
                          "print('waiting',flush=True);fcntl.lockf(fd,fcntl.LOCK_EX,0,0);print(time.time())",
                          os.path.join(b, "lockfile")], stdout=subprocess.PIPE, text=True)
    w.stdout.readline()
    time.sleep(0.3)
    t0 = time.time()
    fcntl.lockf(fd, fcntl.LOCK_UN, 0, 0)
    lat.append(float(w.stdout.readline()) - t0)
    w.wait()
print(f"| unlock on A to grant on B (F_SETLKW), ms | {statistics.median(lat) * 1e3:.0f} | max {max(lat) * 1e3:.0f} |")
os.close(fd)

# Appends under flock from both gateways for 10 s.
log = "appends.log"
open(os.path.join(a, log), "w").close()
counts = {}
def appender(mnt, who):
    n, end = 0, time.time() + 10
    path = os.path.join(mnt, log)
    while time.time() < end:
        f = os.open(path, os.O_WRONLY | os.O_APPEND)
        fcntl.flock(f, fcntl.LOCK_EX)
        os.write(f, f"{who}{n}\n".encode())
        os.close(f)
        n += 1
    counts[who] = n
ts = [threading.Thread(target=appender, args=(m, w)) for m, w in ((a, "A"), (b, "B"))]
for t in ts: t.start()
for t in ts: t.join()
lines = open(os.path.join(b, log)).read().splitlines()
total = counts["A"] + counts["B"]
print(f"| appends per second, both gateways, each under flock | {total / 10:.0f} | lost {total - len(set(lines))} of {total} |")
PY
{
  echo
  echo "## $(date -u +%F) at $(git rev-parse --short HEAD): \`contrib/bench/locks.sh $ROUNDS\`"
  echo
  cat "$REPORT"
} > "$REPORT.out"
cat "$REPORT.out"
[ -z "$OUT" ] || cat "$REPORT.out" >> "$OUT"
rm -f "$REPORT.out"
