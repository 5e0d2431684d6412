"""mpnfs_fsx (test/fsx), the randomized file-operation tester, on real mounts:
overlapping writes, reads, truncates, mmap, several descriptors, reopen (with
O_TRUNC and O_APPEND), fsync and page-cache drops, times set right after
writes, mode changes and writes by another user, each checked against the
tester's in-memory copy of the file, its mode and its mtime. One fixed seed per mode, so a failure
reproduces: its output names the seed and the command line.

Modes: a default mount, four paths, direct_io, each cache_mode, remounts in
the middle of the run (the tester runs a command that unmounts and mounts
again at the same place), and a path taken down and brought back up during
the run. MPNFS_IT_FSX_OPS sets the operations per mode (default 3000; the
sanitizer runs of the suite use fewer); MPNFS_IT_FSX_ARGS adds tester flags
to every run (by hand: e.g. "--trunc-prob 0" to look past a known O_TRUNC bug)."""
import os
import pathlib
import select
import shlex
import subprocess
import sys
import time

import pytest

from conftest import ALL_PATHS, BIN, EXPORT, ROOT, SERVER, SERVER2, is_mounted
from test_multipath import conn, wait_all_up
from test_writeback import free_export  # noqa: F401 (autouse: frees an export a failed write-back run left claimed)

OPS = int(os.environ.get("MPNFS_IT_FSX_OPS", "3000"))
ARGS = os.environ.get("MPNFS_IT_FSX_ARGS", "").split()
TIMEOUT = 900


def fsx_binary():
    """The tester from the build that made BIN, else from build/."""
    cands = [os.environ.get("MPNFS_FSX", ""),
             os.path.join(os.path.dirname(os.path.dirname(BIN)), "test", "fsx", "mpnfs_fsx"),
             str(ROOT / "build" / "test" / "fsx" / "mpnfs_fsx")]
    for c in cands:
        if c and os.access(c, os.X_OK):
            return c
    pytest.fail("mpnfs_fsx is not built (ninja -C build test/fsx/mpnfs_fsx)")


def fsx_args(path, seed, *extra):
    return [fsx_binary(), "--seed", str(seed), "--ops", str(OPS), "--quiet", *extra, *ARGS, str(path)]


def run_fsx(m, path, seed, *extra):
    # The tester's working directory is outside the mount (a remount must not find it busy).
    r = subprocess.run(fsx_args(path, seed, *extra), capture_output=True, text=True, timeout=TIMEOUT,
                       cwd="/")
    check(r.returncode, r.stdout, r.stderr, m)
    return r.stdout


def check(rc, out, err, m):
    assert rc == 0, (f"mpnfs_fsx failed (exit {rc}):\n{out}\n{err}\n"
                     f"--- mpnfs log (tail):\n{m.log_text()[-3000:]}")
    assert f"{OPS} ops OK" in out, out


@pytest.fixture
def cache_dir(tmp_path):
    d = tmp_path / "cache"
    d.mkdir()
    return d


# Mount options per mode, the seed, and the tester's extra flags.
MODES = {
    "default": ("", 9101, ()),
    "four_paths": (f"path={ALL_PATHS}", 9102, ()),
    "direct_io": ("direct_io", 9103, ("--no-mmap",)),  # direct_io files cannot be mapped
    "o_direct": ("", 9104, ("--direct",)),  # O_DIRECT descriptors on a default mount
    "readonly": ("cache_dir={cache},cache_size=64M,cache_mode=readonly", 9105, ()),
    "writethrough": ("cache_dir={cache},cache_size=64M,cache_mode=writethrough", 9106, ()),
    "writeback": ("cache_dir={cache},cache_size=64M,cache_block=64,cache_mode=writeback", 9107, ()),
    # Writes by another user too (setuid and setgid must go at once), every
    # cache mode; the other modes set times and modes as the owner.
    "other_user": ("allow_other", 9108, ("--other-uid", "20003")),
    "other_user_writethrough": ("allow_other,cache_dir={cache},cache_size=64M,cache_mode=writethrough", 9109,
                                ("--other-uid", "20003")),
    "other_user_writeback": ("allow_other,cache_dir={cache},cache_size=64M,cache_block=64,cache_mode=writeback",
                             9110, ("--other-uid", "20003")),
}


