"""What a file's metadata says right after the calls that set it, in every
cache mode, on one path and on four: times set by tar, cp -p and rsync -a
(futimens on the still-open descriptor right after its writes, utimensat after
close) are the ones the server keeps; a write by another user that clears
setuid/setgid shows at once; a file removed while open leaves no hidden name
once its last close has returned."""
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile

import pytest

from conftest import ALL_PATHS, EXPORT
from test_writeback import free_export  # noqa: F401 (autouse: frees the export after write-back tests)

MODES = ["nocache", "readonly", "writethrough", "writeback"]
PATHS = ["1path", "4paths"]
U2 = 20002
# Whole seconds: tar archives keep no more (the futimens test sets nanoseconds).
BASE_NS = 1_000_000_000 * 1_000_000_000  # 2001-09-09


def opts(mode, paths, cache, extra=""):
    o = []
    if paths == "4paths":
        o.append(f"path={ALL_PATHS}")
    if mode != "nocache":
        o.append(f"cache_dir={cache},cache_mode={mode},cache_size=64M,cache_block=64")
        if mode == "writeback":
            o.append("dirty_age=600")
    if extra:
        o.append(extra)
    return ",".join(o)


@pytest.fixture(params=[(m, p) for m in MODES for p in PATHS], ids=lambda mp: f"{mp[0]}-{mp[1]}")
def gw(request, mount_factory, tmp_path):
    """A mount in one cache mode over one or four paths, and a directory of
    this test's in it (named after the test, also found under EXPORT)."""
    mode, paths = request.param
    cache = tmp_path / "cache"
    cache.mkdir()
    m = mount_factory(opts(mode, paths, cache, "allow_other"))
    name = request.node.name.replace("[", "_").replace("]", "")
    d = m.path / name
    d.mkdir()
    os.chmod(d, 0o777)
    return m, d, pathlib.Path(EXPORT) / name


def source_tree(root, n=30):
    """n files of sizes from empty to 300 KiB (small ones go FILE_SYNC, large
    ones UNSTABLE in several WRITEs), each with its own mode and mtime."""
    root.mkdir()
    want = {}
    for i in range(n):
        f = root / f"f{i:02d}"
        f.write_bytes(os.urandom([0, 1, 700, 5000, 70_000, 300_000][i % 6] + i))
        mode = [0o644, 0o600, 0o755, 0o640, 0o444][i % 5]
        os.chmod(f, mode)
        mtime = BASE_NS + i * 1_000_000_000
        os.utime(f, ns=(BASE_NS - 5_000_000_000, mtime))
        want[f.name] = (mode, mtime, f.read_bytes())
    return want


def check_tree(where, want, label):
    wrong = []
    for name, (mode, mtime, data) in want.items():
        st = os.stat(where / name)
        if st.st_mtime_ns != mtime or (st.st_mode & 0o7777) != mode or st.st_size != len(data):
            wrong.append(f"{name}: mtime {st.st_mtime_ns} (want {mtime}), mode {st.st_mode & 0o7777:o} "
                         f"(want {mode:o}), size {st.st_size} (want {len(data)})")
    assert not wrong, f"{label}: {len(wrong)} of {len(want)} files differ:\n" + "\n".join(wrong[:8])
    for name, (_, _, data) in want.items():
        assert (where / name).read_bytes() == data, f"{label}: {name}'s data"


def test_tar_cp_and_rsync_keep_the_sources_times_and_modes(gw, tmp_path):
    m, d, server = gw
    want = source_tree(tmp_path / "src")
    archive = tmp_path / "a.tar"
    with tarfile.open(archive, "w") as t:
        t.add(tmp_path / "src", arcname="t")
    # GNU tar: each file's writes, then futimens on the still-open descriptor.
    subprocess.run(["tar", "xf", str(archive), "-C", str(d)], check=True)
    # cp -p: writes, close, then times, owner and mode by path.
    subprocess.run(["cp", "-rp", str(tmp_path / "src"), str(d / "c")], check=True)
    # rsync -a: a temporary name, writes, times and mode, then a rename.
    subprocess.run(["rsync", "-a", str(tmp_path / "src") + "/", str(d / "r")], check=True)
    for sub in ("t", "c", "r"):
        check_tree(d / sub, want, f"{sub} on the mount")
    # The server holds the same, once this mount's cached writes are there.
    m.unmount()
    for sub in ("t", "c", "r"):
        check_tree(server / sub, want, f"{sub} on the server")


