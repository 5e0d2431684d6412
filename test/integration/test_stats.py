"""Statistics of a live mount: per-procedure counters per path and
in total in `mpnfsctl stats`, the Prometheus text of `mpnfsctl stats
--prometheus` and of the `-o metrics=` HTTP endpoint (both checked with
promtool), and `mpnfsctl iostat` while I/O runs."""
import fcntl
import json
import os
import socket
import subprocess
import time
import urllib.request

import pytest

from conftest import BIN, EXPORT, SERVER, SERVER2, run_mount, start_writer

CTL = os.path.join(os.path.dirname(BIN), "mpnfsctl")
MIB = 1 << 20


def ctl(*args):
    return subprocess.run([CTL, *args], capture_output=True, text=True, timeout=30)


def stats(m):
    r = ctl("stats", str(m.path))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def settle(m):
    """Waits (10 s at most) until nothing is queued or in flight, so that the
    counters of calls that ended are final (a RELEASE's COMMIT may be late)."""
    deadline = time.time() + 10
    while time.time() < deadline:
        s = stats(m)
        if not any(c["inflight"] or c["queued"] for c in s["connections"]):
            return s
        time.sleep(0.05)
    return stats(m)


def promtool(text):
    """promtool's verdict on a metrics text: its exit code and everything it
    printed (lint findings go to stdout)."""
    r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=30)
    return r.returncode, (r.stdout + r.stderr).strip()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_all_up(m):
    deadline = time.time() + 15
    while not all(c["state"] == "up" for c in stats(m)["connections"]):
        assert time.time() < deadline, stats(m)
        time.sleep(0.05)