@pytest.mark.parametrize("mode", list(MODES))
def test_fsx(mount_factory, cache_dir, mode):
    opts, seed, extra = MODES[mode]
    m = mount_factory(opts.format(cache=cache_dir))
    if "path=" in opts:
        wait_all_up(m)
    f = m.path / f"fsx-{mode}"
    run_fsx(m, f, seed, *extra)
    # What reached the server is what the tester last read back through the mount
    # (its final check). Unmounting flushes anything a cache still holds.
    data = f.read_bytes()
    m.unmount()
    assert pathlib.Path(EXPORT, f.name).read_bytes() == data


# Unmounts MOUNTPOINT, waits for the mpnfs in PIDFILE to exit, starts a new one
# in the foreground (detached, logging to LOG) with the same source and options,
# records its PID and waits for the mount.
REMOUNT = r"""
import os, subprocess, sys, time
mp, pidfile, log, bin_, source, opts = sys.argv[1:7]

def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

def mounted():
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == mp for line in f)

old = int(open(pidfile).read())
r = subprocess.run(["fusermount3", "-u", mp], capture_output=True, text=True)
if r.returncode != 0:
    sys.exit(f"remount: fusermount3 -u failed: {r.stderr}")
deadline = time.time() + 120
while alive(old):
    if time.time() > deadline:
        sys.exit(f"remount: mpnfs {old} still running 120 s after the unmount")
    time.sleep(0.05)
with open(log, "a") as lf:
    p = subprocess.Popen([bin_, source, mp, "-o", opts, "-f"], stdout=lf, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL, start_new_session=True)
with open(pidfile, "w") as f:
    f.write(str(p.pid))
deadline = time.time() + 60
while not mounted():
    if p.poll() is not None or time.time() > deadline:
        sys.exit("remount: the new mount did not come up; see " + log)
    time.sleep(0.05)
"""


def wait_gone(pid, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return
        except OSError:
            return
        time.sleep(0.05)
    os.kill(pid, 9)


@pytest.mark.parametrize("mode", ["default", "writeback"])
def test_fsx_with_remounts(mount_factory, cache_dir, tmp_path, mode):
    extra = f"cache_dir={cache_dir},cache_size=64M,cache_block=64,cache_mode=writeback" if mode == "writeback" else ""
    m = mount_factory(extra)
    pidfile = tmp_path / "mpnfs.pid"
    pidfile.write_text(str(m.pid))
    script = tmp_path / "remount.py"
    script.write_text(REMOUNT)
    cmd = shlex.join([sys.executable, str(script), str(m.path), str(pidfile), m.log, BIN,
                      f"{SERVER}:{EXPORT}", "mountport=20048" + ("," + extra if extra else "")])
    f = m.path / f"fsx-remount-{mode}"
    try:
        run_fsx(m, f, 9201 if mode == "default" else 9202, "--remount-cmd", cmd,
                "--remount-every", str(max(OPS // 6, 50)))
    finally:
        # The mount now is the last one the command started (not a child of this process).
        last = int(pidfile.read_text())
        if last != m.pid and is_mounted(m.path):
            subprocess.run(["fusermount3", "-u", str(m.path)], capture_output=True)
            wait_gone(last)
    assert int(pidfile.read_text()) != m.pid, "the tester never remounted"


def read_progress(p, n, timeout=300):
    """Waits for n progress lines of the tester (or its end); returns them."""
    lines = []
    deadline = time.time() + timeout
    while len(lines) < n:
        left = deadline - time.time()
        assert left > 0, f"no progress from mpnfs_fsx in {timeout} s: {lines}"
        ready, _, _ = select.select([p.stdout], [], [], left)
        if not ready:
            continue
        line = p.stdout.readline()
        if not line:
            break
        if line.startswith("mpnfs_fsx: op "):
            lines.append(line.strip())
    return lines


def test_fsx_with_a_path_down_and_up(bed, mount_factory):
    m = mount_factory(f"path={ALL_PATHS}")
    wait_all_up(m)
    every = max(OPS // 20, 10)
    p = subprocess.Popen(fsx_args(m.path / "fsx-link", 9301, "--progress", str(every)),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
    down = []
    try:
        if len(read_progress(p, 2)) == 2:
            bed.link("down", 2)
            try:
                down = read_progress(p, 5)  # a quarter of the run with the path down
            finally:
                bed.link("up", 2)
        out, err = p.communicate(timeout=TIMEOUT)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    check(p.returncode, out, err, m)
    assert len(down) == 5, f"the tester ended while the path was down: {down}"
    assert conn(m, SERVER2)["failovers"] >= 1, conn(m, SERVER2)
