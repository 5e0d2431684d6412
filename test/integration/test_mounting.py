"""mount(8) and /etc/fstab integration through mount.fuse3."""
import os
import subprocess
import time

from conftest import BIN, EXPORT, SERVER, is_mounted


import pytest

LINK = "/usr/local/sbin/mpnfs"


@pytest.fixture(autouse=True)
def mpnfs_in_path():
    """mount(8) runs mount.fuse3 with a clean PATH: put mpnfs where it looks,
    unless an installed one is there already."""
    created = False
    if not os.path.exists(LINK):
        os.symlink(BIN, LINK)
        created = True
    elif os.path.realpath(LINK) != os.path.realpath(BIN):
        pytest.skip(f"{LINK} is another installed mpnfs")
    yield
    if created:
        os.unlink(LINK)


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