def test_stats_count_each_procedure_per_path_and_in_total(mount_factory):
    # direct_io: every read goes to mpnfs (no page cache between).
    m = mount_factory(f"path={SERVER}+{SERVER2},direct_io")
    wait_all_up(m)
    data = os.urandom(MIB) * 32
    f = m.path / "counted"
    with open(f, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    assert f.read_bytes() == data
    assert not (m.path / "no-such-file").exists()  # a LOOKUP the server answers with NOENT
    s = settle(m)
    conns = s["connections"]
    total = s["ops"]
    # Every path carried reads and writes; the totals are the sums.
    for c in conns:
        assert c["ops"]["READ"]["ops"] > 0 and c["ops"]["WRITE"]["ops"] > 0, c
    for op in ("READ", "WRITE"):
        for key in ("ops", "transmissions", "retransmits", "errors", "bytes_out", "bytes_in",
                    "rtt_count", "rtt_total_us", "exe_total_us"):
            assert total[op][key] == sum(c["ops"][op][key] for c in conns), (op, key)
    w, r = total["WRITE"], total["READ"]
    assert w["bytes_out"] >= len(data)
    assert r["bytes_in"] >= len(data)
    assert w["errors"] == 0 and r["errors"] == 0
    # Data written UNSTABLE (then committed) or FILE_SYNC: each WRITE is one or the other.
    assert w["unstable_ops"] + w["data_sync_ops"] + w["file_sync_ops"] == w["ops"]
    assert w["unstable_bytes"] + w["data_sync_bytes"] + w["file_sync_bytes"] >= len(data)
    if w["unstable_ops"] > 0:
        assert total["COMMIT"]["ops"] >= 1
    assert w["rtt_p99_us"] >= w["rtt_p50_us"] > 0 and w["exe_mean_us"] > 0
    # NOENT is an answer, not a failed call.
    assert total["LOOKUP"]["nfs_errors"] >= 1 and total["LOOKUP"]["errors"] == 0
    # The engine's NULL probes are not among the calls.
    assert all(c["probes"] >= 1 for c in conns)
    assert "NULL" not in total
    # How each path came up.
    for c in conns:
        h = c["history"]
        assert [(e["from"], e["to"]) for e in h[:3]] == [("down", "connecting"), ("connecting", "probing"),
                                                          ("probing", "up")], h
        assert h[-1]["to"] == "up" and h[-1]["reason"].startswith("NFS NULL call answered"), h
        assert c["transitions"] >= 3
    assert s["uptime_s"] > 0


def test_history_says_why_a_path_went_down_and_that_it_came_back(bed, mount_factory):
    m = mount_factory(f"path={SERVER}+{SERVER2}")
    wait_all_up(m)
    second = lambda: next(c for c in stats(m)["connections"] if c["endpoint"].startswith(SERVER2 + ":"))
    w = start_writer(m.path / "h", 4)
    bed.link("down", 2)
    try:
        deadline = time.time() + 20
        while second()["state"] == "up":
            assert time.time() < deadline, second()
            time.sleep(0.05)
    finally:
        bed.link("up", 2)
    _, err = w.communicate(timeout=120)
    assert w.returncode == 0, err
    deadline = time.time() + 20
    while second()["state"] != "up":
        assert time.time() < deadline, second()
        time.sleep(0.05)
    c = second()
    h = c["history"]
    lost = [e for e in h if (e["from"], e["to"]) == ("up", "down")]
    assert len(lost) == 1, h
    assert lost[0]["reason"].startswith("connection lost: "), lost
    if c["failovers"] == 1:  # silent with work outstanding: declared dead
        assert "path declared dead" in lost[0]["reason"], lost
    after = h[h.index(lost[0]) + 1:]
    assert after[0]["to"] == "connecting" and after[0]["reason"] == "reconnecting", h
    assert after[-1]["to"] == "up", h
    assert c["transitions"] >= 6
    assert lost[0]["time"] <= after[-1]["time"]  # ISO 8601 UTC: compares as text


def test_stats_count_the_calls_to_the_mount_port_and_lock_services(mount_factory):
    """The calls made outside the NFS paths are statistics too: MOUNT and
    the portmapper's port lookups (at mount time) and the lock manager's
    calls, in `mpnfsctl stats` and in the Prometheus text."""
    m = mount_factory(portmapper=True)
    fd = os.open(m.path / "locked", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX, 10, 0)
        fcntl.lockf(fd, fcntl.LOCK_UN, 10, 0)
    finally:
        os.close(fd)
    services = {s["service"]: s for s in stats(m)["services"]}
    # (NSM too if an earlier mount on this host ended holding locks: this
    # one then told the server, after a GETPORT for it.)
    notified = "NSM" in services
    assert set(services) - {"NSM"} == {"PORTMAP", "MOUNT", "NLM"}, services
    mnt = services["MOUNT"]
    assert mnt["ops"] == 1 and mnt["errors"] == 0 and mnt["refusals"] == 0 and mnt["rtt_count"] == 1, mnt
    assert mnt["endpoint"].startswith(SERVER + ":") and mnt["last_error"] == "" and mnt["last_call"], mnt
    # GETPORT for MOUNT, then for the lock manager.
    pm = services["PORTMAP"]
    assert pm["ops"] == 2 + notified and pm["errors"] == 0 and pm["endpoint"] == f"{SERVER}:111", pm
    nlm = services["NLM"]
    assert nlm["state"] == "up" and nlm["errors"] == 0 and nlm["lost_locks"] == 0, nlm
    assert nlm["endpoint"].startswith(SERVER + ":") and "#" not in nlm["endpoint"], nlm
    assert nlm["ops"] >= 2 and nlm["rtt_count"] == nlm["ops"], nlm  # LOCK and UNLOCK at least
    r = ctl("stats", "--prometheus", str(m.path))
    assert r.returncode == 0, r.stderr
    mount = f'mount="{m.path}"'
    assert f'mpnfs_service_ops_total{{{mount},service="MOUNT"}} 1' in r.stdout, r.stdout
    assert f'mpnfs_service_up{{{mount},service="NLM"}} 1' in r.stdout, r.stdout
    rc, out = promtool(r.stdout)
    assert rc == 0 and out == "", out


def test_stats_prometheus_passes_promtool(mount_factory):
    m = mount_factory(f"path={SERVER}+{SERVER2}")
    wait_all_up(m)
    (m.path / "p").write_bytes(os.urandom(MIB) * 4)
    os.sync()
    settle(m)
    r = ctl("stats", "--prometheus", str(m.path))
    assert r.returncode == 0, r.stderr
    rc, out = promtool(r.stdout)
    assert rc == 0 and out == "", out
    mount = f'mount="{m.path}"'
    writes = [line for line in r.stdout.splitlines()
              if line.startswith("mpnfs_rpc_ops_total{") and 'op="WRITE"' in line and mount in line]
    assert len(writes) == 2, r.stdout  # one per path
    assert sum(float(line.rsplit(" ", 1)[1]) for line in writes) == stats(m)["ops"]["WRITE"]["ops"]
    assert f'mpnfs_path_up{{{mount},path="{SERVER}:2049#0"}} 1' in r.stdout
    # The same answer with the option after the mountpoint.
    assert ctl("stats", str(m.path), "--prometheus").returncode == 0


def test_metrics_endpoint_serves_what_promtool_accepts(mount_factory):
    port = free_port()
    m = mount_factory(f"metrics=127.0.0.1:{port}")
    (m.path / "x").write_bytes(b"x" * 100000)
    os.sync()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    rc, out = promtool(text)
    # prometheus-cpp's Exposer adds its own exposer_* metrics; promtool has
    # nothing to say about them either.
    assert rc == 0 and out == "", out
    assert f'mpnfs_path_up{{mount="{m.path}",path="{SERVER}:2049#0"}} 1' in text
    assert 'op="WRITE"' in text


def test_metrics_port_alone_listens_on_loopback_only(mount_factory):
    port = free_port()
    mount_factory(f"metrics={port}")
    listen = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True).stdout
    assert f"127.0.0.1:{port}" in listen, listen
    assert f"0.0.0.0:{port}" not in listen and f"*:{port}" not in listen, listen


