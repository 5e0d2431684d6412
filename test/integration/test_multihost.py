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
