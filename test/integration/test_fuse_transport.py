"""How FUSE requests reach mpnfs: through /dev/fuse, or through io_uring
where the kernel offers it (fuse_uring=, the fuse module's enable_uring,
which these tests set and put back). The whole suite runs on the rings too
(MPNFS_IT_FUSE_URING=1, contrib/test.sh); here are the transport's own
rules: which one a mount takes and says it takes, that requests really come
through the rings, and that a mount on rings ends cleanly."""
import errno
import hashlib
import json
import os
import signal
import subprocess
import threading
import time

import pytest

from conftest import (BIN, ENABLE_URING, EXPORT, FUSE_URING, SERVER, is_mounted, run_mount,
                      set_enable_uring)

CTL = os.path.join(os.path.dirname(BIN), "mpnfsctl")

pytestmark = pytest.mark.skipif(not os.path.exists(ENABLE_URING),
                                reason="this kernel has no FUSE over io_uring (no fuse.enable_uring)")


@pytest.fixture
def kernel_uring(bed):
    old = set_enable_uring("Y")
    yield
    set_enable_uring(old)


@pytest.fixture
def kernel_no_uring(bed):
    old = set_enable_uring("N")
    yield
    set_enable_uring(old)


def fuse_stats(m):
    r = subprocess.run([CTL, "stats", str(m.path)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["fuse"]


def possible_cpus():
    """The kernel's queue count: the CPUs in the possible mask ("0-1", "0-3,6-7")."""
    text = open("/sys/devices/system/cpu/possible").read().strip()
    n = 0
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        n += int(hi or lo) - int(lo) + 1
    return n


def drop_pages():
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


def exercise(mount):
    """Data, names, attributes and a listing, each checked, in a directory
    of its own (every mount shows the same export)."""
    root = mount / f"ex-{os.getpid()}-{time.monotonic_ns()}"
    root.mkdir()
    data = os.urandom(3 << 20) + b"tail"
    p = root / "data"
    p.write_bytes(data)
    drop_pages()
    assert hashlib.md5(p.read_bytes()).hexdigest() == hashlib.md5(data).hexdigest()
    (root / "dir").mkdir()
    (root / "dir" / "a").write_text("x")
    os.rename(root / "dir" / "a", root / "dir" / "b")
    os.symlink("b", root / "dir" / "l")
    assert sorted(os.listdir(root / "dir")) == ["b", "l"]
    assert os.readlink(root / "dir" / "l") == "b"
    os.chmod(root / "dir" / "b", 0o640)
    assert (root / "dir" / "b").stat().st_mode & 0o777 == 0o640
    os.truncate(p, 100)
    assert p.stat().st_size == 100
    assert p.read_bytes() == data[:100]
    os.unlink(root / "dir" / "l")
    assert sorted(os.listdir(root / "dir")) == ["b"]


def test_requests_come_through_io_uring_when_asked(kernel_uring, mount_factory):
    m = mount_factory("fuse_uring=on")
    before = fuse_stats(m)
    exercise(m.path)
    after = fuse_stats(m)
    assert after["transport"] == "io_uring", after
    assert after["why"] == ""
    assert after["queues"] == possible_cpus() and after["depth"] == 32
    # Every operation above is a request; the device carries only INIT,
    # forgets and interrupts.
    ring = after["ring_requests"] - before["ring_requests"]
    device = after["device_requests"] - before["device_requests"]
    assert ring >= 30, after
    assert device < ring / 4, after
    assert f"FUSE requests go through io_uring: {after['queues']} queues of 32 entries" in m.log_text()


def test_fuse_uring_auto_stays_on_the_device_where_the_kernel_does_not_offer_it(
        kernel_no_uring, mount_factory):
    m = mount_factory("fuse_uring=auto")
    exercise(m.path)
    s = fuse_stats(m)
    assert s["transport"] == "device", s
    assert "enable_uring" in s["why"], s
    assert s["ring_requests"] == 0 and s["device_requests"] >= 30, s
    assert "FUSE requests go through /dev/fuse: " in m.log_text()


def test_fuse_uring_auto_takes_the_rings_where_the_kernel_offers_them(kernel_uring,
                                                                      mount_factory):
    m = mount_factory("fuse_uring=auto")
    exercise(m.path)
    s = fuse_stats(m)
    assert s["transport"] == "io_uring" and s["why"] == "", s
    assert s["ring_requests"] >= 30, s


@pytest.mark.skipif(FUSE_URING, reason="this run puts fuse_uring=on on every mount")
def test_the_default_is_the_device_even_where_the_kernel_offers_io_uring(kernel_uring,
                                                                         mount_factory):
    m = mount_factory()
    exercise(m.path)
    s = fuse_stats(m)
    assert s["transport"] == "device" and s["why"] == "fuse_uring=off", s
    assert s["ring_requests"] == 0


def test_fuse_uring_on_fails_the_mount_where_the_kernel_has_it_off(kernel_no_uring, tmp_path):
    r, _ = run_mount(tmp_path, f"{SERVER}:{EXPORT}", "mountport=20048,fuse_uring=on")
    assert r.returncode != 0
    assert "fuse_uring=on" in r.stderr and "enable_uring" in r.stderr, r.stderr
    assert not is_mounted(tmp_path / "m")


def test_one_ring_entry_per_queue_carries_many_requests_at_once(kernel_uring, mount_factory):
    """Eight threads on one entry a queue: requests beyond the entries wait
    in the kernel, each handed over by the commit of an earlier reply; all
    of them must come, with the right data."""
    m = mount_factory("fuse_uring=on,fuse_uring_depth=1")
    assert fuse_stats(m)["depth"] == 1
    blobs = {i: os.urandom((1 << 20) + i * 4097) for i in range(8)}
    errors = []

    def work(i):
        try:
            p = m.path / f"f{i}"
            for _ in range(3):
                p.write_bytes(blobs[i])
                fd = os.open(p, os.O_RDONLY)
                try:
                    got = b""
                    while chunk := os.read(fd, 65536):
                        got += chunk
                finally:
                    os.close(fd)
                assert got == blobs[i]
                os.stat(p)
        except Exception as e:  # noqa: BLE001 - reported by the test below
            errors.append(f"{i}: {e!r}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "requests stopped moving"
    assert errors == []
    drop_pages()
    for i, b in blobs.items():
        assert (m.path / f"f{i}").read_bytes() == b
        os.unlink(m.path / f"f{i}")
    assert fuse_stats(m)["ring_requests"] > 100


def test_a_mount_on_rings_unmounts_and_its_daemon_exits(kernel_uring, mount_factory):
    m = mount_factory("fuse_uring=on")
    exercise(m.path)
    m.unmount()
    assert m.proc.returncode == 0, m.log_text()
    assert not is_mounted(m.path)
    assert "unmounted" in m.log_text()


def test_a_daemon_killed_with_requests_on_the_rings_leaves_no_request_hanging(kernel_uring,
                                                                              mount_factory):
    m = mount_factory("fuse_uring=on")
    writer = subprocess.Popen(["dd", "if=/dev/zero", f"of={m.path}/big", "bs=1M", "count=100000",
                               "conv=fsync"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 20
        while time.time() < deadline and fuse_stats(m)["ring_requests"] < 50:
            time.sleep(0.05)
        assert fuse_stats(m)["ring_requests"] >= 50
        os.kill(m.pid, signal.SIGKILL)
        m.proc.wait(timeout=10)
        # The connection ends with the daemon: the writer gets an error, not a hang.
        assert writer.wait(timeout=30) != 0
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    with pytest.raises(OSError):
        os.stat(m.path / "big")


@pytest.mark.parametrize("transport", ["device", "io_uring"])
def test_requests_end_with_the_session_loop_not_with_the_daemon(bed, mount_factory, tmp_path,
                                                                request, transport):
    """A stop signal ends the session loop; the gateway then still works a
    while (here it flushes its write-back cache to a server that is gone).
    A file left open must get errors from then on, on either transport: a
    write accepted then would be acknowledged after the last flush, and lost."""
    if transport == "io_uring":
        request.getfixturevalue("kernel_uring")
    cache = tmp_path / "wbcache"
    cache.mkdir()
    m = mount_factory(f"fuse_uring={'on' if transport == 'io_uring' else 'off'},cache_dir={cache},"
                      "cache_mode=writeback,cache_size=64M,cache_block=64,dirty_age=600")
    name = f"held-{transport}"
    data = os.urandom(65536)
    fd = os.open(m.path / name, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        bed.link("down", 1)
        os.kill(m.pid, signal.SIGTERM)
        deadline = time.time() + 30
        while "flushing" not in m.log_text():
            assert m.proc.poll() is None and time.time() < deadline, m.log_text()
            time.sleep(0.1)
        assert m.proc.poll() is None  # still flushing: the server is gone
        with pytest.raises(OSError) as late:
            os.pwrite(fd, b"late", 0)
        assert late.value.errno in (errno.ENOTCONN, errno.ECONNABORTED), late.value
    finally:
        bed.link("up", 1)
        try:
            os.close(fd)
        except OSError:
            pass
    m.proc.wait(timeout=60)
    with open(os.path.join(EXPORT, name), "rb") as f:
        assert f.read() == data
