"""Online path maintenance (mpnfsctl path list|disable|enable|add|remove)
on a live mount with traffic running: a disabled path stops carrying calls
while the others carry on, its link can then go down and come back without
anyone noticing, and enabled again it carries traffic again; a path that was
not in the mount options is added and removed; the last enabled path cannot
be taken out; only root may change paths. Throughout, a writer and a reader
checksum what they move: no application error, no data lost."""
import hashlib
import os
import subprocess
import time

import pytest

from conftest import BIN, EXPORT, LINK, SERVER, SERVER2

CTL = os.path.join(os.path.dirname(BIN), "mpnfsctl")
RING_MIB = 96     # the writer rewrites a file of this size over and over
READ_MIB = 32     # the file the reader reads over and over

# Writes 1 MiB blocks (each with its number in its first bytes) round a ring
# of argv[3] MiB in argv[1] until the file argv[2] exists, then fsyncs and
# prints the md5 of what the file must hold and the number of blocks written.
WRITER = r"""
import hashlib, os, sys
path, stop, ring = sys.argv[1], sys.argv[2], int(sys.argv[3])
block = bytearray(os.urandom(1 << 20))
last = {}
n = 0
with open(path, "wb") as f:
    while not os.path.exists(stop):
        p = n % ring
        if p == 0:
            f.seek(0)
        block[:8] = n.to_bytes(8, "little")
        f.write(block)
        last[p] = n
        n += 1
    f.flush()
    os.fsync(f.fileno())
h = hashlib.md5()
for p in range(len(last)):
    block[:8] = last[p].to_bytes(8, "little")
    h.update(block)
print(h.hexdigest(), n, flush=True)
"""

# Reads argv[1] over and over until argv[2] exists, dropping it from the page
# cache after each pass so that every pass goes to the server; prints the
# number of passes and how many did not match the md5 argv[3].
READER = r"""
import hashlib, os, sys
path, stop, want = sys.argv[1], sys.argv[2], sys.argv[3]
passes = bad = 0
while not os.path.exists(stop) or passes == 0:
    h = hashlib.md5()
    fd = os.open(path, os.O_RDONLY)
    while chunk := os.read(fd, 1 << 20):
        h.update(chunk)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    passes += 1
    bad += h.hexdigest() != want
print(passes, bad, flush=True)
"""


def ctl(*args, user=None):
    pre = ["setpriv", "--reuid", str(user), "--regid", str(user), "--clear-groups"] if user else []
    return subprocess.run([*pre, CTL, *map(str, args)], capture_output=True, text=True, timeout=30)


