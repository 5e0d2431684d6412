"""Integration test harness: a real NFS-Ganesha in a network namespace
(contrib/testbed.sh) and real mpnfs FUSE mounts of it.

Everything a test starts is torn down even when the test fails: mounts are
unmounted and their mpnfs processes ended by PID; the test bed (namespace,
veth pairs, Ganesha, rpcbind) is removed at the end of the session.
"""
import os
import pathlib
import shutil
import subprocess
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TESTBED = str(ROOT / "contrib" / "testbed.sh")
BIN = os.environ.get("MPNFS_BIN", str(ROOT / "build" / "src" / "mpnfs"))
# MPNFS_IT_SLOT=N (default 0) gives a run its own bed (namespace, addresses,
# state and mount directories), so that two runs on one machine do not meet.
SLOT = int(os.environ.get("MPNFS_IT_SLOT", "0"))
SFX = str(SLOT) if SLOT else ""
NET = str(78 + SLOT)
TB = "/tmp/mpnfs-it" + SFX
LINK = "mit" + SFX
BED_ENV = dict(os.environ, MPNFS_TB=TB, MPNFS_TB_NS="mpnfsit" + SFX, MPNFS_TB_NET=NET,
               MPNFS_TB_LINK=LINK)
SERVER = f"10.{NET}.1.2"
SERVER2 = f"10.{NET}.2.2"  # the same server over the second path
SERVER3 = f"10.{NET}.3.2"
SERVER4 = f"10.{NET}.4.2"
SERVER5 = f"10.{NET}.5.2"  # (a fifth path, for what changes beyond four)
ALL_PATHS = "+".join([SERVER, SERVER2, SERVER3, SERVER4])
EXPORT = TB + "/export"
SQUASHED = TB + "/squashed"
# MPNFS_IT_FUSE_URING=1: every mount takes its FUSE requests through
# io_uring (fuse_uring=on, with the fuse module's enable_uring set for the
# run and put back after); otherwise they come through /dev/fuse.
FUSE_URING = os.environ.get("MPNFS_IT_FUSE_URING") == "1"
# MPNFS_IT_OPTS: mount options added to every mount the tests start (e.g.
# busy_poll=200), to run a module against an option by hand; a test's own
# options come after them, so that they win where both name one.
EXTRA_OPTS = os.environ.get("MPNFS_IT_OPTS", "")
ENABLE_URING = "/sys/module/fuse/parameters/enable_uring"


# A writer in its own process (so that the test process, which forks helpers,
# never holds the file open: each fork+exec would close-to-open flush it). It
# writes random 1 MiB chunks for argv[2] seconds, fsyncs, prints their md5.
SLOW_WRITER = r"""
import hashlib, os, sys, time
h = hashlib.md5()
end = time.time() + float(sys.argv[2])
with open(sys.argv[1], "wb") as f:
    while time.time() < end:
        chunk = os.urandom(1 << 20)
        f.write(chunk)
        h.update(chunk)
        time.sleep(0.01)
    f.flush()
    os.fsync(f.fileno())
print(h.hexdigest())
"""


