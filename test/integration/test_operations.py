"""Every NFSv3-backed operation through a real mount, checked against the
server's own view of the export where that matters."""
import errno
import os
import stat
import subprocess
import time

import pytest

from conftest import EXPORT


def server_path(p, mnt):
    return os.path.join(EXPORT, os.path.relpath(p, mnt.path))


def test_create_write_read_append(d, mnt):
    f = d / "a"
    f.write_bytes(b"hello")
    with open(f, "ab") as h:
        h.write(b" world")
    assert f.read_bytes() == b"hello world"
    assert open(server_path(f, mnt), "rb").read() == b"hello world"
    assert f.stat().st_size == 11


def test_mkdir_rmdir_and_nonempty(d):
    sub = d / "sub"
    sub.mkdir(0o750)
    assert stat.S_IMODE(sub.stat().st_mode) == 0o750 & ~0o022 or stat.S_ISDIR(sub.stat().st_mode)
    (sub / "x").write_text("x")
    with pytest.raises(OSError) as e:
        os.rmdir(sub)
    assert e.value.errno == errno.ENOTEMPTY
    os.unlink(sub / "x")
    os.rmdir(sub)
    assert not sub.exists()


def test_rename_including_over_an_existing_target(d):
    (d / "a").write_text("A")
    (d / "b").write_text("B")
    os.rename(d / "a", d / "b")
    assert not (d / "a").exists()
    assert (d / "b").read_text() == "A"
    (d / "dir").mkdir()
    os.rename(d / "b", d / "dir" / "c")
    assert (d / "dir" / "c").read_text() == "A"


def test_hard_link_counts_and_ctime(d):
    f = d / "f"
    f.write_text("data")
    before = os.stat(f)
    os.link(f, d / "g")
    after = os.stat(f)
    assert after.st_nlink == 2
    assert os.stat(d / "g").st_ino == after.st_ino
    assert after.st_ctime_ns >= before.st_ctime_ns
    os.unlink(d / "g")
    assert os.stat(f).st_nlink == 1
    os.link(f, d / "h")
    os.rename(d / "h", d / "i")
    assert os.stat(d / "i").st_nlink == 2


def test_symlink_readlink_and_lchown(d):
    (d / "target").write_text("t")
    os.symlink("target", d / "link")
    assert os.readlink(d / "link") == "target"
    assert (d / "link").read_text() == "t"
    os.lchown(d / "link", 1234, 1235)
    st = os.lstat(d / "link")
    assert (st.st_uid, st.st_gid) == (1234, 1235)
    t = os.stat(d / "target")
    assert (t.st_uid, t.st_gid) == (0, 0)  # the target is untouched


def test_chmod_chown_truncate(d):
    f = d / "f"
    f.write_bytes(b"x" * 10000)
    os.chmod(f, 0o640)
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o640
    os.chown(f, 4321, 4322)
    st = os.stat(f)
    assert (st.st_uid, st.st_gid) == (4321, 4322)
    os.truncate(f, 100)
    assert os.stat(f).st_size == 100
    os.truncate(f, 1 << 20)
    assert os.stat(f).st_size == 1 << 20
    assert f.read_bytes()[100:] == b"\0" * ((1 << 20) - 100)


def test_utimens_nanoseconds_now_and_omit(d):
    f = d / "f"
    f.write_text("x")
    os.utime(f, ns=(1_000_000_123, 2_000_000_456))
    st = os.stat(f)
    assert st.st_atime_ns == 1_000_000_123
    assert st.st_mtime_ns == 2_000_000_456
    # UTIME_OMIT for atime, UTIME_NOW for mtime, through touch(1).
    subprocess.run(["touch", "-m", str(f)], check=True)
    st2 = os.stat(f)
    assert st2.st_atime_ns == 1_000_000_123
    assert st2.st_mtime_ns > 2_000_000_456


