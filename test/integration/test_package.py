"""The Debian package (contrib/package.sh) as an admin uses it: installed
with apt, the export mounted through an /etc/fstab line of type mpnfs with
`mount DIR`, unmounted, purged; nothing of it is left behind.

Runs when MPNFS_IT_DEB names the package file (contrib/test.sh builds it);
it installs to and removes from the system, so it refuses to run over an
mpnfs package installed by someone else."""
import os
import pathlib
import subprocess
import time

import pytest

from conftest import EXPORT, SERVER, is_mounted

DEB = os.environ.get("MPNFS_IT_DEB", "")
FSTAB = pathlib.Path("/etc/fstab")
MARK = "# mpnfs package test"


def run(*args, check=True, timeout=300):
    r = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    if check:
        assert r.returncode == 0, f"{args}: {r.stdout}\n{r.stderr}"
    return r


def installed():
    r = run("dpkg-query", "-W", "-f=${Status}", "mpnfs", check=False)
    return r.returncode == 0 and "install ok installed" in r.stdout


def present():
    """What dpkg knows of the package at all (installed, or config left)."""
    return run("dpkg-query", "-W", "-f=${Status}", "mpnfs", check=False).returncode == 0


@pytest.mark.skipif(not DEB, reason="MPNFS_IT_DEB names no package file")
def test_package_installs_mounts_from_fstab_and_purges_clean(bed, tmp_path):
    if present():
        pytest.skip("an mpnfs package is on this system already")
    for p in ("/usr/sbin/mpnfs", "/sbin/mount.mpnfs", "/usr/local/sbin/mpnfs"):
        if os.path.lexists(p):
            pytest.skip(f"{p} exists already")
    fstab_before = FSTAB.read_text()
    mp = tmp_path / "pkg"
    mp.mkdir()
    files = []
    try:
        run("apt-get", "install", "-y", "--no-install-recommends", os.path.abspath(DEB))
        assert installed()
        files = run("dpkg", "-L", "mpnfs").stdout.split()
        for f in ("/usr/sbin/mpnfs", "/usr/sbin/mpnfsctl", "/usr/sbin/mount.mpnfs",
                  "/usr/share/man/man8/mpnfs.8.gz", "/usr/share/man/man8/mpnfsctl.8.gz",
                  "/usr/share/man/man8/mount.mpnfs.8.gz", "/usr/share/man/man5/mpnfstab.5.gz",
                  "/usr/share/doc/mpnfs/examples/mpnfstab.example"):
            assert f in files, f"{f} not in the package: {files}"
            assert os.path.lexists(f), f
        assert "mpnfsctl" in run("man", "-w", "mpnfsctl").stdout
        assert "mpnfs.8" in run("man", "-w", "mount.mpnfs").stdout
        FSTAB.write_text(fstab_before + f"{SERVER}:{EXPORT} {mp} mpnfs "
                         f"_netdev,nofail,mountport=20048,hard 0 0 {MARK}\n")
        run("mount", str(mp))
        assert is_mounted(mp)
        (mp / "from-the-package").write_text("ok")
        assert (mp / "from-the-package").read_text() == "ok"
        assert '"connections"' in run("mpnfsctl", "stats", str(mp)).stdout
        run("umount", str(mp))
        for _ in range(150):
            if run("pgrep", "-f", f"mpnfs .*{mp}", check=False).returncode != 0:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("mpnfs still running after umount")
    finally:
        if is_mounted(mp):
            run("umount", "-l", str(mp), check=False)
        FSTAB.write_text(fstab_before)
        if present():
            run("apt-get", "purge", "-y", "mpnfs", check=False)
    assert not present(), "dpkg still knows mpnfs after the purge"
    left = [f for f in files if os.path.lexists(f) and not os.path.isdir(f)]
    assert not left, f"left behind: {left}"
    assert not os.path.exists("/var/lib/mpnfs"), "the lock state directory outlived the purge"
