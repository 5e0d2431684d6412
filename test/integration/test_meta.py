"""Metadata round trips: a small file created, written once and
closed costs one FILE_SYNC WRITE and no COMMIT, with its data on the server
when close returns; the kernel's GETATTR of a directory right after a change
made in it is answered from the change's post-operation attributes, which
match the server's."""
import os

from conftest import EXPORT
from test_stats import settle

N = 50


def ops(s):
    return {k: v["ops"] for k, v in s["ops"].items()}


def test_small_new_files_cost_one_stable_write_and_no_commit(mnt, d):
    before = settle(mnt)
    data = b"m" * 1024
    for i in range(N):
        fd = os.open(d / f"f{i}", os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
        os.write(fd, data)
        os.close(fd)
        # On the server, durable or not, once close returned.
        with open(os.path.join(EXPORT, d.name, f"f{i}"), "rb") as f:
            assert f.read() == data
    after = settle(mnt)
    b, a = ops(before), ops(after)
    delta = {k: a.get(k, 0) - b.get(k, 0) for k in a}
    assert delta.get("WRITE", 0) == N
    fsync_ops = [s["ops"].get("WRITE", {}).get("file_sync_ops", 0) for s in (before, after)]
    assert fsync_ops[1] - fsync_ops[0] == N
    assert delta.get("COMMIT", 0) == 0
    assert delta.get("CREATE", 0) == N
    # The directory's GETATTR before each lookup came from the CREATE replies
    # (a loaded machine may let the odd one age past the 1 s they are trusted).
    assert delta.get("GETATTR", 0) < N // 2, delta


def test_directory_attributes_after_changes_match_the_server(mnt, d):
    for i in range(5):
        (d / f"x{i}").write_bytes(b"x")
        os.unlink(d / f"x{i}") if i % 2 else None
        here, there = os.stat(d), os.stat(os.path.join(EXPORT, d.name))
        assert (here.st_mtime_ns, here.st_mode, here.st_nlink) == \
            (there.st_mtime_ns, there.st_mode, there.st_nlink)
    os.chmod(d, 0o700)
    (d / "y").write_bytes(b"y")
    assert os.stat(d).st_mode & 0o7777 == 0o700
    assert os.stat(d).st_mtime_ns == os.stat(os.path.join(EXPORT, d.name)).st_mtime_ns