def test_times_beyond_nfsv3_range_are_refused(d):
    f = d / "f"
    f.write_text("x")
    with pytest.raises(OSError) as e:
        os.utime(f, (1 << 33, 1 << 33))
    assert e.value.errno == errno.EOVERFLOW


def test_mknod_fifo_and_socket(d):
    os.mkfifo(d / "fifo", 0o600)
    assert stat.S_ISFIFO(os.stat(d / "fifo").st_mode)
    os.mknod(d / "sock", 0o600 | stat.S_IFSOCK)
    assert stat.S_ISSOCK(os.stat(d / "sock").st_mode)
    os.mknod(d / "chr", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    st = os.stat(d / "chr")
    assert stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) == 1 and os.minor(st.st_rdev) == 3


def test_name_length_limit_is_255_bytes(d):
    ok = "n" * 255
    (d / ok).write_text("x")
    assert ok in os.listdir(d)
    with pytest.raises(OSError) as e:
        (d / ("n" * 256)).write_text("x")
    assert e.value.errno == errno.ENAMETOOLONG


def test_exclusive_create(d):
    fd = os.open(d / "x", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o604)
    os.write(fd, b"1")
    os.close(fd)
    assert stat.S_IMODE(os.stat(d / "x").st_mode) == 0o604
    with pytest.raises(FileExistsError):
        os.open(d / "x", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)


def test_unlink_open_file_keeps_data_readable(d):
    f = d / "f"
    f.write_bytes(b"abc")
    with open(f, "rb") as h:
        os.unlink(f)
        assert not f.exists()
        assert h.read() == b"abc"
        assert [n for n in os.listdir(d) if n.startswith(".mpnfs")]  # hidden while open
    deadline = time.time() + 10  # RELEASE (and the removal) follows close asynchronously
    while [n for n in os.listdir(d) if n.startswith(".mpnfs")]:
        assert time.time() < deadline, os.listdir(d)
        time.sleep(0.05)


def test_statfs_and_df(mnt):
    s = os.statvfs(mnt.path)
    assert s.f_blocks > 0 and s.f_namemax == 255
    out = subprocess.run(["df", "-T", str(mnt.path)], capture_output=True, text=True, check=True)
    assert "fuse.mpnfs" in out.stdout


def test_access_and_xattrs(d):
    f = d / "f"
    f.write_text("x")
    assert os.access(f, os.R_OK | os.W_OK)
    assert not os.access(d / "missing", os.F_OK)
    with pytest.raises(OSError) as e:
        os.setxattr(f, "user.k", b"v")
    assert e.value.errno == errno.EOPNOTSUPP


def test_readdir_of_10k_entries(d):
    for i in range(10000):
        os.close(os.open(d / f"e{i:05d}", os.O_CREAT | os.O_WRONLY, 0o644))
    names = os.listdir(d)
    assert len(names) == 10000
    assert len(set(names)) == 10000
    # readdirplus path: ls -l stats every entry.
    out = subprocess.run(["ls", "-l", str(d)], capture_output=True, text=True, check=True)
    assert out.stdout.count("\n") == 10001


def test_large_offsets_beyond_4gib(d, mnt):
    f = d / "sparse"
    with open(f, "wb") as h:
        h.seek(5 << 30)
        h.write(b"tail-marker")
    assert os.stat(f).st_size == (5 << 30) + 11
    with open(f, "rb") as h:
        h.seek(5 << 30)
        assert h.read() == b"tail-marker"
    assert os.stat(server_path(f, mnt)).st_size == (5 << 30) + 11


def test_mmap_and_executing_from_the_mount(d):
    exe = d / "script.sh"
    exe.write_text("#!/bin/sh\necho ran-from-mpnfs\n")
    os.chmod(exe, 0o755)
    assert subprocess.run([str(exe)], capture_output=True, text=True).stdout == "ran-from-mpnfs\n"
    import mmap
    with open(d / "m", "w+b") as h:
        h.write(b"0123456789")
        h.flush()
        mm = mmap.mmap(h.fileno(), 10)
        assert mm[2:5] == b"234"
        mm.close()
