"""The kernel's page cache on a mpnfs mount (mpnfs(8), cto and kernel_cache).

A default mount keeps close-to-open consistency through the kernel's cache:
another client's change is seen at the next open, and the kernel drops a
file's pages whenever the attributes it fetches show a new mtime, this
client's own writes included, so they are read again from the server.
With kernel_cache (the data changes only through this mount) the kernel
keeps them across this client's own writes, stats and reopens."""
import os
import time

import pytest

from test_stats import settle

SIZE = 1 << 20
PAGE = 8192


def fresh(m, name):
    """A directory of this test's own on the mount, and a path in it."""
    d = m.path / f"kc-{os.getpid()}-{time.monotonic_ns()}"
    d.mkdir()
    return d / name


def reads(m):
    return settle(m)["ops"].get("READ", {}).get("ops", 0)


def rewrite_stat_reread(path):
    """A database's pattern: rewrite a page, look at the size, read the other
    pages, then open the file again and read all of it."""
    time.sleep(0.05)  # past the server clock's tick: the write moves mtime
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, b"w" * PAGE, 5 * PAGE)
        os.fstat(fd)
        for off in range(0, SIZE, PAGE):
            os.pread(fd, PAGE, off)
    finally:
        os.close(fd)
    with open(path, "rb") as f:
        return f.read()


@pytest.mark.parametrize("opts", ["", "kernel_cache"])
def test_own_writes_keep_the_kernels_pages_only_with_kernel_cache(mount_factory, opts):
    m = mount_factory(opts)
    p = fresh(m, "pages")
    data = bytearray(os.urandom(SIZE))
    p.write_bytes(data)
    assert p.read_bytes() == data  # every page in the kernel's cache now
    n0 = reads(m)
    got = rewrite_stat_reread(p)
    data[5 * PAGE:6 * PAGE] = b"w" * PAGE
    assert got == data
    n = reads(m) - n0
    if opts == "kernel_cache":
        assert n == 0, f"{n} READ calls for pages the kernel held"
    else:
        assert n > 0, "the default mount kept pages across a new mtime"


def test_another_clients_change_is_seen_at_the_next_open_through_the_page_cache(mount_factory):
    a = mount_factory()
    b = mount_factory()  # another client
    p = fresh(a, "shared")
    data = os.urandom(SIZE)
    p.write_bytes(data)
    assert p.read_bytes() == data
    assert p.read_bytes() == data  # from the kernel's cache
    # Another size too, so that the change shows whatever the server
    # clock's resolution.
    new = os.urandom(SIZE + PAGE)
    (b.path / p.parent.name / p.name).write_bytes(new)
    assert p.read_bytes() == new


def test_truncation_by_this_client_drops_the_pages_with_kernel_cache(mount_factory):
    m = mount_factory("kernel_cache")
    p = fresh(m, "trunc")
    data = os.urandom(SIZE)
    p.write_bytes(data)
    assert p.read_bytes() == data
    os.truncate(p, SIZE // 2)
    assert p.read_bytes() == data[:SIZE // 2]
    with open(p, "r+b") as f:  # cached pages past the end must not come back
        f.truncate(SIZE)
        f.seek(0)
        assert f.read() == data[:SIZE // 2] + bytes(SIZE // 2)
    short = os.urandom(PAGE)
    with open(p, "wb") as f:  # O_TRUNC at open
        f.write(short)
    assert p.read_bytes() == short
    with open(p, "r+b") as f:
        f.truncate(SIZE)
        assert f.read() == short + bytes(SIZE - PAGE)
