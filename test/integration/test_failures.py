"""Bad input and failing servers: clear errors, nothing lost."""
import hashlib
import os
import subprocess
import threading
import time

import pytest

from conftest import BIN, EXPORT, NET, SERVER, cpu_seconds, is_mounted, run_mount, start_writer


def test_bad_option_is_refused_with_its_name(tmp_path):
    r, _ = run_mount(tmp_path, f"{SERVER}:{EXPORT}", "frobnicate=3")
    assert r.returncode == 1
    assert "frobnicate" in r.stderr


def test_unreachable_server_fails_within_the_timeout(bed, tmp_path):
    r, took = run_mount(tmp_path, f"10.{NET}.1.99:/x", "mountport=20048,mount_timeout=3")
    assert r.returncode == 32
    assert "unreachable" in r.stderr or "cannot reach" in r.stderr
    assert took < 15


def test_unresolvable_name(tmp_path):
    r, _ = run_mount(tmp_path, "no-such-host.invalid:/x", "mount_timeout=3")
    assert r.returncode == 32
    assert "cannot resolve" in r.stderr


def test_missing_export_is_reported(bed, tmp_path):
    r, _ = run_mount(tmp_path, f"{SERVER}:/not/exported", "mountport=20048,mount_timeout=5")
    assert r.returncode == 32
    assert "not export" in r.stderr


def test_daemon_mode_returns_once_usable(bed, tmp_path):
    mp = tmp_path / "dm"
    mp.mkdir()
    r = subprocess.run([BIN, f"{SERVER}:{EXPORT}", str(mp), "-o", "mountport=20048"],
                       capture_output=True, text=True, timeout=60)
    try:
        assert r.returncode == 0, r.stderr
        assert is_mounted(mp)
        assert os.path.isdir(mp)  # usable at once
        os.listdir(mp)
    finally:
        subprocess.run(["fusermount3", "-u", str(mp)])
    # The daemon exits by itself after the unmount.
    for _ in range(100):
        out = subprocess.run(["pgrep", "-f", f"mpnfs .* {mp}"], capture_output=True)
        if out.returncode != 0:
            break
        time.sleep(0.1)
    else:
        pytest.fail("daemon still running after unmount")


def test_unmount_while_busy_is_refused_then_works(mnt):
    f = open(mnt.path / "busy", "w")
    r = subprocess.run(["fusermount3", "-u", str(mnt.path)], capture_output=True, text=True)
    assert r.returncode != 0
    assert is_mounted(mnt.path)
    f.write("x")
    f.close()
    assert subprocess.run(["fusermount3", "-u", str(mnt.path)]).returncode == 0
    mnt.proc.wait(timeout=15)
    assert mnt.proc.returncode == 0




@pytest.mark.parametrize("how", ["restart", "crash"])
def test_hard_mount_survives_server_restart_mid_write(bed, d, mnt, how):
    """A separate process writes for 6 s (so that this process, which forks
    the restart, never holds the file open); the server goes away after 1.5 s,
    politely (restart) or killed (crash), and comes back. The writer must see
    no error and the server must end up with exactly what it wrote."""
    w = start_writer(d / "f", 6)
    time.sleep(1.5)
    bed.crash_server() if how == "crash" else bed.restart_server()
    out, err = w.communicate(timeout=300)
    assert w.returncode == 0, err
    want = out.strip()
    server_copy = os.path.join(EXPORT, os.path.relpath(d / "f", mnt.path))
    assert hashlib.md5(open(server_copy, "rb").read()).hexdigest() == want
    assert hashlib.md5((d / "f").read_bytes()).hexdigest() == want
    log = mnt.log_text()
    print(log)
    assert "lost" in log  # the connection really broke mid-write


def test_soft_mount_fails_with_eio_and_hard_mount_idles_while_server_is_down(
        bed, mount_factory):
    soft = mount_factory("soft,timeo=10,retrans=1")
    hard = mount_factory("hard")
    (soft.path / "soft-probe").write_text("x")
    bed.stop_server()
    try:
        t0 = time.time()
        c0 = cpu_seconds(hard.pid)
        with pytest.raises(OSError):
            os.stat(soft.path / "soft-probe-missing")
        took = time.time() - t0
        assert took < 20
        # A hard mount retries forever but sits nearly idle while it waits,
        # here with a call outstanding.
        waiter = threading.Thread(target=lambda: os.path.exists(hard.path / "pending-lookup"))
        waiter.start()
        time.sleep(3)
        used = cpu_seconds(hard.pid) - c0
        assert used < 0.5, f"hard mount burnt {used:.2f} s CPU while the server was down"
        assert len(hard.log_text().splitlines()) < 50
    finally:
        bed.start_server()
    waiter.join(timeout=60)
    assert not waiter.is_alive(), "the hard mount's call did not complete after the restart"
    # Both recover by themselves.
    deadline = time.time() + 30
    while True:
        try:
            (soft.path / "after").write_text("y")
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.5)
    assert (hard.path / "soft-probe").read_text() == "x"


def test_missing_mountpoint_fails_before_contacting_the_server(tmp_path):
    t0 = time.time()
    r = subprocess.run([BIN, f"10.{NET}.1.99:/x", str(tmp_path / "nope"), "-o", "mount_timeout=30"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 32
    assert "No such file or directory" in r.stderr
    assert time.time() - t0 < 5  # did not wait for the unreachable server
