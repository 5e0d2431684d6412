"""Real programs with real access patterns, on a default mount and through the
SSD cache: git (many small files, renames, fsync, readdir while another thread
closes the directory), SQLite (journal, fsync, locks local to the mount) and
fio's verify. The write-back cache is small (16 MiB in 64 KiB blocks), caches
sequential I/O too and flushes after 1 s, so that copies, evictions, flushes
and a full cache happen while the programs run. Each program checks its data
through the mount, and then, after the unmount (which flushes), on the
server's own copy. Then SQLite is killed in the middle of its transactions
with the gateway (kill -9): every commit it was told of survives, the one in
flight is there whole or not at all, and the database is sound."""
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from conftest import EXPORT, ROOT, is_mounted

# Clones made one after the other (each but the last removed): the sanitizer
# passes make 2, which still fill and evict the 16 MiB cache and remove a tree.
CLONES = int(os.environ.get("MPNFS_IT_GIT_CLONES", "3"))
from test_cache import cache_stats
from test_writeback import free_export  # noqa: F401  (a failing write-back test frees the export)

MODES = {
    "default": "",
    "writethrough": "cache_dir={cache},cache_size=16M,cache_block=64,seq_cutoff=0,cache_mode=writethrough",
    "writeback": "cache_dir={cache},cache_size=16M,cache_block=64,seq_cutoff=0,cache_mode=writeback,"
                 "dirty_age=1",
}


class Work:
    """A fresh directory on a mount of one mode; `server` is the same directory
    in the export, as the server has it."""

    def __init__(self, mount, mode, name):
        self.mount, self.mode = mount, mode
        self.d = mount.path / name
        self.server = os.path.join(EXPORT, name)
        self.d.mkdir()

    def cache_took_writes(self):
        """Through a cache, the program's writes reached it (and in write-back,
        some were flushed while it ran: dirty_age=1)."""
        if self.mode == "default":
            return
        time.sleep(2)
        st = cache_stats(self.mount)
        assert st["writes"] > 0 and st["mode"] == self.mode, st
        if self.mode == "writeback":
            assert st["flushed_bytes"] > 0, st

    def unmount(self):
        """Unmounts (write-back: flushes); the server's copy is complete then."""
        self.mount.unmount()
        assert not is_mounted(self.mount.path)


