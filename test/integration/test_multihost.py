"""Many clients on one export: two gateways mounted on the same Ganesha
export, as two hosts would mount it, each with its own caches."""
import os
import subprocess

import pytest

from conftest import SERVER

MODES = {
    "default": "",
    "direct_io": "direct_io",
    "kernel_cache": "kernel_cache",
    "cache_readonly": "cache_mode=readonly",
    "cache_writethrough": "cache_mode=writethrough",
}


def cache_opts(mode, tmp_path, who):
    opts = MODES[mode]
    if mode.startswith("cache_"):
        d = tmp_path / f"cache-{who}"
        d.mkdir()
        opts += f",cache_dir={d},cache_size=64M"
    return opts


@pytest.mark.parametrize("mode", list(MODES))
def test_appends_from_two_gateways_with_a_close_between_each_lose_nothing(mount_factory, tmp_path, mode):
    """Close-to-open: each append opens the file, which asks the server for
    its attributes, so the append lands after the other gateway's last one
    (closed, hence on the server). 2 x 500 appends, alternating: every line
    is in the file once, in order."""
    a = mount_factory(cache_opts(mode, tmp_path, "a"))
    b = mount_factory(cache_opts(mode, tmp_path, "b"))
    name = f"log-{mode}"
    (a.path / name).write_bytes(b"")
    script = f"for i in $(seq 1 500); do echo A$i >> {a.path}/{name}; echo B$i >> {b.path}/{name}; done"
    subprocess.run(["sh", "-c", script], check=True, timeout=300)
    want = [f"{w}{i}" for i in range(1, 501) for w in "AB"]
    for m in (a, b):
        with open(m.path / name) as f:
            got = f.read().splitlines()
        assert got == want, f"{len(want) - len(set(got) & set(want))} of {len(want)} lines lost through {m.path}"


def test_a_name_another_gateway_creates_is_seen_as_lookupcache_says(mount_factory):
    """B looks a name up and does not find it; A creates it. With
    lookupcache=all B's kernel keeps the miss (acdirmin, 30 s here); with
    positive it asks again at once and finds the file."""
    a = mount_factory()
    b_all = mount_factory()
    b_pos = mount_factory("lookupcache=positive")
    for b in (b_all, b_pos):
        assert not (b.path / "new-name").exists()
    (a.path / "new-name").write_text("here")
    assert not (b_all.path / "new-name").exists(), "lookupcache=all: the miss was not cached"
    assert (b_pos.path / "new-name").read_text() == "here"


def test_renames_and_removals_by_another_gateway_are_seen_at_once_with_lookupcache_none(mount_factory):
    """B has found two names; A renames one and removes the other. With
    lookupcache=positive B's kernel still leads the old names to the files
    (for acdirmin); with none each lookup asks the server, so the old names
    are gone at once and the new one is there."""
    a = mount_factory()
    b_pos = mount_factory("lookupcache=positive")
    b_none = mount_factory("lookupcache=none")
    (a.path / "old").write_text("moved")
    (a.path / "doomed").write_text("x")
    for b in (b_pos, b_none):
        assert (b.path / "old").read_text() == "moved"
        assert (b.path / "doomed").exists()
    os.rename(a.path / "old", a.path / "new")
    os.unlink(a.path / "doomed")
    assert (b_pos.path / "old").exists(), "lookupcache=positive: the name found was not cached"
    assert not (b_none.path / "old").exists()
    assert not (b_none.path / "doomed").exists()
    assert (b_none.path / "new").read_text() == "moved"
