"""The same server over two veth paths (path=): both carry traffic, and the
loss of one in the middle of a write costs no error and no data."""
import hashlib
import os
import time

from conftest import EXPORT, SERVER, SERVER2, start_writer


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