def test_futimens_right_after_writes_is_what_the_server_keeps(gw):
    """The rule under tar x: times set on the open descriptor right after its
    writes stand, however many writes are still on their way; and so do the
    times set after a close whose data is still in the cache."""
    m, d, server = gw
    for i in range(10):
        f = d / f"g{i}"
        mtime = BASE_NS + i * 7_000_000_001 + 123_456_789
        fd = os.open(f, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            for k in range(8):
                os.pwrite(fd, os.urandom(256 << 10), k * (256 << 10))
            os.utime(fd, ns=(mtime, mtime))
        finally:
            os.close(fd)
        assert os.stat(f).st_mtime_ns == mtime, f"g{i} on the mount"
        # After close, through the path.
        os.utime(f, ns=(mtime + 1, mtime + 2))
        assert os.stat(f).st_mtime_ns == mtime + 2, f"g{i} on the mount, after close"
    m.unmount()
    for i in range(10):
        mtime = BASE_NS + i * 7_000_000_001 + 123_456_789
        assert os.stat(server / f"g{i}").st_mtime_ns == mtime + 2, f"g{i} on the server"


@pytest.mark.parametrize("bits", [0o6777, 0o4755, 0o2775], ids=lambda b: f"{b:o}")
def test_a_non_owners_write_shows_setuid_and_setgid_cleared_at_once(gw, bits):
    m, d, server = gw
    f = d / f"prog-{bits:o}"
    f.write_bytes(b"\0" * 8192)
    os.chmod(f, 0o666 | bits)
    assert os.stat(f).st_mode & 0o7777 == 0o666 | bits
    # Another user writes: the server clears both bits when it takes the write
    # (Linux keeps setgid without group execute, not set here), and so does a
    # local filesystem, before write() returns. stat(1) asks for the mode
    # alone (statx STATX_MODE): the kernel answers from its attributes unless
    # told that they changed.
    mode_of = ["stat", "-c", "%a", str(f)]
    script = (f"import os, subprocess, sys; fd = os.open({str(f)!r}, os.O_WRONLY | os.O_APPEND); "
              f"os.write(fd, b'u' * 100); subprocess.run({mode_of!r}); sys.stdout.flush(); "
              f"sys.stdin.read(); os.close(fd)")
    p = subprocess.Popen(["setpriv", f"--reuid={U2}", f"--regid={U2}", "--clear-groups", sys.executable, "-c",
                          script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    seen_by_writer = p.stdout.readline().strip()
    seen_by_root = subprocess.run(mode_of, capture_output=True, text=True).stdout.strip()  # (still open)
    p.stdin.close()
    assert p.wait(timeout=30) == 0, p.stderr.read()
    want = 0o666 | (bits & 0o777)
    assert seen_by_writer == f"{want:o}", "stat by the writer right after its write"
    assert seen_by_root == f"{want:o}", "stat by root right after the write"
    assert subprocess.run(mode_of, capture_output=True, text=True).stdout.strip() == f"{want:o}"
    assert os.stat(f).st_mode & 0o7777 == want
    assert os.stat(server / f.name).st_mode & 0o7777 == want
    assert f.read_bytes() == b"\0" * 8192 + b"u" * 100


def test_no_hidden_name_is_left_once_the_last_close_returns(gw):
    """unlink while open, write, close: the hidden name the removal left is
    gone when close() returns (as with the kernel NFS client), so a listing
    shows nothing and rmdir succeeds."""
    m, d, server = gw
    for i in range(20):
        sub = d / f"r{i}"
        sub.mkdir()
        f = sub / "f"
        fd = os.open(f, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.write(fd, b"before")
            os.unlink(f)
            hidden = os.listdir(sub)
            assert len(hidden) == 1 and hidden[0].startswith(".mpnfs"), hidden
            os.pwrite(fd, os.urandom(100_000), 0)
            assert os.pread(fd, 6, 100_000) == b""
        finally:
            os.close(fd)
        assert os.listdir(sub) == [], f"round {i}: listed right after the last close"
        os.rmdir(sub)  # ENOTEMPTY if the hidden name is still there
    assert os.listdir(d) == []
    assert os.listdir(server) == []
