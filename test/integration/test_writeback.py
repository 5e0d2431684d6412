"""cache_mode=writeback: writes acknowledged from the SSD cache and flushed later.
Data read back equals data written before and after the flush and through remounts;
a kill -9 in the middle of writing loses no acknowledged write (the next mount flushes
them before it is offered); the ownership record keeps other mounts out; fsync with
wb_fsync=server, truncate, age-based flushing, a cache full of dirty data, and online
flush/detach."""
import hashlib
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from conftest import EXPORT, SERVER, Mount, is_mounted, run_mount, start_mount
from test_cache import CTL, cache_stats, direct_read, direct_write

PAGE = 4096


@pytest.fixture(autouse=True)
def free_export(bed, tmp_path):
    """Runs after the test's own mounts are gone. If a failing test left the
    export claimed, the named cache's own mount flushes it and its unmount
    frees the export, so that the tests after it can still mount."""
    yield
    if not owner_record():
        return
    text = server_bytes(".mpnfs-owner").decode()
    cache = [line.split(": ", 1)[1] for line in text.splitlines() if line.startswith("cache_dir: ")]
    mp = tmp_path / "free-export"
    mp.mkdir(exist_ok=True)
    proc, _ = start_mount(mp, f"cache_dir={cache[0]},cache_mode=writeback")
    deadline = time.time() + 60
    while not is_mounted(mp) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    subprocess.run(["fusermount3", "-u", str(mp)], capture_output=True)
    proc.wait(timeout=60)
    assert not owner_record(), "the export stays claimed by " + cache[0]


@pytest.fixture
def cache_dir(tmp_path):
    d = tmp_path / "wbcache"
    d.mkdir()
    return d


def wb_opts(cache_dir, extra=""):
    o = f"cache_dir={cache_dir},cache_mode=writeback,cache_size=64M,cache_block=64,dirty_age=600"
    return o + ("," + extra if extra else "")


def server_bytes(name):
    with open(os.path.join(EXPORT, name), "rb") as f:
        return f.read()


def ctl(m, *args):
    return subprocess.run([CTL, *args, str(m.path)], capture_output=True, text=True, timeout=120)


def owner_record():
    return os.path.exists(os.path.join(EXPORT, ".mpnfs-owner"))


def file_with_dirty_pieces(m, name, mib, seed, step, at=0):
    """A file written sequentially, then 8 KiB written every `step` bytes (from
    `at`) with O_DIRECT: those land in the cache. Returns its path and content."""
    f = m.path / name
    data = bytearray(random.Random(seed).randbytes(mib << 20))
    f.write_bytes(data)
    for o in range(at, mib << 20, step):
        new = os.urandom(8192)
        direct_write(f, o, new)
        data[o:o + 8192] = new
    return f, data


