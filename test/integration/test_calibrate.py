"""`mpnfsctl calibrate` (each path measured alone, then all together, on a
scratch file the gateway creates and removes) and the progress that
`mpnfsctl cache flush` shows on a terminal."""
import json
import os
import pty
import re
import signal
import subprocess
import time

from conftest import EXPORT, SERVER, SERVER2
from test_cache import CTL
from test_multipath import wait_all_up
from test_writeback import cache_dir, file_with_dirty_pieces, wb_opts  # noqa: F401 (fixture)


def scratch_files(m):
    """Scratch files, seen through the mount and on the server."""
    seen = [n for n in os.listdir(m.path) if n.startswith(".mpnfs-calibrate")]
    return seen + [n for n in os.listdir(EXPORT) if n.startswith(".mpnfs-calibrate")]


def run_on_tty(args, timeout=120):
    """Runs `args` with a terminal as stdout; returns (exit code, what it printed)."""
    master, slave = pty.openpty()
    p = subprocess.Popen(args, stdout=slave, stderr=subprocess.STDOUT)
    os.close(slave)
    out = b""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the other side is closed
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    return p.wait(timeout=30), out.decode(errors="replace")


def test_calibrate_measures_each_path_alone_and_together_and_applies_the_weights(bed, mount_factory):
    m = mount_factory(f"path={SERVER}+{SERVER2}")
    wait_all_up(m)  # a path not up yet would not be measured (and --apply would refuse)
    bed.shape(2, "20mbit")
    try:
        r = subprocess.run([CTL, "calibrate", str(m.path), "--size", "32M", "--time", "0.5",
                            "--json", "--apply"], capture_output=True, text=True, timeout=180)
    finally:
        bed.shape(2, "off")
    assert r.returncode == 0, r.stderr
    assert "progress" not in r.stdout  # no progress lines off a terminal
    doc = json.loads(r.stdout)
    by = {t["path"]: t for t in doc["targets"]}
    assert sorted(by) == sorted([SERVER, SERVER2, "all"])
    for t in by.values():
        assert t["seq_read_mbs"] > 0 and t["seq_write_mbs"] > 0, t
        for kind in ("rand_read", "rand_write"):
            assert t[kind]["best_iops"] > 0, t
            assert t[kind]["sweep"][0]["depth"] == 1, t
            assert t[kind]["sweep"][0]["latency_p99_us"] >= t[kind]["sweep"][0]["latency_mean_us"] > 0
    # The path shaped to 20 mbit (2.5 MB/s) is the slower one: each path was measured alone.
    assert by[SERVER2]["seq_read_mbs"] < by[SERVER]["seq_read_mbs"], doc
    assert by[SERVER2]["seq_write_mbs"] < by[SERVER]["seq_write_mbs"], doc
    assert by[SERVER2]["seq_read_mbs"] < 3.5, doc
    # Paths of such different speeds: path= and weight= are suggested, the
    # slower path 10, the other in proportion to the measured MB/s (at most
    # 1000; the JSON's MB/s are rounded, so give or take a little).
    assert doc["suggested_paths"] == f"{SERVER}+{SERVER2}", doc
    w1, w2 = (int(w) for w in doc["suggested_weight"].split("+"))
    mean = {p: (by[p]["seq_read_mbs"] + by[p]["seq_write_mbs"]) / 2 for p in (SERVER, SERVER2)}
    assert w2 == 10, doc
    assert abs(w1 - min(1000, 10 * mean[SERVER] / mean[SERVER2])) <= max(2, w1 * 0.05), doc
    assert not scratch_files(m)
    # --apply: the mount balances by the suggestion from now on.
    assert doc["applied"] == [f"path {SERVER}:2049 weight {w1} (was 1): new calls are balanced by it",
                              f"path {SERVER2}:2049 weight 10 (was 1): new calls are balanced by it"], doc
    r = subprocess.run([CTL, "path", "list", str(m.path)], capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, r.stderr
    head, *rows = [line.split() for line in r.stdout.splitlines()]
    weights = {row[0].rsplit(":", 1)[0]: row[head.index("WEIGHT")] for row in rows}
    assert weights == {SERVER: str(w1), SERVER2: "10"}, r.stdout


def test_calibrate_table_and_one_path(bed, mount_factory):
    m = mount_factory(f"path={SERVER}+{SERVER2}")
    # Steps of 1 s: longer than the 0.5 s between progress reports, so each
    # step reports (a shorter step would show only the start line).
    rc, out = run_on_tty([CTL, "calibrate", str(m.path), "--size", "16M", "--time", "1",
                          "--path", SERVER2])
    assert rc == 0, out
    # A step's progress, rendered and rewritten in place (the tty wraps long
    # lines with "\r\n": joined again).
    assert re.search(r"\rcalibrate: rand(read|write) path \S+ depth \d+: [\d.]+ IOPS",
                     out.replace("\r\n", "")), out
    rows = [line for line in out.split("\n") if line.startswith(SERVER2) or line.startswith("all")]
    assert len(rows) == 1 and rows[0].startswith(SERVER2), out  # --path: that path only
    assert "READ_IOPS" in out and "SEQ_WR_MB/s" in out
    assert not scratch_files(m)
    r = subprocess.run([CTL, "calibrate", str(m.path), "--path", "10.9.9.9"], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 1 and "no path 10.9.9.9" in r.stderr
    r = subprocess.run([CTL, "calibrate", str(m.path), "--path", f"{SERVER2}:1"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and f"no path {SERVER2}:1" in r.stderr  # HOST:PORT matches the port
    r = subprocess.run([CTL, "calibrate", str(m.path), "--path", SERVER2, "--apply"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "--apply sets the weights from every path's speed: not with --path" in r.stderr
    assert not scratch_files(m)


def test_calibrate_interrupted_leaves_nothing_behind(bed, mount_factory):
    m = mount_factory()
    # Steps of 10 s: the whole run would take minutes; the file must go at once.
    # SIGINT as at a terminal: the test may run where it is ignored (a
    # background job of a non-interactive shell), which the child inherits.
    p = subprocess.Popen([CTL, "calibrate", str(m.path), "--size", "64M", "--time", "10"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 30
    while not scratch_files(m):
        assert p.poll() is None and time.time() < deadline, "no scratch file appeared"
        time.sleep(0.1)
    time.sleep(1)
    p.send_signal(signal.SIGINT)
    p.wait(timeout=10)
    deadline = time.time() + 8
    while scratch_files(m):
        assert time.time() < deadline, f"left behind: {scratch_files(m)}"
        time.sleep(0.2)
    # The gateway is fine afterwards.
    assert subprocess.run([CTL, "stats", str(m.path)], capture_output=True, timeout=10).returncode == 0


def test_an_unmount_during_calibrate_removes_its_scratch_file(bed, mount_factory):
    m = mount_factory()
    p = subprocess.Popen([CTL, "calibrate", str(m.path), "--size", "64M", "--time", "10"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 30
        while not scratch_files(m):
            assert p.poll() is None and time.time() < deadline, "no scratch file appeared"
            time.sleep(0.1)
        m.unmount()
        assert m.proc.returncode == 0
        left = [n for n in os.listdir(EXPORT) if n.startswith(".mpnfs-calibrate")]
        assert not left, f"left behind by the unmount: {left}"
        p.wait(timeout=10)
        assert p.returncode != 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_calibrate_refuses_a_read_only_mount_and_non_root(bed, mount_factory):
    m = mount_factory("ro")
    r = subprocess.run([CTL, "calibrate", str(m.path)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "read-only" in r.stderr, r.stderr
    assert not scratch_files(m)
    w = mount_factory()
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", CTL,
                        "calibrate", str(w.path)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "only root" in r.stderr, r.stderr
    assert not scratch_files(w)


def test_cache_flush_shows_progress_on_a_terminal_only(bed, mount_factory, cache_dir):  # noqa: F811
    m = mount_factory(wb_opts(cache_dir))
    file_with_dirty_pieces(m, "flush-progress-1", 8, 21, 16384)
    bed.shape(1, "16mbit")
    try:
        rc, out = run_on_tty([CTL, "cache", "flush", str(m.path)])
        assert rc == 0, out
        assert "\rflushing: " in out and " dirty" in out, out
        assert out.rstrip().endswith("dirty bytes to the server"), out
        file_with_dirty_pieces(m, "flush-progress-2", 8, 22, 16384)
        r = subprocess.run([CTL, "cache", "flush", str(m.path)], capture_output=True, text=True,
                           timeout=120)
    finally:
        bed.shape(1, "off")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("flushed ") and r.stdout.count("\n") == 1, r.stdout


def test_an_unmount_that_flushes_logs_its_progress(bed, mount_factory, cache_dir):  # noqa: F811
    m = mount_factory(wb_opts(cache_dir))
    file_with_dirty_pieces(m, "unmount-progress", 8, 23, 16384)  # 4 MiB dirty
    bed.shape(1, "4mbit")  # 0.5 MB/s: some 8 s of flushing
    try:
        assert subprocess.run(["fusermount3", "-u", str(m.path)]).returncode == 0
        assert m.proc.wait(timeout=120) == 0
    finally:
        bed.shape(1, "off")
    log = m.log_text()
    assert "flush at unmount: " in log and " KiB dirty left, " in log, log
