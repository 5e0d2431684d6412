"""The same server over two veth paths (path= or an mpnfstab entry): both
carry traffic, and the loss of one in the middle of a write costs no error
and no data."""
import hashlib
import json
import os
import subprocess
import time

from conftest import BIN, EXPORT, SERVER, SERVER2, start_writer


def tx_bytes(k):
    with open(f"/sys/class/net/mitc{k}/statistics/tx_bytes") as f:
        return int(f.read())


def test_both_paths_carry_traffic(mount_factory):
    m = mount_factory(f"path={SERVER}+{SERVER2}")
    before = [tx_bytes(1), tx_bytes(2)]
    data = os.urandom(1 << 20) * 128
    (m.path / "spread").write_bytes(data)
    os.sync()
    sent = [tx_bytes(1) - before[0], tx_bytes(2) - before[1]]
    assert min(sent) > 16 << 20, f"bytes sent per path: {sent}"
    assert (m.path / "spread").read_bytes() == data


def test_a_path_going_down_mid_write_loses_nothing(bed, mount_factory):
    m = mount_factory(f"path={SERVER}+{SERVER2},tcp_timeout=2")
    w = start_writer(m.path / "fo", 6)
    time.sleep(1.5)
    bed.link("down", 2)
    try:
        out, err = w.communicate(timeout=120)
    finally:
        bed.link("up", 2)
    assert w.returncode == 0, err
    want = out.strip()
    assert hashlib.md5(open(os.path.join(EXPORT, "fo"), "rb").read()).hexdigest() == want
    assert hashlib.md5((m.path / "fo").read_bytes()).hexdigest() == want
    log = m.log_text()
    assert f"{SERVER2}:2049#1 lost" in log, log
    # The path comes back by itself.
    deadline = time.time() + 15
    while f"{SERVER2}:2049#1 is up again" not in m.log_text():
        assert time.time() < deadline, m.log_text()
        time.sleep(0.2)


def test_mpnfstab_entry_supplies_paths_and_options(bed, mount_factory, tmp_path):
    tab = tmp_path / "mpnfstab"
    tab.write_text(f"server: filer\npath: {SERVER}\npath: {SERVER2}\n"
                   f"export: {EXPORT} mount: /unused\n"
                   "options: conns_per_path=2,log_level=info\n")
    m = mount_factory(f"tab={tab}", source=f"filer:{EXPORT}")  # "filer" does not resolve
    (m.path / "via-tab").write_bytes(b"x" * (8 << 20))
    log = m.log_text()
    assert "2 path(s) x 2 connection(s)" in log, log
    assert f"mpnfstab entry at {tab}:1" in log, log
    assert (m.path / "via-tab").stat().st_size == 8 << 20


def test_malformed_mpnfstab_refuses_to_mount(bed, tmp_path):
    tab = tmp_path / "bad"
    tab.write_text("server: filer\npath 10.0.0.1\n")
    mp = tmp_path / "m"
    mp.mkdir()
    r = subprocess.run([BIN, f"filer:{EXPORT}", str(mp), "-o", f"tab={tab}"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    assert f"{tab}:2" in r.stderr


def test_mpnfsctl_reports_per_connection_statistics(mount_factory):
    m = mount_factory(f"path={SERVER}+{SERVER2}")
    (m.path / "stats").write_bytes(os.urandom(1 << 20) * 16)
    os.sync()
    ctl = os.path.join(os.path.dirname(BIN), "mpnfsctl")
    r = subprocess.run([ctl, "stats", str(m.path)], capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    conns = doc["connections"]
    assert [c["endpoint"] for c in conns] == [f"{SERVER}:2049#0", f"{SERVER2}:2049#1"]
    assert all(c["state"] == "up" and c["calls"] > 0 and c["errors"] == 0 for c in conns)
    assert sum(c["bytes_out"] for c in conns) >= 16 << 20
    assert all(c["latency_p99_us"] >= c["latency_mean_us"] > 0 for c in conns)
    m.unmount()
    r = subprocess.run([ctl, "stats", str(m.path)], capture_output=True, text=True, timeout=10)
    assert r.returncode == 1  # the socket is gone with the mount