def test_bad_metrics_values_fail_the_mount_clearly(tmp_path, bed):
    r, _ = run_mount(tmp_path, f"{SERVER}:{EXPORT}", "mountport=20048,metrics=localhost:9100")
    assert r.returncode == 1
    assert "metrics= needs PORT, ADDR:PORT or [IPv6]:PORT" in r.stderr
    # A port someone else holds: the mount fails, saying so.
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r, _ = run_mount(tmp_path, f"{SERVER}:{EXPORT}", f"mountport=20048,metrics={port}")
    assert r.returncode == 32
    assert f"metrics=127.0.0.1:{port}: cannot listen there" in r.stderr


# Writes 1 MiB pieces to argv[1] until its stdin is closed (at most 300 s).
WRITE_UNTIL_STDIN_CLOSES = r"""
import os, select, sys, time
end = time.time() + 300
with open(sys.argv[1], "wb") as f:
    while time.time() < end:
        f.write(os.urandom(1 << 20))
        if select.select([sys.stdin], [], [], 0.01)[0] and not sys.stdin.read(1):
            break
    f.flush()
    os.fsync(f.fileno())
"""


def test_iostat_shows_the_write_rate_while_writing(mount_factory):
    m = mount_factory()
    target = m.path / "io"
    # The writer runs until iostat is done (it stops when its stdin closes),
    # so every interval iostat reports has writes, however slow the start.
    w = subprocess.Popen(["python3", "-c", WRITE_UNTIL_STDIN_CLOSES, str(target)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        deadline = time.time() + 60
        while (not target.exists() or target.stat().st_size < 4 * MIB) and time.time() < deadline:
            assert w.poll() is None, w.communicate()
            time.sleep(0.05)
        assert target.stat().st_size >= 4 * MIB, "the writer did not start writing"
        r = ctl("iostat", str(m.path), "1", "2")
        assert r.returncode == 0, r.stderr
    finally:
        out, err = w.communicate(input="", timeout=120)
        assert w.returncode == 0, err
    reports = r.stdout.split("\n\n")
    assert len(reports) == 2, r.stdout
    assert "since the mount" in reports[0] and "(over " in reports[1], r.stdout
    line = next(l for l in reports[1].splitlines() if l.split()[:2] == ["all", "WRITE"])
    cols = line.split()
    ops_s, kb_s = float(cols[2]), float(cols[3])
    assert ops_s > 0 and kb_s > 0, r.stdout
    # The path's own line is there too.
    assert any(l.startswith(f"{SERVER}:2049#0 (up)") and " WRITE " in l for l in reports[1].splitlines())


def test_iostat_rejects_bad_arguments(mnt):
    assert ctl("iostat", str(mnt.path), "0").returncode == 1
    assert ctl("iostat", str(mnt.path), "1", "x").returncode == 1
    r = ctl("iostat", str(mnt.path))  # one report, since the mount
    assert r.returncode == 0 and "since the mount" in r.stdout, r.stderr
