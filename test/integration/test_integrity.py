"""Integrity rules that users rely on without knowing it: write order,
O_TRUNC at open, permission checks on cached path walks. Each test is a case
users meet, on a default mount."""
import errno
import os
import stat
import subprocess
import time

import pytest

from conftest import ALL_PATHS

U1, U2 = 20001, 20002

REWRITER = r"""
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o644)
for i in range(int(sys.argv[2])):
    os.pwrite(fd, bytes([i % 251 + 1]) * (1 << 20), 0)
os.close(fd)
"""


def as_user(uid, *cmd):
    return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *cmd],
                          capture_output=True, text=True)


@pytest.mark.parametrize("paths", ["1path", "4paths"])
def test_overlapping_rewrites_reach_the_server_in_order(mount_factory, request, paths):
    """64 rewrites of the same 1 MiB on one fd, no fsync, then close: the
    server holds the last one (write-behind WRITEs of one range must not
    overtake each other, on one connection or several)."""
    opts = f"path={ALL_PATHS}" if paths == "4paths" else ""
    m = mount_factory(opts)
    check = mount_factory()  # a second client: reads what the server holds
    d = m.path / request.node.name.replace("[", "_").replace("]", "")
    d.mkdir()
    rounds = 64
    want = bytes([(rounds - 1) % 251 + 1]) * (1 << 20)
    for trial in range(8):
        f = d / f"f{trial}"
        subprocess.run(["python3", "-c", REWRITER, str(f), str(rounds)], check=True)
        got = (check.path / f.relative_to(m.path)).read_bytes()
        assert len(got) == len(want), f"trial {trial}: size {len(got)}"
        if got != want:
            first = next(i for i in range(len(got)) if got[i] != want[i])
            pytest.fail(f"trial {trial}: byte {first} holds version {got[first] - 1}, "
                        f"not the last ({rounds - 1})")


def test_open_trunc_truncates_an_existing_file(d):
    f = d / "f"
    f.write_text("a long line of old text\n")
    before = os.stat(f)
    time.sleep(0.01)
    with open(f, "w") as fh:  # O_WRONLY|O_CREAT|O_TRUNC on an existing file
        fh.write("x\n")
    assert f.read_text() == "x\n"
    st = os.stat(f)
    assert st.st_size == 2
    assert st.st_mtime_ns > before.st_mtime_ns
    # O_TRUNC without writing anything leaves it empty.
    fd = os.open(f, os.O_WRONLY | os.O_TRUNC)
    os.close(fd)
    assert os.stat(f).st_size == 0
    assert f.read_bytes() == b""


def test_open_trunc_drops_data_from_the_ssd_cache(mount_factory, tmp_path, request):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    m = mount_factory(f"cache_dir={cache},cache_size=64M,cache_mode=writethrough")
    f = m.path / (request.node.name + ".dat")
    f.write_bytes(os.urandom(256 << 10))
    f.read_bytes()  # in the SSD cache now
    with open(f, "wb") as fh:  # O_TRUNC
        fh.write(b"new")
    fd = os.open(f, os.O_RDONLY | os.O_DIRECT)
    try:
        assert os.pread(fd, 4096, 0) == b"new"
        assert os.pread(fd, 4096, 65536) == b""
    finally:
        os.close(fd)


def test_private_directory_stays_private_while_its_entries_are_cached(shared):
    """User A makes ~/private 0700 with a 0644 file inside and reads it; user
    B, within the entry timeout, must not read the file by its path."""
    home = shared / "a"
    assert as_user(U1, "mkdir", "-m", "0755", str(home)).returncode == 0
    priv = home / "private"
    f = priv / "notes"
    r = as_user(U1, "sh", "-c", f"mkdir -m 0700 {priv} && echo secret > {f} && chmod 0644 {f} "
                                f"&& cat {f}")
    assert r.returncode == 0 and r.stdout == "secret\n", r.stderr
    r = as_user(U2, "cat", str(f))
    assert r.returncode != 0 and "Permission denied" in r.stderr, r.stdout
    r = as_user(U2, "stat", str(f))
    assert r.returncode != 0, r.stdout
    # Open to the owner still, and to another user once A allows search.
    assert as_user(U1, "chmod", "0711", str(priv)).returncode == 0
    assert as_user(U2, "cat", str(f)).stdout == "secret\n"


