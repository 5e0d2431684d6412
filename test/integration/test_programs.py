"""Real programs with real access patterns: git (many small files, renames,
fsync, readdir while another thread closes the directory) and SQLite
(journal, fsync, locks local to the mount)."""
import sqlite3
import subprocess

from conftest import ROOT


def test_git_clone_fsck_and_remove(d):
    for i in range(3):
        dst = d / f"clone{i}"
        r = subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(dst)],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        r = subprocess.run(["git", "-C", str(dst), "fsck", "--full"], capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stderr
        r = subprocess.run(["git", "-C", str(dst), "status", "--porcelain"],
                           capture_output=True, text=True)
        assert r.returncode == 0 and r.stdout == "", r.stdout + r.stderr
        assert subprocess.run(["rm", "-rf", str(dst)]).returncode == 0
        assert not dst.exists()


def test_sqlite_transactions_and_integrity(d):
    db = sqlite3.connect(d / "t.db")
    db.execute("create table t(i integer primary key, v text)")
    for _ in range(50):
        with db:
            db.executemany("insert into t(v) values (?)", [("x" * 200,)] * 100)
    assert db.execute("pragma integrity_check").fetchone() == ("ok",)
    assert db.execute("select count(*) from t").fetchone() == (5000,)
    db.close()
    again = sqlite3.connect(d / "t.db")
    assert again.execute("select count(*) from t").fetchone() == (5000,)
    again.close()
