"""The SSD cache tier (cache_dir=, cache_mode=readonly|writethrough; write-back is in
test_writeback.py): data
read back equals data written, through remounts (a warm cache), sequential
bypass, eviction at capacity, a damaged cache page detected and not served,
another client's change seen at the next open, a cache filesystem too small,
and bad cache settings refused."""
import hashlib
import json
import mmap
import os
import random
import subprocess

import pytest

from conftest import BIN, EXPORT, SERVER, run_mount

CTL = os.path.join(os.path.dirname(BIN), "mpnfsctl")
CHUNK = 64 << 10


def cache_stats(m):
    r = subprocess.run([CTL, "stats", str(m.path)], capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["cache"]


def direct_read(path, off, n):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        buf = mmap.mmap(-1, n)
        got = os.preadv(fd, [buf], off)
        return bytes(buf[:got])
    finally:
        os.close(fd)


def direct_write(path, off, data):
    fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
    try:
        buf = mmap.mmap(-1, len(data))
        buf.write(data)
        assert os.pwritev(fd, [buf], off) == len(data)
    finally:
        os.close(fd)


@pytest.fixture
def cache_dir(tmp_path):
    d = tmp_path / "cache"
    d.mkdir()
    return d


def make_file(path, mib, seed=1):
    rnd = random.Random(seed)
    data = rnd.randbytes(mib << 20)
    with open(path, "wb") as f:
        f.write(data)
    return data


@pytest.mark.parametrize("mode", ["readonly", "writethrough"])
def test_data_reads_back_through_remounts(mount_factory, cache_dir, mode):
    opts = f"cache_dir={cache_dir},cache_size=64M,cache_mode={mode}"
    m = mount_factory(opts)
    f = m.path / f"db-{mode}"
    data = bytearray(make_file(f, 16))
    offs = random.Random(2).sample(range(0, 16 << 20, CHUNK), 64)
    for o in offs:
        assert direct_read(f, o, CHUNK) == data[o:o + CHUNK]
    first = cache_stats(m)
    assert first["mode"] == mode and first["read_misses"] >= 64
    for o in offs:
        assert direct_read(f, o, CHUNK) == data[o:o + CHUNK]
    second = cache_stats(m)
    assert second["read_hits"] - first["read_hits"] == 64, second
    # Random writes: the new data is what is read back (from the cache in writethrough).
    for o in offs[:16]:
        new = random.Random(o).randbytes(CHUNK)
        direct_write(f, o, new)
        data[o:o + CHUNK] = new
    for o in offs:
        assert direct_read(f, o, CHUNK) == data[o:o + CHUNK]
    m.unmount()

    m2 = mount_factory(opts)
    warm = cache_stats(m2)
    assert warm["slots_used"] > 0
    for o in offs:
        assert direct_read(m2.path / f.name, o, CHUNK) == data[o:o + CHUNK]
    after = cache_stats(m2)
    assert after["read_hits"] >= 48, after  # the blocks were kept across the remount
    if mode == "writethrough":
        assert after["read_hits"] == 64, after
    with open(os.path.join(EXPORT, f.name), "rb") as g:
        assert hashlib.md5(g.read()).hexdigest() == hashlib.md5(data).hexdigest()


def test_sequential_streams_bypass_the_cache(mount_factory, cache_dir):
    m = mount_factory(f"cache_dir={cache_dir},cache_size=64M,seq_cutoff=4")
    f = m.path / "scan"
    data = make_file(f, 32, seed=3)
    assert hashlib.md5(f.read_bytes()).digest() == hashlib.md5(data).digest()
    st = cache_stats(m)
    assert st["read_bypasses"] > 0 and st["write_bypasses"] > 0, st
    # A readonly cache stores what is read, not what is written: the read
    # run before the cutoff (4 MiB) and a request or two that arrive further
    # behind the run than the slack (block_cache_test
    # AStragglerDoesNotRestartTheStreamsRun, AFileWrittenThenReadBackIsTwoStreams).
    # Without the bypass the whole 32 MiB file would be cached.
    assert st["used_bytes"] <= 6 << 20, st


def test_capacity_is_bounded_with_eviction(mount_factory, cache_dir):
    m = mount_factory(f"cache_dir={cache_dir},cache_size=4M,cache_block=256")
    f = m.path / "big"
    data = make_file(f, 32, seed=4)
    offs = random.Random(5).sample(range(0, 32 << 20, CHUNK), 200)
    for o in offs:
        assert direct_read(f, o, CHUNK) == data[o:o + CHUNK]
    st = cache_stats(m)
    assert st["slots"] == 16 and st["slots_used"] == 16 and st["evictions"] > 0, st
    assert st["capacity_bytes"] == 4 << 20


def test_a_damaged_cache_page_is_not_served(mount_factory, cache_dir):
    opts = f"cache_dir={cache_dir},cache_size=16M,cache_block=64"
    m = mount_factory(opts)
    f = m.path / "damaged"
    data = make_file(f, 1, seed=6)
    for o in range(0, 1 << 20, CHUNK):
        assert direct_read(f, o, CHUNK) == data[o:o + CHUNK]
    m.unmount()
    # Damage every slot's pages on disk.
    with open(cache_dir / "data", "r+b") as g:
        for slot in range(16):
            g.seek(slot * CHUNK + 5000)
            g.write(b"\xff" * 64)
    m2 = mount_factory(opts)
    for o in range(0, 1 << 20, CHUNK):
        assert direct_read(m2.path / "damaged", o, CHUNK) == data[o:o + CHUNK]
    st = cache_stats(m2)
    assert st["checksum_failures"] >= 1, st


@pytest.mark.parametrize("mode", ["readonly", "writethrough"])
def test_another_clients_change_is_seen_at_the_next_open(mount_factory, cache_dir, mode):
    a = mount_factory(f"cache_dir={cache_dir},cache_size=16M,cache_mode={mode}")
    b = mount_factory()  # another client, no cache
    f = a.path / f"shared-{mode}"
    data = make_file(f, 1, seed=7)
    assert direct_read(f, 0, CHUNK) == data[:CHUNK]
    assert direct_read(f, 0, CHUNK) == data[:CHUNK]  # now from the cache
    new = os.urandom(CHUNK)
    direct_write(b.path / f.name, 0, new)
    assert direct_read(f, 0, CHUNK) == new  # a new open revalidates
    assert cache_stats(a)["files_dropped"] >= 1


def test_a_small_cache_filesystem_lowers_the_size(mount_factory, tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    # (mode: a cache_dir only its owner can write; a tmpfs root is 1777 by default)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m,mode=0755", "tmpfs", str(small)], check=True)
    try:
        m = mount_factory(f"cache_dir={small},cache_size=1G")
        st = cache_stats(m)
        assert 8 << 20 <= st["capacity_bytes"] < 24 << 20, st
        f = m.path / "fits"
        data = make_file(f, 32, seed=8)
        for o in random.Random(9).sample(range(0, 32 << 20, CHUNK), 300):
            assert direct_read(f, o, CHUNK) == data[o:o + CHUNK]
        assert "cache_size lowered" in m.log_text()
        m.unmount()
        assert int(subprocess.run(["df", "--output=avail", "-B1", str(small)], capture_output=True,
                                  text=True).stdout.split()[-1]) > 0
    finally:
        subprocess.run(["umount", str(small)], check=False)


def test_bad_cache_settings_refuse_to_mount_unless_optional(bed, mount_factory, tmp_path, cache_dir):
    def try_mount(opts):
        return run_mount(tmp_path, f"{SERVER}:{EXPORT}", f"mountport=20048,{opts}")[0]

    r = try_mount(f"cache_dir={tmp_path}/missing")
    assert r.returncode == 32 and "not a directory" in r.stderr, r.stderr
    r = try_mount("cache_mode=fast,cache_dir=/tmp")
    assert r.returncode == 1 and "cache_mode=" in r.stderr, r.stderr
    r = try_mount(f"cache_dir={cache_dir},dirty_age=5")
    assert r.returncode == 1 and "cache_mode=writeback" in r.stderr, r.stderr
    held = mount_factory(f"cache_dir={cache_dir}")
    # A directory in use is waited for, up to mount_timeout.
    r = try_mount(f"cache_dir={cache_dir},mount_timeout=2")
    assert r.returncode == 32 and "in use by another mount" in r.stderr, r.stderr
    assert "did not release it within 2 s" in r.stderr, r.stderr
    # cache_optional: mounts without the cache, says so.
    m = mount_factory(f"cache_dir={cache_dir},cache_optional,mount_timeout=2")
    (m.path / "optional").write_bytes(b"ok")
    assert "running without the SSD cache" in m.log_text()
    r = subprocess.run([CTL, "stats", str(m.path)], capture_output=True, text=True, timeout=10)
    assert "cache" not in json.loads(r.stdout)
    held.unmount()


def test_online_drop_flush_detach(mount_factory, cache_dir, tmp_path):
    m = mount_factory(f"cache_dir={cache_dir},cache_size=16M")
    f = m.path / "online"
    data = make_file(f, 2, seed=10)
    for o in range(0, 2 << 20, CHUNK):
        assert direct_read(f, o, CHUNK) == data[o:o + CHUNK]
    assert cache_stats(m)["slots_used"] > 0

    def ctl(*args, user=None):
        pre = ["setpriv", "--reuid", str(user), "--regid", str(user), "--clear-groups"] if user else []
        return subprocess.run(pre + [CTL, *args, str(m.path)], capture_output=True, text=True,
                              timeout=30)

    r = ctl("cache", "drop", user=20001)  # statistics are for everyone, changes for root
    assert r.returncode == 1 and "only root" in r.stderr, r.stderr
    assert ctl("stats", user=20001).returncode == 0
    r = ctl("cache", "drop")
    assert r.returncode == 0 and "dropped" in r.stdout, r.stderr
    assert cache_stats(m)["slots_used"] == 0
    r = ctl("cache", "flush")
    assert r.returncode == 0 and "nothing to flush" in r.stdout
    assert direct_read(f, 0, CHUNK) == data[:CHUNK]
    r = ctl("cache", "detach")
    assert r.returncode == 0 and "detached" in r.stdout, r.stderr
    r = ctl("stats")
    assert "cache" not in json.loads(r.stdout)
    for o in range(0, 2 << 20, CHUNK):
        assert direct_read(f, o, CHUNK) == data[o:o + CHUNK]
    assert ctl("cache", "drop").returncode == 1  # no cache any more
    # The directory is free again: another mount can take it.
    m2 = mount_factory(f"cache_dir={cache_dir},cache_size=16M")
    assert cache_stats(m2)["state"] == "healthy"


@pytest.mark.parametrize("plant", ["mode-0777", "data-symlink"])
def test_a_cache_dir_others_could_tamper_with_is_refused(bed, tmp_path, plant):
    """A cache directory other users can write to, or with a link planted
    where a cache file goes, is refused with a message saying why; the
    link's target is not touched and nothing is created in the directory."""
    cache = tmp_path / "untrusted"
    cache.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    if plant == "mode-0777":
        os.chmod(cache, 0o777)
        want = "writable by other users (mode 0777"
    else:
        (cache / "data").symlink_to(victim)
        want = "data in it is a symbolic link"
    before = sorted(p.name for p in cache.iterdir())
    r, _ = run_mount(tmp_path, f"{SERVER}:{EXPORT}", f"mountport=20048,cache_dir={cache}")
    assert r.returncode == 32, r.stderr
    assert want in r.stderr and "refusing it" in r.stderr, r.stderr
    assert victim.read_bytes() == b"precious"
    assert sorted(p.name for p in cache.iterdir()) == before