@pytest.mark.parametrize("io", ["buffered", "cache_direct"])
def test_data_reads_back_before_and_after_the_flush(mount_factory, cache_dir, io):
    extra = "cache_direct" if io == "cache_direct" else ""
    m = mount_factory(wb_opts(cache_dir, extra))
    f = m.path / f"wb-data-{io}"
    data = bytearray(random.Random(1).randbytes(16 << 20))
    f.write_bytes(data)  # a sequential stream: past seq_cutoff it goes to the server
    rnd = random.Random(2)
    # Random writes: aligned (O_DIRECT) and unaligned ones through the page cache
    # (a partial page the cache lacks is merged with the server's copy), some
    # rewriting unflushed pages (copy-on-write, or in place when no commit
    # declared them yet), one growing the file.
    for i in range(300):
        o = rnd.randrange(0, 16 << 20, 8192)
        new = rnd.randbytes(8192)
        direct_write(f, o, new)
        data[o:o + 8192] = new
    with open(f, "r+b") as g:
        for i in range(100):
            o = rnd.randrange(0, (16 << 20) - 10000)
            new = rnd.randbytes(rnd.choice([1, 100, 5000, 9999]))
            g.seek(o)
            g.write(new)
            g.flush()
            data[o:o + len(new)] = new
        g.seek((16 << 20) + 3000)
        g.write(b"past the end")
    data.extend(bytes(3000) + b"past the end")
    st = cache_stats(m)
    assert st["mode"] == "writeback" and st["dirty_bytes"] > 0, st
    assert st["copies"] + st["rewrites_in_place"] > 0, st
    assert st["writes_around"] == 0, st
    assert os.stat(f).st_size == len(data)
    assert server_bytes(f.name) != bytes(data)  # not flushed yet (dirty_age=600)
    assert owner_record()
    # Reads see the unflushed writes: whole-file, and O_DIRECT ranges that mix
    # cached and uncached pages after the clean pages were dropped.
    assert hashlib.md5(f.read_bytes()).digest() == hashlib.md5(data).digest()
    assert ctl(m, "cache", "drop").returncode == 0
    assert cache_stats(m)["dirty_bytes"] == st["dirty_bytes"]  # drop keeps unflushed writes
    for o in range(0, len(data), 256 << 10):
        assert direct_read(f, o, 256 << 10) == data[o:o + (256 << 10)], o
    r = ctl(m, "cache", "flush")
    assert r.returncode == 0 and "flushed" in r.stdout, r.stderr
    st = cache_stats(m)
    assert st["dirty_bytes"] == 0 and st["flushed_bytes"] > 0 and st["flush_errors"] == 0, st
    assert server_bytes(f.name) == bytes(data)
    m.unmount()
    assert not owner_record()  # nothing dirty left: the export is free
    m2 = mount_factory(wb_opts(cache_dir, extra))
    assert hashlib.md5((m2.path / f.name).read_bytes()).digest() == hashlib.md5(data).digest()


# Rewrites 8 KiB pieces at random among 512 offsets of a 4 MiB file, printing the
# sequence number of each write once pwrite() has returned (acknowledged), and
# after every 10th write an fdatasync, printing "s" once it returned (durable).
WRITER = r"""
import os, random, sys
fd = os.open(sys.argv[1], os.O_WRONLY)
rnd = random.Random(7)
i = 0
while True:
    o = rnd.randrange(0, 512) * 8192
    try:
        os.pwrite(fd, random.Random(i).randbytes(8192), o)
        print(i, o, flush=True)
        if i % 10 == 9:
            os.fdatasync(fd)
            print("s", flush=True)
    except OSError:
        break
    i += 1
"""


def test_kill9_while_writing_loses_no_fsynced_write(mount_factory, cache_dir, tmp_path):
    """mpnfs killed while a program writes and fdatasyncs: every write an
    fdatasync covered survives; a later write (answered or not) is there or
    not, piece by piece, and nothing older than the last durable write is."""
    m = mount_factory(wb_opts(cache_dir))
    f = m.path / "wb-crash"
    base = random.Random(3).randbytes(4 << 20)
    f.write_bytes(base)
    os.sync()
    log = tmp_path / "acked"
    with open(log, "w") as lf:
        w = subprocess.Popen([sys.executable, "-c", WRITER, str(f)], stdout=lf)
        # Let it write (and rewrite: copy-on-write of unflushed pages) for a while.
        deadline = time.time() + 60
        while time.time() < deadline and len(log.read_text().splitlines()) < 3300:
            time.sleep(0.05)
        os.kill(m.pid, signal.SIGKILL)
        w.wait(timeout=30)
    m.proc.wait(timeout=10)
    subprocess.run(["umount", "-l", str(m.path)], capture_output=True)
    lines = log.read_text().splitlines()
    acked = [tuple(map(int, line.split())) for line in lines if line != "s"]
    durable = sum(1 for line in lines if line == "s") * 10  # writes 0 .. durable-1
    assert len(acked) >= 500 and durable >= 400, (len(acked), durable)
    assert server_bytes(f.name) != base  # the writes were in the cache only
    # While the cache holds them, nothing else may mount the export.
    r, _ = run_mount(tmp_path, f"{SERVER}:{EXPORT}", "mountport=20048")
    assert r.returncode == 32 and ".mpnfs-owner" in r.stderr, r.stderr
    other = tmp_path / "other-cache"
    other.mkdir()
    r, _ = run_mount(tmp_path, f"{SERVER}:{EXPORT}", "mountport=20048," + wb_opts(other))
    assert r.returncode == 32 and str(cache_dir) in r.stderr, r.stderr
    r, _ = run_mount(tmp_path, f"{SERVER}:{EXPORT}",
                     f"mountport=20048,cache_dir={cache_dir},cache_mode=readonly")
    assert r.returncode == 32 and "cache_mode=writeback" in r.stderr, r.stderr
    # The cache's own mount flushes them before it is offered.
    m2 = mount_factory(wb_opts(cache_dir))
    assert "left by an earlier mount" in m2.log_text()
    # Per piece: what the last durable write left, or any later write's data
    # (answered after the last fdatasync, or in progress at the kill).
    offsets = random.Random(7)
    allowed = {k: {base[k:k + 8192]} for k in range(0, len(base), 8192)}
    for i in range(len(acked) + 1):
        o = offsets.randrange(0, 512) * 8192
        assert i == len(acked) or acked[i] == (i, o)
        if i < durable:
            allowed[o] = set()
        allowed[o].add(random.Random(i).randbytes(8192))
    got = server_bytes(f.name)
    assert len(got) == len(base)
    bad = [k for k in range(0, len(base), 8192) if got[k:k + 8192] not in allowed[k]]
    assert not bad, f"{len(bad)} pieces hold what no allowed write left, first at {bad[0]}"
    lost = sum(1 for i, o in acked[durable:] if got[o:o + 8192] != random.Random(i).randbytes(8192))
    print(f"{len(acked)} writes answered, {durable} made durable; {lost} pieces of later writes not there")
    assert cache_stats(m2)["dirty_bytes"] == 0
    m2.unmount()
    assert not owner_record()
    m3 = mount_factory()  # free again for anyone
    assert hashlib.md5((m3.path / f.name).read_bytes()).digest() == hashlib.md5(got).digest()