@pytest.fixture(params=list(MODES))
def md(request, mount_factory, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    m = mount_factory(MODES[request.param].format(cache=cache))
    w = Work(m, request.param, request.node.name.replace("[", "_").replace("]", ""))
    yield w
    shutil.rmtree(w.server, ignore_errors=True)  # (the server's copy, once checked)


def test_git_clone_fsck_and_remove(md):
    last = CLONES - 1
    for i in range(CLONES):
        dst = md.d / f"clone{i}"
        r = subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(dst)],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        r = subprocess.run(["git", "-C", str(dst), "fsck", "--full"], capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stderr
        r = subprocess.run(["git", "-C", str(dst), "status", "--porcelain"],
                           capture_output=True, text=True)
        assert r.returncode == 0 and r.stdout == "", r.stdout + r.stderr
        if i == last:
            break  # (the last clone stays, for the server-side check)
        assert subprocess.run(["rm", "-rf", str(dst)]).returncode == 0
        assert not dst.exists()
    md.cache_took_writes()
    md.unmount()
    on_server = os.path.join(md.server, f"clone{last}")
    r = subprocess.run(["git", "-c", f"safe.directory={on_server}", "-C", on_server, "fsck", "--full"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(md.server)) == [f"clone{last}"]


def test_sqlite_transactions_and_integrity(md):
    db = sqlite3.connect(md.d / "t.db")
    db.execute("create table t(i integer primary key, v text)")
    for _ in range(50):
        with db:
            db.executemany("insert into t(v) values (?)", [("x" * 200,)] * 100)
    assert db.execute("pragma integrity_check").fetchone() == ("ok",)
    assert db.execute("select count(*) from t").fetchone() == (5000,)
    db.close()
    again = sqlite3.connect(md.d / "t.db")
    assert again.execute("select count(*) from t").fetchone() == (5000,)
    again.close()
    md.cache_took_writes()
    md.unmount()
    on_server = sqlite3.connect(f"file:{md.server}/t.db?mode=ro", uri=True)
    assert on_server.execute("pragma integrity_check").fetchone() == ("ok",)
    assert on_server.execute("select count(*) from t").fetchone() == (5000,)
    on_server.close()


FIO = ["fio", "--name=v", "--size=64M", "--bs=4k", "--rw=randwrite", "--direct=1",
       "--ioengine=libaio", "--iodepth=32", "--numjobs=2", "--verify=crc32c", "--verify_fatal=1",
       "--group_reporting"]


def test_fio_random_write_verify(md, tmp_path):
    # (128 MiB against a 16 MiB cache: in write-back it fills, and writes go
    # around it while the flusher empties it.) cwd: fio's verify state files.
    r = subprocess.run(FIO + [f"--directory={md.d}", "--do_verify=1"], capture_output=True, text=True,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verify: bad" not in r.stdout
    md.cache_took_writes()
    if md.mode == "writeback":
        st = cache_stats(md.mount)
        assert st["writes_around"] > 0 and st["evictions"] > 0, st
    md.unmount()
    # The same verification of the server's copy.
    r = subprocess.run(FIO + [f"--directory={md.server}", "--verify_only", "--direct=0"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verify: bad" not in r.stdout


# Transactions of 20 rows that also update earlier rows (the pages are
# rewritten), one line printed per commit once it returned.
WRITER = r"""
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("pragma synchronous=full")
db.execute("create table if not exists t(i integer primary key, v text)")
n = 0
try:
    while True:
        db.execute("begin")
        db.executemany("insert into t(i, v) values (?, ?)",
                       [(n * 20 + k, f"{n}-{k}-" + "y" * 300) for k in range(20)])
        db.execute("update t set v = v || '+' where i % 97 = ?", (n % 97,))
        db.execute("commit")
        n += 1
        print(n, flush=True)
except Exception as e:
    print("stopped:", e, file=sys.stderr, flush=True)
"""


@pytest.mark.parametrize("mode", ["default", "writeback"])
def test_sqlite_survives_the_gateway_killed_mid_transaction(mount_factory, tmp_path, mode):
    cache = tmp_path / "cache"
    cache.mkdir()
    opts = MODES[mode].format(cache=cache)
    m = mount_factory(opts)
    db = m.path / f"killed-{mode}.db"
    log = tmp_path / "commits"
    with open(log, "w") as lf:
        w = subprocess.Popen([sys.executable, "-c", WRITER, str(db)], stdout=lf, stderr=subprocess.PIPE)
        try:
            deadline = time.time() + 60
            while time.time() < deadline and len(log.read_text().split()) < 300:
                time.sleep(0.05)
            m.proc.send_signal(signal.SIGKILL)
            m.proc.wait(timeout=10)
            w.wait(timeout=60)
        finally:
            w.kill()
    subprocess.run(["umount", "-l", str(m.path)], capture_output=True)
    assert not is_mounted(m.path)
    commits = len(log.read_text().split())
    assert commits >= 300, (commits, w.stderr.read())

    def check(conn):
        assert conn.execute("pragma integrity_check").fetchone() == ("ok",)
        rows = conn.execute("select i, v from t order by i").fetchall()
        # Every commit that returned is there; a commit in progress at the
        # kill is there whole or not at all: its inserts and its update.
        assert len(rows) % 20 == 0 and commits * 20 <= len(rows) <= (commits + 1) * 20, (len(rows), commits)
        n = len(rows) // 20
        for i, v in rows:
            t, k = divmod(i, 20)
            pluses = sum(1 for x in range(t, n) if x % 97 == i % 97)
            assert v == f"{t}-{k}-" + "y" * 300 + "+" * pluses, (i, v[-20:], pluses)
        conn.close()

    m2 = mount_factory(opts)  # (write-back: the cache's own mount flushes what it kept)
    if mode == "writeback":
        assert "left by an earlier mount" in m2.log_text(), m2.log_text()
    check(sqlite3.connect(m2.path / db.name))
    m2.unmount()
    check(sqlite3.connect(f"file:{os.path.join(EXPORT, db.name)}?mode=ro", uri=True))
    for leftover in (db.name, db.name + "-journal"):
        if os.path.exists(os.path.join(EXPORT, leftover)):
            os.remove(os.path.join(EXPORT, leftover))
