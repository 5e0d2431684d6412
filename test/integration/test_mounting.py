"""mount(8) and /etc/fstab: type fuse.mpnfs (through mount.fuse3) and type
mpnfs (mount.mpnfs, mpnfs called as mount(8)'s helper)."""
import os
import subprocess
import time

from conftest import BIN, EXPORT, SERVER, is_mounted


import pytest

LINK = "/usr/local/sbin/mpnfs"
HELPER = "/sbin/mount.mpnfs"  # where mount(8) looks for the helper of type mpnfs


def bin_at(path):
    """A fixture's body: mpnfs at `path` for the test, unless an installed one
    is there already (then the test runs with that, if it is this build)."""
    created = False
    if not os.path.lexists(path):
        os.symlink(BIN, path)
        created = True
    elif os.path.realpath(path) != os.path.realpath(BIN):
        pytest.skip(f"{path} is another installed mpnfs")
    yield path
    if created:
        os.unlink(path)


@pytest.fixture(autouse=True)
def mpnfs_in_path():
    """mount(8) runs mount.fuse3 with a clean PATH: put mpnfs where it looks."""
    yield from bin_at(LINK)


def env_with_mpnfs():
    return dict(os.environ)


def wait_daemon_gone(mp):
    for _ in range(150):
        if subprocess.run(["pgrep", "-f", f"mpnfs .*{mp}"], capture_output=True).returncode != 0:
            return
        time.sleep(0.1)
    raise AssertionError("mpnfs still running after unmount")


def test_mount_t_fuse_mpnfs(bed, tmp_path):
    mp = tmp_path / "mt"
    mp.mkdir()
    r = subprocess.run(["mount", "-t", "fuse.mpnfs", "-o", "mountport=20048,_netdev,nofail",
                        f"{SERVER}:{EXPORT}", str(mp)], capture_output=True, text=True,
                       env=env_with_mpnfs(), timeout=60)
    try:
        assert r.returncode == 0, r.stderr
        assert is_mounted(mp)
        (mp / "via-mount-t").write_text("ok")
        assert (mp / "via-mount-t").read_text() == "ok"
    finally:
        subprocess.run(["umount", str(mp)])
    wait_daemon_gone(mp)


def test_fstab_line_with_fstab_only_options(bed, tmp_path):
    mp = tmp_path / "fst"
    mp.mkdir()
    fstab = tmp_path / "fstab"
    fstab.write_text(f"{SERVER}:{EXPORT} {mp} fuse.mpnfs "
                     "_netdev,nofail,noauto,x-systemd.automount,x-systemd.mount-timeout=30,"
                     "mountport=20048,allow_other,hard,timeo=100 0 0\n")
    r = subprocess.run(["mount", "-T", str(fstab), str(mp)], capture_output=True, text=True,
                       env=env_with_mpnfs(), timeout=60)
    try:
        assert r.returncode == 0, r.stderr
        assert is_mounted(mp)
        opts = [l for l in open("/proc/self/mounts") if f" {mp} " in l][0]
        assert "fuse.mpnfs" in opts and "allow_other" in opts
    finally:
        subprocess.run(["umount", str(mp)])
    wait_daemon_gone(mp)


@pytest.fixture
def mount_helper():
    """mount.mpnfs where mount(8) looks for it."""
    yield from bin_at(HELPER)


def test_mount_t_mpnfs_and_an_fstab_line_of_type_mpnfs(bed, tmp_path, mount_helper):
    mp = tmp_path / "t"
    mp.mkdir()
    r = subprocess.run(["mount", "-v", "-t", "mpnfs", "-o", "mountport=20048,_netdev",
                        f"{SERVER}:{EXPORT}", str(mp)], capture_output=True, text=True, timeout=60)
    try:
        assert r.returncode == 0, r.stderr
        assert f"mounting {SERVER}:{EXPORT} on {mp}" in r.stderr, r.stderr
        assert is_mounted(mp)
        (mp / "via-mount-t-mpnfs").write_text("ok")
        assert (mp / "via-mount-t-mpnfs").read_text() == "ok"
    finally:
        subprocess.run(["umount", str(mp)])
    wait_daemon_gone(mp)
    fstab = tmp_path / "fstab"
    fstab.write_text(f"{SERVER}:{EXPORT} {mp} mpnfs _netdev,nofail,mountport=20048,hard 0 0\n")
    r = subprocess.run(["mount", "-T", str(fstab), str(mp)], capture_output=True, text=True, timeout=60)
    try:
        assert r.returncode == 0, r.stderr
        assert (mp / "via-mount-t-mpnfs").read_text() == "ok"
    finally:
        subprocess.run(["umount", str(mp)])
    wait_daemon_gone(mp)


def test_mount_helper_fake_sloppy_and_remount(bed, tmp_path, mount_helper):
    mp = tmp_path / "h"
    mp.mkdir()
    src = f"{SERVER}:{EXPORT}"
    # -f: everything checked, nothing mounted.
    r = subprocess.run([HELPER, src, str(mp), "-fv", "-o", "mountport=20048"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "would mount" in r.stderr, r.stderr
    assert not is_mounted(mp)
    r = subprocess.run([HELPER, src, str(mp), "-f", "-o", "frobnicate"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0 and "frobnicate" in r.stderr, r.stderr
    # -s: unknown options (an nfs(5) one here) are named and ignored.
    r = subprocess.run([HELPER, src, str(mp), "-s", "-o", "mountport=20048,vers=3"],
                       capture_output=True, text=True, timeout=60)
    try:
        assert r.returncode == 0, r.stderr
        assert "ignoring unknown options (sloppy): vers=3" in r.stderr, r.stderr
        assert is_mounted(mp)
        r = subprocess.run(["mount", "-o", "remount,mountport=20048", "-t", "mpnfs", src, str(mp)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "remount is not supported" in r.stderr, r.stderr
        assert is_mounted(mp)
    finally:
        subprocess.run(["umount", str(mp)])
    wait_daemon_gone(mp)
    r = subprocess.run([HELPER, src, str(mp), "-o", "mountport=20048,remount"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0 and "remount is not supported" in r.stderr, r.stderr