def test_ownership_record_keeps_other_mounts_out(mount_factory, cache_dir, tmp_path):
    m = mount_factory(wb_opts(cache_dir))
    text = server_bytes(".mpnfs-owner").decode()
    assert f"cache_dir: {cache_dir}" in text and "host: " in text
    r, _ = run_mount(tmp_path, f"{SERVER}:{EXPORT}", "mountport=20048")
    assert r.returncode == 32 and "owned by the write-back cache" in r.stderr, r.stderr
    m.unmount()
    assert not owner_record()
    m2 = mount_factory()
    assert (m2.path).is_dir()



def test_two_gateways_started_together_exactly_one_mounts(bed, tmp_path):
    """Two write-back gateways with different caches start at the same moment on
    one export, ten times: each time exactly one mounts, and the other exits
    with the refusal naming the ownership record."""
    for rnd in range(10):
        procs, mps, logs = [], [], []
        for k in range(2):
            cache = tmp_path / f"cache-{rnd}-{k}"
            cache.mkdir()
            mp = tmp_path / f"mp-{rnd}-{k}"
            mp.mkdir()
            mps.append(mp)
        for k in range(2):  # back to back
            proc, log = start_mount(mps[k], wb_opts(tmp_path / f"cache-{rnd}-{k}"))
            procs.append(proc)
            logs.append(log)
        gateways = [Mount(mps[k], procs[k], logs[k]) for k in range(2)]
        try:
            deadline = time.time() + 60
            while time.time() < deadline and not all(is_mounted(mp) or p.poll() is not None
                                                      for mp, p in zip(mps, procs)):
                time.sleep(0.05)
            text = "\n".join(g.log_text() for g in gateways)
            up = [k for k in range(2) if is_mounted(mps[k])]
            assert len(up) == 1, f"round {rnd}: {len(up)} mounted\n{text}"
            loser = gateways[1 - up[0]]
            assert loser.proc.wait(timeout=30) == 32, text
            refusal = loser.log_text()
            assert ("owned by the write-back cache" in refusal or
                    "being claimed by another write-back cache" in refusal), refusal
        finally:
            for g in gateways:
                g.unmount()
        assert not owner_record(), f"round {rnd}: the winner's unmount frees the export"