def paths(m):
    """`path list` as {address: {column: value}}."""
    r = ctl("path", "list", m.path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    head = lines[0].split()
    out = {}
    for line in lines[1:]:
        row = dict(zip(head, line.split()))
        out[row["PATH"].rsplit(":", 1)[0]] = row
    return out


def calls(m, addr):
    p = paths(m).get(addr)
    return int(p["CALLS"]) if p else 0


def wait_for(what, pred, timeout=60):
    deadline = time.time() + timeout
    while not pred():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def when_another_is_up(m, op, addr, timeout=15):
    """`path OP ADDR`, which must succeed once another enabled path is up.
    Taking out the last path that is up is refused (engine.cc LastUpPath,
    engine_test). On a loaded machine the other path can be declared dead
    under the tests' traffic (under TSan the server can leave its WRITEs
    unanswered for a second while the other path's are answered) and be
    reconnecting at that instant: wait, as the refusal tells a user to. A
    reconnect takes a few seconds; `timeout` is short enough to fail on one
    that takes a minute (as it would if an added path shared the first path's
    event loop: engine_test AnAddedPathGetsALoopOfItsOwn)."""
    out = []

    def done():
        r = ctl("path", op, m.path, addr)
        if r.returncode == 1 and "last enabled path that is up" in r.stderr:
            return False
        assert r.returncode == 0, r.stderr
        out.append(r)
        return True
    try:
        wait_for(f"path {op} {addr} once another path is up", done, timeout)
    except AssertionError as e:
        try:
            now = paths(m)
        except AssertionError as e2:
            now = f"(path list failed: {e2})"
        raise AssertionError(f"{e}\n{now}\n{m.log_text()[-6000:]}") from None
    return out[0]


class Traffic:
    """A writer and a reader on the mount, running until stop()."""

    def __init__(self, m, tmp_path):
        self.m = m
        self.stop_file = tmp_path / "stop"
        data = os.urandom(READ_MIB << 20)
        (m.path / "readme").write_bytes(data)
        self.read_md5 = hashlib.md5(data).hexdigest()
        self.writer = subprocess.Popen(
            ["python3", "-c", WRITER, str(m.path / "ring"), str(self.stop_file), str(RING_MIB)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.reader = subprocess.Popen(
            ["python3", "-c", READER, str(m.path / "readme"), str(self.stop_file), self.read_md5],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def running(self):
        return self.writer.poll() is None and self.reader.poll() is None

    def progress(self, addr, calls_more, what):
        """Waits until path `addr` has carried `calls_more` more calls, with
        the traffic still running."""
        base = calls(self.m, addr)
        wait_for(what, lambda: calls(self.m, addr) >= base + calls_more)
        assert self.running(), "traffic ended early"

    def stop(self):
        self.stop_file.touch()
        wout, werr = self.writer.communicate(timeout=300)
        rout, rerr = self.reader.communicate(timeout=300)
        assert self.writer.returncode == 0, werr
        assert self.reader.returncode == 0, rerr
        want, blocks = wout.split()
        passes, bad = map(int, rout.split())
        assert int(blocks) > RING_MIB, "the writer did not go round its ring"
        assert passes > 1 and bad == 0, f"reader: {bad} of {passes} passes read wrong data"
        with open(os.path.join(EXPORT, "ring"), "rb") as f:
            assert hashlib.md5(f.read()).hexdigest() == want, "the server holds other data"
        return int(blocks), passes

    def abort(self):
        self.stop_file.touch()
        for p in (self.writer, self.reader):
            try:
                p.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.fixture
def traffic(request, tmp_path):
    started = []

    def start(m):
        t = Traffic(m, tmp_path)
        started.append(t)
        return t

    yield start
    for t in started:
        t.abort()


def test_a_disabled_path_carries_nothing_and_survives_its_link_going(bed, mount_factory, traffic):
    m = mount_factory(f"path={SERVER}+{SERVER2}")
    wait_for("both paths up", lambda: all(p["STATE"] == "up" for p in paths(m).values()), 15)
    t = traffic(m)
    t.progress(SERVER2, 50, "traffic on path 2 before the disable")

    r = when_another_is_up(m, "disable", SERVER2)
    assert "disabled" in r.stdout
    # Its calls in flight finish there; then it is disabled and carries nothing.
    wait_for("path 2 drained", lambda: paths(m)[SERVER2]["ADMIN"] == "disabled")
    frozen = paths(m)[SERVER2]
    t.progress(SERVER, 300, "traffic on path 1 while path 2 is disabled")
    now = paths(m)[SERVER2]
    assert (now["CALLS"], now["BYTES_OUT"], now["BYTES_IN"]) == \
        (frozen["CALLS"], frozen["BYTES_OUT"], frozen["BYTES_IN"]), (frozen, now)

    # Its link goes down and comes back: nobody notices, nothing moves.
    bed.link("down", 2)
    try:
        t.progress(SERVER, 300, "traffic on path 1 while path 2's link is down")
        assert paths(m)[SERVER2]["CALLS"] == frozen["CALLS"]
    finally:
        bed.link("up", 2)
    # Nothing declared path 2 dead (a failover of path 1 under load is not
    # what this test is about).
    dead = [l for l in m.log_text().splitlines() if "declared dead" in l and f"{SERVER2}:" in l]
    assert not dead, dead

    # Enabled again, it carries traffic again.
    r = ctl("path", "enable", m.path, SERVER2)
    assert r.returncode == 0, r.stderr
    assert paths(m)[SERVER2]["ADMIN"] == "enabled"
    t.progress(SERVER2, 100, "traffic on path 2 after the enable")
    blocks, passes = t.stop()
    print(f"writer {blocks} MiB, reader {passes} passes of {READ_MIB} MiB")


def test_a_path_added_carries_traffic_and_is_removed(bed, mount_factory, traffic):
    m = mount_factory(f"path={SERVER}")
    assert list(paths(m)) == [SERVER]
    t = traffic(m)
    t.progress(SERVER, 50, "traffic on the one path")

    r = ctl("path", "add", m.path, SERVER2)
    assert r.returncode == 0, r.stderr
    assert paths(m)[SERVER2]["ADMIN"] == "enabled"
    t.progress(SERVER2, 100, "traffic on the added path")
    assert f"connection {SERVER2}:2049#1 is up" in m.log_text(), m.log_text()[-2000:]
    r = ctl("path", "add", m.path, SERVER2)
    assert r.returncode == 1 and "already on this mount" in r.stderr, r.stderr

    when_another_is_up(m, "remove", SERVER2)
    wait_for("path 2 gone", lambda: SERVER2 not in paths(m))
    t.progress(SERVER, 300, "traffic on path 1 after the remove")
    assert SERVER2 not in paths(m)
    r = subprocess.run([CTL, "stats", str(m.path)], capture_output=True, text=True, timeout=10)
    assert SERVER2 not in r.stdout
    t.stop()
    # Its TCP connection is closed.
    r = subprocess.run(["ss", "-Htn", "state", "established", "dst", SERVER2],
                       capture_output=True, text=True, check=True)
    assert f"{SERVER2}:2049" not in r.stdout, r.stdout


def tx_bytes(k):
    with open(f"/sys/class/net/{LINK}c{k}/statistics/tx_bytes") as f:
        return int(f.read())


def test_an_added_path_takes_its_local_binding(mount_factory):
    """path 2's address, reached through path 3's interface, added live: its
    traffic leaves by that interface."""
    m = mount_factory(f"path={SERVER}")
    r = ctl("path", "add", m.path, f"{SERVER2}:2049", f"local={LINK}c3")
    assert r.returncode == 0, r.stderr
    wait_for("the added path up", lambda: paths(m)[SERVER2]["STATE"] == "up", 15)
    assert paths(m)[SERVER2]["LOCAL"] == f"{LINK}c3"
    before = tx_bytes(3)
    base = int(paths(m)[SERVER2]["BYTES_OUT"])
    i = 0
    while int(paths(m)[SERVER2]["BYTES_OUT"]) < base + (16 << 20):
        (m.path / f"bound{i % 2}").write_bytes(os.urandom(8 << 20))
        os.sync()
        i += 1
        assert i < 100, paths(m)
    assert tx_bytes(3) - before > 16 << 20


def test_refusals(mount_factory):
    m = mount_factory(f"path={SERVER}+{SERVER2}")
    wait_for("both paths up", lambda: all(p["STATE"] == "up" for p in paths(m).values()), 15)
    # Anyone may list; only root may change.
    r = ctl("path", "list", m.path, user=20001)
    assert r.returncode == 0 and SERVER2 in r.stdout, r.stderr
    for args in (("disable", m.path, SERVER2), ("add", m.path, "10.1.2.3"),
                 ("remove", m.path, SERVER2), ("enable", m.path, SERVER2)):
        r = ctl("path", *args, user=20001)
        assert r.returncode == 1 and "only root" in r.stderr, (args, r.stderr)
    assert paths(m)[SERVER2]["ADMIN"] == "enabled"

    r = ctl("path", "disable", m.path, "10.1.2.3")
    assert r.returncode == 1
    assert r.stderr.strip() == (f"mpnfsctl: no path 10.1.2.3 on this mount; paths are: "
                                f"{SERVER}:2049, {SERVER2}:2049"), r.stderr
    when_another_is_up(m, "disable", SERVER)
    for op in ("disable", "remove"):
        r = ctl("path", op, m.path, SERVER2)
        assert r.returncode == 1 and "last enabled path of this mount" in r.stderr, r.stderr
    # The mount still works, over path 2 alone: the data reaches the server
    # (fsync), and path 2 carried it.
    out1, out2 = int(paths(m)[SERVER]["BYTES_OUT"]), int(paths(m)[SERVER2]["BYTES_OUT"])
    fd = os.open(m.path / "still", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        assert os.write(fd, b"x" * 65536) == 65536
        os.fsync(fd)
    finally:
        os.close(fd)
    now = paths(m)
    assert int(now[SERVER2]["BYTES_OUT"]) - out2 >= 65536, now
    assert int(now[SERVER]["BYTES_OUT"]) == out1, now
    r = ctl("path", "add", m.path, SERVER2, "local=nosuch0")
    assert r.returncode == 1 and "no such interface" in r.stderr, r.stderr
    r = ctl("path", "frobnicate", m.path)
    assert r.returncode == 1 and "usage" in r.stderr, r.stderr
    assert ctl("path", "enable", m.path, SERVER).returncode == 0
    assert all(p["ADMIN"] == "enabled" for p in paths(m).values())
