"""The Debian package (contrib/package.sh) as an admin uses it: installed
with apt, the export mounted through an /etc/fstab line with `mount DIR`
(type mpnfs, then fuse.mpnfs), unmounted, purged; nothing of it is left
behind.

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
FSTAB = pathlib.Path(os.path.realpath("/etc/fstab"))
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


def set_fstab(line=None):
    """/etc/fstab without this test's line (one a killed run left included),
    plus `line` if given; replaced in one rename, never half written."""
    kept = [l for l in FSTAB.read_text().splitlines(keepends=True) if MARK not in l]
    if line:
        kept.append(f"{line} {MARK}\n")
    tmp = FSTAB.with_name(FSTAB.name + ".mpnfs-test")
    tmp.write_text("".join(kept))
    os.chmod(tmp, FSTAB.stat().st_mode & 0o7777)
    os.replace(tmp, FSTAB)


@pytest.mark.skipif(not DEB, reason="MPNFS_IT_DEB names no package file")
def test_package_installs_mounts_from_fstab_and_purges_clean(bed, tmp_path):
    # Asked to test a package: what is in the way fails the test (a skip
    # would pass the phase without testing anything).
    assert not present(), "an mpnfs package is on this system already"
    for p in ("/usr/sbin/mpnfs", "/sbin/mount.mpnfs", "/usr/local/sbin/mpnfs"):
        assert not os.path.lexists(p), f"{p} exists already"
    mp = tmp_path / "pkg"
    mp.mkdir()
    files = []
    set_fstab()  # (a line a killed run left goes; and the rewrite is known to work)
    try:
        run("apt-get", "install", "-y", "--no-install-recommends", "--no-remove", os.path.abspath(DEB))
        assert installed()
        files = run("dpkg", "-L", "mpnfs").stdout.split()
        for f in ("/usr/sbin/mpnfs", "/usr/sbin/mpnfsctl", "/usr/sbin/mount.mpnfs",
                  "/usr/share/man/man8/mpnfs.8.gz", "/usr/share/man/man8/mpnfsctl.8.gz",
                  "/usr/share/man/man8/mount.mpnfs.8.gz", "/usr/share/man/man5/mpnfstab.5.gz",
                  "/usr/share/doc/mpnfs/examples/mpnfstab.example"):
            assert f in files, f"{f} not in the package: {files}"
            assert os.path.lexists(f), f
        def man(page):
            return " ".join(run("man", page).stdout.split())
        assert "mpnfsctl stats [--prometheus] MOUNTPOINT" in man("mpnfsctl")
        # mount.mpnfs(8) is mpnfs(8).
        assert "Installed as mount.mpnfs, mpnfs is what mount -t mpnfs" in man("mount.mpnfs")
        # Both fstab types: mpnfs (mount.mpnfs) and fuse.mpnfs (mount.fuse3,
        # which finds the packaged mpnfs in /usr/sbin).
        for fstype, name in (("mpnfs", "from-the-package"), ("fuse.mpnfs", "through-mount-fuse3")):
            set_fstab(f"{SERVER}:{EXPORT} {mp} {fstype} _netdev,nofail,mountport=20048,hard 0 0")
            run("mount", str(mp))
            assert is_mounted(mp), fstype
            (mp / name).write_text("ok")
            assert (mp / name).read_text() == "ok"
            assert '"connections"' in run("mpnfsctl", "stats", str(mp)).stdout
            run("umount", str(mp))
            for _ in range(150):
                if run("pgrep", "-f", f"mpnfs .*{mp}", check=False).returncode != 0:
                    break
                time.sleep(0.1)
            else:
                raise AssertionError(f"mpnfs still running after umount ({fstype})")
    finally:
        try:
            if is_mounted(mp):
                run("umount", "-l", str(mp), check=False)
            set_fstab()
        finally:
            if present():
                run("apt-get", "purge", "-y", "mpnfs", check=False)
    assert not present(), "dpkg still knows mpnfs after the purge"
    left = [f for f in files if os.path.lexists(f) and not os.path.isdir(f)]
    assert not left, f"left behind: {left}"
    assert not os.path.exists("/var/lib/mpnfs"), "the lock state directory outlived the purge"