def test_fsync_server_truncate_and_o_sync(mount_factory, cache_dir):
    m = mount_factory(wb_opts(cache_dir, "wb_fsync=server"))
    f = m.path / "wb-fsync"
    data = bytearray(random.Random(4).randbytes(2 << 20))
    f.write_bytes(data)
    fd = os.open(f, os.O_RDWR)
    for o in random.Random(5).sample(range(0, 2 << 20, 8192), 40):
        new = os.urandom(8192)
        os.pwrite(fd, new, o)
        data[o:o + 8192] = new
    assert cache_stats(m)["dirty_bytes"] > 0
    os.fsync(fd)  # wb_fsync=server: on the server when it returns
    assert cache_stats(m)["dirty_bytes"] == 0
    assert server_bytes(f.name) == bytes(data)
    os.close(fd)
    # O_SYNC writes are on the server when they return.
    fd = os.open(f, os.O_RDWR | os.O_SYNC)
    os.pwrite(fd, b"s" * 8192, 8192 * 3)
    data[8192 * 3:8192 * 4] = b"s" * 8192
    assert server_bytes(f.name) == bytes(data)
    # Truncating a file with unflushed writes keeps those below the new size.
    os.pwrite(fd, b"x" * 8192, 8192 * 10)
    os.pwrite(fd, b"y" * 8192, 8192 * 200)
    os.close(fd)
    data[8192 * 10:8192 * 11] = b"x" * 8192
    os.truncate(f, 8192 * 100 + 77)
    del data[8192 * 100 + 77:]
    assert os.stat(f).st_size == len(data)
    assert direct_read(f, 0, 1 << 20)[:len(data)] == data[:1 << 20]
    assert server_bytes(f.name) == bytes(data)


def test_old_dirty_blocks_are_flushed_in_the_background(mount_factory, cache_dir):
    m = mount_factory(wb_opts(cache_dir).replace("dirty_age=600", "dirty_age=1"))
    f, data = file_with_dirty_pieces(m, "wb-age", 1, 6, 65536)
    deadline = time.time() + 15
    while cache_stats(m)["dirty_bytes"] > 0 and time.time() < deadline:
        time.sleep(0.2)
    assert cache_stats(m)["dirty_bytes"] == 0
    assert server_bytes(f.name) == bytes(data)


def test_removing_a_file_drops_its_unflushed_writes_unsent(mount_factory, cache_dir):
    # What the server answers for a removed file's handle lets the gateway drop
    # its cached writes at once; a file with another name keeps them.
    m = mount_factory(wb_opts(cache_dir))
    f, _ = file_with_dirty_pieces(m, "wb-rm", 1, 11, 131072)
    kept, kept_data = file_with_dirty_pieces(m, "wb-rm-kept", 1, 12, 131072)
    os.link(kept, m.path / "wb-rm-kept2")
    st = cache_stats(m)
    assert st["dirty_bytes"] > 0 and st["flushed_bytes"] == 0, st
    f.unlink()
    kept.unlink()
    deadline = time.time() + 15
    while cache_stats(m)["dirty_bytes"] > st["dirty_bytes"] // 2 and time.time() < deadline:
        time.sleep(0.1)
    after = cache_stats(m)
    # (Both files have the same dirty pieces: half of the bytes go.)
    assert after["dirty_bytes"] == st["dirty_bytes"] // 2 and after["flushed_bytes"] == 0, after
    m.unmount()  # flushes what is kept
    assert server_bytes("wb-rm-kept2") == bytes(kept_data)
    assert "gone from the server" not in m.log_text(), m.log_text()


def test_a_cache_full_of_dirty_data_sends_writes_to_the_server(mount_factory, cache_dir):
    # 16 slots, no flushing by level (100%) or age: dirty blocks fill the cache.
    m = mount_factory(wb_opts(cache_dir, "dirty_high=100,dirty_low=99").replace("cache_size=64M",
                                                                                "cache_size=1M"))
    f, data = file_with_dirty_pieces(m, "wb-full", 4, 8, 65536, at=4096)  # one per 64 KiB block
    st = cache_stats(m)
    # (the file's first 4 MiB, before seq_cutoff, went to the cache too.) 16
    # blocks fit; the flusher makes room only once all 16 are dirty
    # (dirty_high=100), in a round every 200 ms at most, so writes arriving
    # meanwhile find the cache full and go to the server. (How many depends
    # on timing: under ThreadSanitizer the flusher may have emptied it.)
    assert st["state"] == "healthy" and st["dirty_blocks"] <= 16 and st["writes_around"] >= 1, st
    assert hashlib.md5(f.read_bytes()).digest() == hashlib.md5(data).digest()
    m.unmount()  # flushes
    assert server_bytes(f.name) == bytes(data)