def test_permission_denials_match_a_local_filesystem(shared):
    """The denials pjdfstest checks (open/truncate/chmod/chown/link by a
    user without the right), with the errno a local filesystem returns."""
    f = shared / "f"
    assert as_user(U1, "sh", "-c", f"echo data > {f} && chmod 0644 {f}").returncode == 0
    py = "import os,sys,errno\ntry:\n    {}\nexcept OSError as e:\n    print(errno.errorcode[e.errno]); sys.exit(1)\nprint('ok')"

    def u2(stmt):
        r = as_user(U2, "/usr/bin/python3", "-c", py.format(stmt))
        assert not r.stderr, r.stderr
        return r.stdout.strip()

    assert u2(f"os.open('{f}', os.O_WRONLY)") == "EACCES"
    assert u2(f"os.open('{f}', os.O_RDONLY | os.O_TRUNC)") == "EACCES"
    assert u2(f"os.truncate('{f}', 0)") == "EACCES"
    assert u2(f"os.chmod('{f}', 0o777)") == "EPERM"
    assert u2(f"os.chown('{f}', {U2}, -1)") == "EPERM"
    nosearch = shared / "nosearch"
    assert as_user(U1, "mkdir", "-m", "0700", str(nosearch)).returncode == 0
    assert u2(f"os.link('{f}', '{nosearch}/l')") == "EACCES"
    assert u2(f"os.stat('{nosearch}/x')") == "EACCES"
    assert os.stat(f).st_size == 5 and stat.S_IMODE(os.stat(f).st_mode) == 0o644


def test_fstat_after_unlink_reports_no_links(d):
    f = d / "f"
    f.write_text("x")
    with open(f, "rb") as fh:
        assert os.fstat(fh.fileno()).st_nlink == 1
        f.unlink()
        assert os.fstat(fh.fileno()).st_nlink == 0
        assert fh.read() == b"x"


def test_rename_over_an_open_file_keeps_it_readable(d):
    old, new = d / "old", d / "new"
    old.write_text("old data")
    new.write_text("new data")
    with open(old, "rb") as fh:
        os.rename(new, old)  # replaces the file open here
        assert fh.read() == b"old data"
        assert os.fstat(fh.fileno()).st_nlink == 0
    assert old.read_text() == "new data"
    # The hidden name goes at the last close; the kernel sends that RELEASE
    # after close(2) returns.
    deadline = time.time() + 10
    while sorted(p.name for p in d.iterdir()) != ["old"] and time.time() < deadline:
        time.sleep(0.05)
    assert sorted(p.name for p in d.iterdir()) == ["old"]


def test_rename_onto_itself_through_a_hard_link_keeps_the_file(d):
    a, b = d / "a", d / "b"
    a.write_text("same")
    os.link(a, b)
    with open(a, "rb") as fh:
        os.rename(a, b)  # same file: nothing happens (POSIX)
        assert fh.read() == b"same"
    assert b.read_text() == "same"


def test_a_symlink_target_of_4095_bytes_round_trips(d):
    """Linux allows symlink targets of 4,095 bytes (pjdfstest symlink/03.t).
    libnfs 4.0's transport encoded a call into 4 KiB, so mpnfs refused
    targets over about 3,900 bytes with ENAMETOOLONG; its own transport
    sends them."""
    target = "t/" * 2047 + "x"
    assert len(target) == 4095
    os.symlink(target, d / "long")
    assert os.readlink(d / "long") == target


@pytest.mark.parametrize("how", ["o_direct_open", "direct_io_mount"])
@pytest.mark.parametrize("rwf", ["RWF_DSYNC", "RWF_SYNC"])
def test_a_rwf_dsync_write_through_direct_io_is_file_sync_when_it_returns(mount_factory, how, rwf):
    # pwritev2(RWF_DSYNC) on a file opened O_DIRECT without O_DSYNC (or on
    # a direct_io mount): the kernel sends no FSYNC after such a write, so
    # the WRITE's own O_DSYNC is all that says it must be durable when it
    # returns (QEMU and io_uring users write so).
    from test_stats import settle
    import mmap
    m = mount_factory("direct_io") if how == "direct_io_mount" else mount_factory()
    f = m.path / f"rwf-{how}-{rwf}"
    f.write_bytes(b"\0" * 8192)
    buf = mmap.mmap(-1, 4096)  # page-aligned, as O_DIRECT wants
    buf.write(b"d" * 4096)
    fd = os.open(f, os.O_WRONLY | (os.O_DIRECT if how == "o_direct_open" else 0))
    try:
        def write_ops(flags):
            before = settle(m)["ops"].get("WRITE", {})
            assert os.pwritev(fd, [buf], 0, flags) == 4096
            after = settle(m)["ops"]["WRITE"]
            return {k: after.get(k, 0) - before.get(k, 0)
                    for k in ("ops", "unstable_ops", "file_sync_ops")}
        assert write_ops(getattr(os, rwf)) == {"ops": 1, "unstable_ops": 0, "file_sync_ops": 1}
        # The flag was that write's: the next plain one is UNSTABLE.
        assert write_ops(0) == {"ops": 1, "unstable_ops": 1, "file_sync_ops": 0}
    finally:
        os.close(fd)
