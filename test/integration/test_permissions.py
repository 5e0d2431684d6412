"""Per-user permissions on an allow_other mount: each request carries its
caller's uid, gid and supplementary groups; the server decides."""
import os
import stat
import subprocess

import pytest

from conftest import SERVER, SQUASHED

U1, U2, G = 20001, 20002, 20010  # two users and a group only U2 belongs to


def as_user(uid, gid, groups, *cmd):
    return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={gid}",
                           "--groups=" + ",".join(map(str, groups)) if groups else "--clear-groups",
                           *cmd], capture_output=True, text=True)


def test_owner_only_file_is_private(shared):
    f = shared / "secret"
    r = as_user(U1, U1, [], "sh", "-c", f"umask 077; echo s > {f}")
    assert r.returncode == 0, r.stderr
    st = os.stat(f)
    assert st.st_uid == U1 and stat.S_IMODE(st.st_mode) == 0o600
    r = as_user(U2, U2, [], "cat", str(f))
    assert r.returncode != 0 and "Permission denied" in r.stderr
    assert as_user(U1, U1, [], "cat", str(f)).stdout == "s\n"


def test_supplementary_groups_are_honoured(shared):
    f = shared / "grp"
    f.write_text("g\n")
    os.chown(f, 0, G)
    os.chmod(f, 0o640)
    assert as_user(U2, U2, [G], "cat", str(f)).stdout == "g\n"
    r = as_user(U1, U1, [], "cat", str(f))
    assert r.returncode != 0


def test_setgid_cleared_when_non_owner_writes(shared):
    f = shared / "sg"
    f.write_text("x")
    os.chown(f, U1, G)
    os.chmod(f, 0o6777)
    r = as_user(U2, U2, [], "sh", "-c", f"echo more >> {f}")
    assert r.returncode == 0, r.stderr
    mode = os.stat(f).st_mode
    assert not mode & stat.S_ISUID
    assert not mode & stat.S_ISGID


def test_sticky_directory_protects_other_users_files(shared):
    os.chmod(shared, 0o1777)
    f = shared / "mine"
    assert as_user(U1, U1, [], "touch", str(f)).returncode == 0
    r = as_user(U2, U2, [], "rm", "-f", str(f))
    assert r.returncode != 0
    assert f.exists()
    assert as_user(U1, U1, [], "rm", "-f", str(f)).returncode == 0


def test_utime_now_allowed_to_non_owner_with_write_access(shared):
    f = shared / "t"
    f.write_text("x")
    os.chmod(f, 0o666)
    os.utime(f, (1000, 1000))
    r = as_user(U2, U2, [], "touch", str(f))  # UTIME_NOW
    assert r.returncode == 0, r.stderr
    assert os.stat(f).st_mtime > 1000
    r = as_user(U2, U2, [], "touch", "-d", "@5000", str(f))  # explicit time: owner only
    assert r.returncode != 0


def test_root_squash_is_respected(mount_factory):
    m = mount_factory("allow_other", source=f"{SERVER}:{SQUASHED}")
    f = m.path / "by-root"
    f.write_text("x")
    assert os.stat(f).st_uid != 0  # root was squashed to the anonymous user
    private = m.path / "u1-private"
    r = as_user(U1, U1, [], "sh", "-c", f"umask 077; echo p > {private}")
    assert r.returncode == 0, r.stderr
    with pytest.raises(PermissionError):
        private.read_text()  # root is nobody here: no access to a 0600 file of U1