def test_online_detach_flushes_and_frees_the_export(mount_factory, cache_dir):
    m = mount_factory(wb_opts(cache_dir))
    f, data = file_with_dirty_pieces(m, "wb-detach", 1, 9, 131072)
    assert cache_stats(m)["dirty_bytes"] > 0
    r = ctl(m, "cache", "detach")
    assert r.returncode == 0 and "detached" in r.stdout, r.stderr
    assert server_bytes(f.name) == bytes(data)
    assert not owner_record()
    direct_write(f, 0, b"z" * 8192)  # the mount goes on, uncached
    data[:8192] = b"z" * 8192
    assert direct_read(f, 0, 1 << 20) == data
    assert is_mounted(m.path)


@pytest.mark.parametrize("broken", ["data"])
def test_a_failing_cache_disk_loses_no_write(mount_factory, cache_dir, broken):
    """The cache's data file, which holds the blocks and the index records
    (the index file is only a header written at creation), stops taking
    writes (chattr +i: EPERM on every write, as a failing device would give
    EIO): new writes go to the server, the unflushed ones already in the
    cache are flushed, nothing is lost, and a later mount starts from a
    cache it can trust."""
    m = mount_factory(wb_opts(cache_dir))
    f, data = file_with_dirty_pieces(m, f"wb-fail-{broken}", 2, 10, 65536)
    assert cache_stats(m)["dirty_bytes"] > 0
    target = cache_dir / broken
    subprocess.run(["chattr", "+i", str(target)], check=True)
    try:
        rnd = random.Random(11)
        for _ in range(40):
            o = rnd.randrange(0, 2 << 20, 8192)
            new = os.urandom(8192)
            direct_write(f, o, new)
            data[o:o + 8192] = new
        # fsync: a broken cache cannot make the writes durable there (its
        # commit fails), so they go to the server, and fsync succeeds.
        fd = os.open(f, os.O_WRONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        st = cache_stats(m)
        assert st["device_errors"] >= 1 and st["state"] in ("degraded", "out"), st
        for _ in range(5):  # the cache takes no new writes now
            o = rnd.randrange(0, 2 << 20, 8192)
            new = os.urandom(8192)
            direct_write(f, o, new)
            data[o:o + 8192] = new
        st = cache_stats(m)
        assert st["writes_around"] >= 1, st
        assert direct_read(f, 0, 2 << 20) == data
        deadline = time.time() + 20  # a cache out of service is drained at once
        while cache_stats(m)["dirty_bytes"] > 0 and time.time() < deadline:
            time.sleep(0.2)
        assert cache_stats(m)["dirty_bytes"] == 0
        assert server_bytes(f.name) == bytes(data)
        assert "cache disk error" in m.log_text()
    finally:
        subprocess.run(["chattr", "-i", str(target)], check=False)
    m.unmount()
    assert not owner_record()
    m2 = mount_factory(wb_opts(cache_dir))
    assert hashlib.md5((m2.path / f.name).read_bytes()).digest() == hashlib.md5(data).digest()


def test_flushes_write_as_the_user_who_wrote(mount_factory, cache_dir, tmp_path):
    """A file only a supplementary group may write: the flusher, long after
    the write returned, writes it with that user's uid, gid and groups."""
    m = mount_factory(wb_opts(cache_dir, "allow_other"))
    d = m.path / "wb-users"
    d.mkdir()
    os.chmod(d, 0o777)
    f = d / "group-writable"
    data = bytearray(random.Random(12).randbytes(1 << 20))
    f.write_bytes(data)
    os.chown(f, 0, 20010)
    os.chmod(f, 0o664)
    new = os.urandom(8192)
    script = f"import os; fd = os.open({str(f)!r}, os.O_WRONLY); os.pwrite(fd, {new!r}, 65536)"
    r = subprocess.run(["setpriv", "--reuid=20002", "--regid=20002", "--groups=20010",
                        sys.executable, "-c", script], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    data[65536:65536 + 8192] = new
    assert cache_stats(m)["dirty_bytes"] > 0
    r = ctl(m, "cache", "flush")
    assert r.returncode == 0, r.stdout + r.stderr
    assert server_bytes(f"wb-users/{f.name}") == bytes(data)


def wait_for_log(m, text, timeout=60):
    deadline = time.time() + timeout
    while text not in m.log_text():
        assert m.proc.poll() is None and time.time() < deadline, m.log_text()
        time.sleep(0.1)


def test_unmount_and_mount_again_at_once(bed, mount_factory, cache_dir):
    """A script that unmounts and mounts again at once: the unmount returns
    while the gateway still flushes (a slow link here), and the new mount
    waits for it to release the cache directory instead of failing."""
    m = mount_factory(wb_opts(cache_dir))
    f, data = file_with_dirty_pieces(m, "wb-remount", 8, 14, 16384)
    assert cache_stats(m)["dirty_bytes"] >= 4 << 20
    bed.shape(1, "16mbit")
    again = None
    try:
        assert subprocess.run(["fusermount3", "-u", str(m.path)]).returncode == 0
        assert m.proc.poll() is None, "the gateway should still be flushing"
        proc, log = start_mount(m.path, wb_opts(cache_dir))
        again = Mount(m.path, proc, log)
        deadline = time.time() + 120
        while not is_mounted(m.path) and proc.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        assert is_mounted(m.path), again.log_text()
        assert "is in use by another mount" in again.log_text()
    finally:
        bed.shape(1, "off")
        if again:
            again.unmount()
    assert m.proc.wait(timeout=60) == 0
    assert server_bytes(f.name) == bytes(data)


def test_sigterm_ends_a_flush_to_a_server_that_is_gone(bed, mount_factory, cache_dir):
    """At unmount the gateway flushes; with the server unreachable a hard
    mount would wait for ever. SIGTERM ends it at once, the unflushed writes
    stay in the cache, and the next mount flushes them."""
    m = mount_factory(wb_opts(cache_dir))
    f, data = file_with_dirty_pieces(m, "wb-sigterm", 2, 15, 65536)
    assert cache_stats(m)["dirty_bytes"] > 0
    bed.link("down", 1)
    try:
        r = subprocess.run(["fusermount3", "-u", str(m.path)], capture_output=True)
        if r.returncode != 0:
            subprocess.run(["umount", "-l", str(m.path)], check=True)
        wait_for_log(m, "flushing")  # now stuck: the server is gone
        os.kill(m.pid, signal.SIGTERM)
        try:
            m.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("the gateway ignored SIGTERM while flushing:\n" + m.log_text())
        assert "stay in" in m.log_text(), m.log_text()
    finally:
        bed.link("up", 1)
    assert owner_record()  # still claimed: the cache holds unflushed writes
    assert server_bytes(f.name) != bytes(data)
    m2 = mount_factory(wb_opts(cache_dir))
    assert "left by an earlier mount" in m2.log_text()
    assert server_bytes(f.name) == bytes(data)


def test_a_stop_signal_during_the_unmount_is_not_lost(bed, mount_factory, cache_dir):
    """A stop signal at any point of a write-back unmount ends it in order:
    one that comes while the unmount waits for a control command still
    running (a `cache flush` to a server that is gone) is neither lost nor
    fatal; the flush at unmount stops at once and the unflushed writes stay
    in the cache."""
    m = mount_factory(wb_opts(cache_dir))
    f, data = file_with_dirty_pieces(m, "wb-sigterm2", 1, 16, 65536)
    assert cache_stats(m)["dirty_bytes"] > 0
    bed.link("down", 1)
    flush = None
    try:
        flush = subprocess.Popen([CTL, "cache", "flush", str(m.path)], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        time.sleep(1)  # the command waits for the server
        r = subprocess.run(["fusermount3", "-u", str(m.path)], capture_output=True)
        if r.returncode != 0:
            subprocess.run(["umount", "-l", str(m.path)], check=True)
        time.sleep(2)  # the unmount waits (10 s at most) for the command
        assert m.proc.poll() is None, m.log_text()
        os.kill(m.pid, signal.SIGTERM)
        try:
            m.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("the gateway lost a SIGTERM sent during its unmount:\n" + m.log_text())
        assert m.proc.returncode == 0, f"ended by the signal ({m.proc.returncode}):\n{m.log_text()}"
        assert "stopping the flush at unmount" in m.log_text(), m.log_text()
        assert "stay in" in m.log_text(), m.log_text()
    finally:
        bed.link("up", 1)
        if flush is not None:
            flush.kill()
            flush.wait()
    m2 = mount_factory(wb_opts(cache_dir))
    assert "left by an earlier mount" in m2.log_text()
    assert server_bytes(f.name) == bytes(data)


@pytest.mark.parametrize("mode", [0o4777, 0o2777])
def test_a_users_write_clears_setuid_and_setgid_at_once(mount_factory, cache_dir, mode):
    """As on a local filesystem, a write by a user other than root clears the
    setuid and setgid bits when it is taken, not when the cache is flushed
    (pjdfstest chmod/12.t), even over unflushed writes of root's."""
    m = mount_factory(wb_opts(cache_dir, "allow_other"))
    d = m.path / "wb-suid"
    d.mkdir(exist_ok=True)
    os.chmod(d, 0o777)
    f = d / f"prog-{mode:o}"
    f.write_bytes(b"\0" * 8192)  # in the cache, unflushed
    os.chmod(f, mode)
    assert os.stat(f).st_mode & 0o7777 == mode
    script = f"import os; fd = os.open({str(f)!r}, os.O_WRONLY); os.pwrite(fd, b'u' * 100, 4000)"
    r = subprocess.run(["setpriv", "--reuid=20002", "--regid=20002", "--clear-groups",
                        sys.executable, "-c", script], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert os.stat(f).st_mode & 0o7777 == 0o777
    assert os.stat(os.path.join(EXPORT, "wb-suid", f.name)).st_mode & 0o7777 == 0o777
    assert f.read_bytes() == b"\0" * 4000 + b"u" * 100 + b"\0" * 4092


def test_a_read_racing_a_truncate_never_brings_the_cut_data_back(mount_factory, cache_dir):
    """fsx (seed 4105, cache_block=64) READ BAD DATA: a read that reaches the
    server before a truncate's SETATTR but starts after the cache forgot the
    file filled the cut pages; a partial write past the new size then merged
    with them and the flusher wrote the cut bytes back. A reader thread keeps
    block 1 coming from the server while the truncates go."""
    import threading
    m = mount_factory(wb_opts(cache_dir))
    f = m.path / "trunc-race"
    fd = os.open(f, os.O_RDWR | os.O_CREAT, 0o644)
    stop = threading.Event()

    def reader():
        rfd = os.open(f, os.O_RDONLY)
        while not stop.is_set():
            os.posix_fadvise(rfd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.pread(rfd, 0x10000, 0x10000)
        os.close(rfd)

    t = threading.Thread(target=reader)
    t.start()
    bad = []
    try:
        for i in range(300):
            os.pwrite(fd, bytes([i % 255 + 1]) * (0x20497 - 0x10000), 0x10000)
            os.ftruncate(fd, 0x152ad)
            os.pwrite(fd, b"h" * PAGE, 0x3c000)  # past the end: a hole in between
            os.pwrite(fd, b"w" * (0x16b3a - 0x15800), 0x15800)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            got = os.pread(fd, 0x2d53, 0x152ad)
            want = b"\0" * (0x15800 - 0x152ad) + b"w" * (0x16b3a - 0x15800) + b"\0" * (0x18000 - 0x16b3a)
            if got != want:
                bad.append(i)
            os.ftruncate(fd, 0)
    finally:
        stop.set()
        t.join()
        os.close(fd)
    assert not bad, f"cut data came back in {len(bad)} of 300 rounds: {bad[:10]}"