def start_writer(path, seconds):
    return subprocess.Popen(["python3", "-c", SLOW_WRITER, str(path), str(seconds)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def is_mounted(path):
    path = os.path.realpath(str(path))
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == path for line in f)


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Bed:
    def run(self, *args, check=True):
        return subprocess.run([TESTBED, *args], env=BED_ENV, check=check,
                              capture_output=True, text=True)

    def restart_server(self):
        self.run("restart-server")

    def crash_server(self):
        self.run("crash-server")

    def stop_server(self):
        self.run("stop-server")

    def start_server(self):
        self.run("start-server")

    def link(self, state, k=1):
        self.run("link", state, str(k))

    def shape(self, k, rate):
        self.run("shape", str(k), rate)


def set_enable_uring(value):
    """Sets the fuse module's enable_uring ("Y" or "N"); returns what it was."""
    with open(ENABLE_URING) as f:
        old = f.read().strip()
    with open(ENABLE_URING, "w") as f:
        f.write(value)
    return old


@pytest.fixture(scope="session", autouse=True)
def fuse_uring_run():
    if not FUSE_URING:
        yield
        return
    if not os.path.exists(ENABLE_URING):
        pytest.exit("MPNFS_IT_FUSE_URING=1: this kernel has no FUSE over io_uring", returncode=1)
    old = set_enable_uring("Y")
    try:
        yield
    finally:
        set_enable_uring(old)


@pytest.fixture(scope="session")
def bed():
    b = Bed()
    b.run("down", check=False)  # leftovers of an aborted run
    shutil.rmtree(TB, ignore_errors=True)
    r = b.run("up", "5", check=False)  # five paths: 10.78.K.2 for K = 1..5
    if r.returncode != 0:
        b.run("down", check=False)
        pytest.fail(f"test bed did not start:\n{r.stdout}\n{r.stderr}")
    try:
        yield b
    finally:
        b.run("down", check=False)


class Mount:
    def __init__(self, path, proc, log):
        self.path = pathlib.Path(path)
        self.proc = proc
        self.log = log

    @property
    def pid(self):
        return self.proc.pid

    def log_text(self):
        try:
            return pathlib.Path(self.log).read_text()
        except OSError:
            return ""

    def unmount(self):
        if is_mounted(self.path):
            r = subprocess.run(["fusermount3", "-u", str(self.path)], capture_output=True)
            if r.returncode != 0:
                subprocess.run(["umount", "-l", str(self.path)], capture_output=True)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def start_mount(mountpoint, opts="", source=None, foreground=True, extra=(), portmapper=False):
    """portmapper: ask the server's portmapper where MOUNT is (by default the
    tests name its port, which spares the lookup)."""
    o = ",".join(x for x in ("" if portmapper else "mountport=20048",
                             "fuse_uring=on" if FUSE_URING and "fuse_uring=" not in opts else "",
                             EXTRA_OPTS, opts) if x)
    log = str(mountpoint) + ".log"
    args = [BIN, source or f"{SERVER}:{EXPORT}", str(mountpoint), "-o", o, *extra]
    if foreground:
        args.append("-f")
    with open(log, "w") as lf:
        proc = subprocess.Popen(args, stdout=lf, stderr=subprocess.STDOUT)
    return proc, log


def run_mount(tmp_path, source, opts, timeout=60):
    """A daemonising mount expected to fail; unmounted if it did not.
    Returns the completed process and how long it took."""
    mp = tmp_path / "m"
    mp.mkdir(exist_ok=True)
    t0 = time.time()
    r = subprocess.run([BIN, source, str(mp), "-o", opts], capture_output=True, text=True,
                       timeout=timeout)
    if is_mounted(mp):
        subprocess.run(["fusermount3", "-u", str(mp)])
    return r, time.time() - t0


MNT_ROOT = pathlib.Path("/tmp/mpnfs-it-mnt" + SFX)  # traversable by the test's non-root users


@pytest.fixture
def mount_factory(bed, request):
    mounts = []
    MNT_ROOT.mkdir(mode=0o755, exist_ok=True)
    os.chmod(MNT_ROOT, 0o755)
    base = MNT_ROOT / f"{request.node.name[:40]}-{os.getpid()}"  # control socket paths stay < 108 bytes

    def make(opts="", source=None, portmapper=False):
        mp = pathlib.Path(f"{base}-{len(mounts)}")
        mp.mkdir(mode=0o755)
        proc, log = start_mount(mp, opts, source, portmapper=portmapper)
        m = Mount(mp, proc, log)
        mounts.append(m)
        deadline = time.time() + 30
        while not is_mounted(mp):
            if proc.poll() is not None or time.time() > deadline:
                pytest.fail(f"mount did not come up:\n{m.log_text()}")
            time.sleep(0.05)
        return m

    yield make
    for m in mounts:
        m.unmount()
        shutil.rmtree(m.path, ignore_errors=True)
        pathlib.Path(m.log).unlink(missing_ok=True)


@pytest.fixture
def mnt(mount_factory):
    return mount_factory()


@pytest.fixture
def d(mnt, request):
    """A fresh directory for this test inside the mount."""
    p = mnt.path / request.node.name.replace("[", "_").replace("]", "")
    p.mkdir()
    return p


@pytest.fixture
def shared(mount_factory, request):
    """A world-writable directory on an allow_other mount, for tests that act
    as several users."""
    m = mount_factory("allow_other")
    p = m.path / request.node.name.replace("[", "_").replace("]", "")
    p.mkdir()
    os.chmod(p, 0o777)
    return p
