"""Locks across gateways: fcntl, OFD and flock locks go to NFS-Ganesha's
lock manager (NLM v4), so two gateways on one export exclude each other as
two hosts would; local_lock=all keeps them on each gateway."""
import fcntl
import json
import os
import pathlib
import signal
import struct
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import BED_ENV, BIN, EXPORT, NET, SERVER, SERVER2, is_mounted, start_mount

# A process that takes a lock, says "locked", and holds it until its stdin
# closes (then exits, which releases it) or it is killed.
HOLDER = textwrap.dedent("""
    import fcntl, os, sys
    path, kind, start, length = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    fd = os.open(path, os.O_RDWR)
    if kind == "flock":
        fcntl.flock(fd, fcntl.LOCK_EX)
    elif kind == "ofd":
        fcntl.fcntl(fd, 38, __import__("struct").pack("hhqqi", fcntl.F_WRLCK, 0, start, length, 0))  # F_OFD_SETLKW
    else:
        fcntl.lockf(fd, fcntl.LOCK_EX if kind == "ex" else fcntl.LOCK_SH, length, start)
    print("locked", os.getpid(), flush=True)
    sys.stdin.read()
""")


HOLDERS = []


class Holder:
    def __init__(self, path, kind="ex", start=0, length=0):
        self.p = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), kind, str(start), str(length)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        HOLDERS.append(self.p)
        line = self.p.stdout.readline()
        assert line.startswith("locked"), f"the holder did not lock: {line!r}"
        self.pid = int(line.split()[1])

    def release(self):
        self.p.stdin.close()
        assert self.p.wait(timeout=30) == 0


@pytest.fixture(autouse=True)
def no_holder_left():
    """A test that fails with a holder still running ends it (by its PID),
    so that the mounts can go."""
    yield
    while HOLDERS:
        p = HOLDERS.pop()
        if p.poll() is None:
            p.kill()
            p.wait(timeout=30)


def try_lock(path, exclusive=True, start=0, length=0):
    """F_SETLK from this process on a descriptor of its own: True if granted
    (then released by the close)."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.lockf(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB, length, start)
        return True
    except OSError as e:
        assert e.errno in (11, 13), e
        return False
    finally:
        os.close(fd)


def try_lock_within(path, secs, exclusive=True, start=0, length=0):
    """try_lock from a child process: None if it got no answer within
    `secs` (the child is then killed, which ends its request)."""
    code = textwrap.dedent("""
        import fcntl, os, sys
        fd = os.open(sys.argv[1], os.O_RDWR)
        try:
            fcntl.lockf(fd, int(sys.argv[2]) | fcntl.LOCK_NB, int(sys.argv[4]), int(sys.argv[3]))
            print("granted")
        except OSError as e:
            print("refused" if e.errno in (11, 13) else e)
    """)
    p = subprocess.Popen([sys.executable, "-c", code, str(path), str(fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH),
                          str(start), str(length)], stdout=subprocess.PIPE, text=True)
    try:
        out, _ = p.communicate(timeout=secs)
    except subprocess.TimeoutExpired:
        p.kill()  # (it ends once the gateway answers the request it is in)
        HOLDERS.append(p)
        return None
    assert out.strip() in ("granted", "refused"), out
    return out.strip() == "granted"


def getlk(path, start=0, length=0):
    fd = os.open(path, os.O_RDWR)
    try:
        r = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack("hhqqi", fcntl.F_WRLCK, 0, start, length, 0))
        return struct.unpack("hhqqi", r)
    finally:
        os.close(fd)


def nlm_stats(m):
    """The lock calls' entry of `mpnfsctl stats`."""
    r = subprocess.run([os.path.join(os.path.dirname(BIN), "mpnfsctl"), "stats", str(m.path)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return next(s for s in json.loads(r.stdout)["services"] if s["service"] == "NLM")


@pytest.fixture
def two(mount_factory):
    a, b = mount_factory(), mount_factory()
    (a.path / "locked").write_text("0\n")
    return a, b


def test_a_lock_held_through_one_gateway_excludes_the_other(two):
    a, b = two
    h = Holder(a.path / "locked")
    assert not try_lock(b.path / "locked"), "granted through B while A holds it"
    assert not try_lock(b.path / "locked", exclusive=False)
    t, _, start, length, pid = getlk(b.path / "locked")
    assert (t, start, length, pid) == (fcntl.F_WRLCK, 0, 0, 0), "another host's holder has pid 0"
    # The same gateway reports the holder's own pid.
    assert getlk(a.path / "locked")[4] == h.pid
    h.release()
    assert try_lock(b.path / "locked"), "not granted after the holder exited"


def test_byte_ranges_split_and_merge_on_the_server(two):
    a, b = two
    h = Holder(a.path / "locked", "ex", 100, 100)  # bytes 100..199
    assert try_lock(b.path / "locked", True, 0, 100)
    assert try_lock(b.path / "locked", True, 200, 50)
    assert not try_lock(b.path / "locked", True, 150, 100)
    assert getlk(b.path / "locked", 0, 0)[2:4] == (100, 100)
    h.release()
    # Shared locks from both gateways coexist; an exclusive one waits for both.
    fd = os.open(b.path / "locked", os.O_RDWR)
    fcntl.lockf(fd, fcntl.LOCK_SH, 0, 0)
    assert try_lock(a.path / "locked", exclusive=False)
    assert not try_lock(a.path / "locked", exclusive=True)
    # Unlocking a middle part of a lock leaves its two ends.
    fcntl.lockf(fd, fcntl.LOCK_UN, 10, 20)
    assert try_lock(a.path / "locked", True, 22, 5)
    assert not try_lock(a.path / "locked", True, 0, 21)
    assert not try_lock(a.path / "locked", True, 30, 1)
    os.close(fd)
    assert try_lock(a.path / "locked", True)


def test_flock_and_ofd_locks_cross_gateways_and_go_with_the_last_close(two):
    a, b = two
    for kind in ("flock", "ofd"):
        h = Holder(a.path / "locked", kind)
        fd = os.open(b.path / "locked", os.O_RDWR)
        if kind == "flock":
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:
            assert not try_lock(b.path / "locked")
        h.release()
        if kind == "flock":
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
        assert try_lock(b.path / "locked"), f"{kind}: not released by the holder's exit"


def test_an_ofd_lock_goes_with_the_last_close_of_its_open_file(two):
    a, b = two
    fd = os.open(a.path / "locked", os.O_RDWR)
    dup = os.dup(fd)
    fcntl.fcntl(fd, 38, struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 0, 0))  # F_OFD_SETLKW
    os.close(fd)
    assert not try_lock(b.path / "locked"), "an OFD lock went with a close that was not the last"
    os.close(dup)
    deadline = time.time() + 10  # (the release is the kernel's, after close returns)
    while not try_lock(b.path / "locked"):
        assert time.time() < deadline, "the OFD lock outlived the last close"
        time.sleep(0.05)


def test_a_close_releases_the_processs_locks(two):
    """POSIX: any close of the file by the process releases its locks."""
    a, b = two
    fd1 = os.open(a.path / "locked", os.O_RDWR)
    fd2 = os.open(a.path / "locked", os.O_RDONLY)
    fcntl.lockf(fd1, fcntl.LOCK_EX, 0, 0)
    assert not try_lock(b.path / "locked")
    os.close(fd2)
    assert try_lock(b.path / "locked"), "the close of another descriptor left the lock"
    os.close(fd1)


def test_a_waiting_lock_is_granted_when_the_other_gateway_releases(two):
    a, b = two
    h = Holder(a.path / "locked")
    waiter = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, os, time
        fd = os.open({str(b.path / 'locked')!r}, os.O_RDWR)
        t = time.time()
        fcntl.lockf(fd, fcntl.LOCK_EX)
        print(time.time() - t)
    """)], stdout=subprocess.PIPE, text=True)
    time.sleep(1.5)
    assert waiter.poll() is None, "F_SETLKW returned while the lock was held elsewhere"
    h.release()
    out, _ = waiter.communicate(timeout=30)
    assert waiter.returncode == 0 and float(out) >= 1.5


def test_a_waiting_lock_is_interrupted_by_a_signal(two):
    a, b = two
    h = Holder(a.path / "locked")
    waiter = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, os, signal, sys
        def alarm(*_):
            raise TimeoutError  # (a handler that returns would have Python wait again)
        signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        fd = os.open({str(b.path / 'locked')!r}, os.O_RDWR)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX)
            sys.exit(3)
        except TimeoutError:
            sys.exit(0)
    """)])
    assert waiter.wait(timeout=30) == 0, "F_SETLKW was granted, or not interrupted by the signal"
    h.release()
    # The interrupted wait left nothing on the server.
    assert try_lock(a.path / "locked"), "a lock was left by the interrupted wait"


COUNTER = textwrap.dedent("""
    import fcntl, os, sys
    path, n = sys.argv[1], int(sys.argv[2])
    for _ in range(n):
        fd = os.open(path, os.O_RDWR)
        fcntl.lockf(fd, fcntl.LOCK_EX)
        v = int(os.pread(fd, 32, 0).decode().strip() or 0)
        data = f"{v + 1}\\n".encode()
        os.pwrite(fd, data, 0)
        os.close(fd)   # releases the lock, after close-to-open wrote the data back
""")


def test_a_counter_incremented_under_a_lock_from_both_gateways_is_exact(two):
    a, b = two
    procs = [subprocess.Popen([sys.executable, "-c", COUNTER, str(m.path / "locked"), "25"])
             for m in (a, b) for _ in range(4)]
    for p in procs:
        assert p.wait(timeout=300) == 0
    assert (a.path / "locked").read_text() == "200\n"
    assert (b.path / "locked").read_text() == "200\n"


def test_sqlite_written_from_both_gateways_in_turns_stays_intact(two):
    a, b = two
    db = "t.db"
    for m in (a, b):
        subprocess.run(["sqlite3", str(m.path / db), "create table if not exists t (who text, i int);"],
                       check=True, timeout=60)

    def writer(m, who):
        sql = "".join(f"begin immediate; insert into t values ('{who}', {i}); commit;" for i in range(100))
        return subprocess.Popen(["sqlite3", "-cmd", ".timeout 60000", str(m.path / db), sql])

    ws = [writer(a, "a"), writer(b, "b")]
    for w in ws:
        assert w.wait(timeout=300) == 0
    for m in (a, b):
        out = subprocess.run(["sqlite3", str(m.path / db), "pragma integrity_check; select who, count(*) from t group by who;"],
                             check=True, capture_output=True, text=True, timeout=60).stdout.split()
        assert out == ["ok", "a|100", "b|100"], out


def test_with_local_lock_all_locks_stay_on_each_gateway(mount_factory):
    a = mount_factory("local_lock=all")
    b = mount_factory("local_lock=all")
    (a.path / "local").write_text("x")
    h = Holder(a.path / "local")
    assert not try_lock(a.path / "local"), "not even the same gateway's lock table excludes"
    assert try_lock(b.path / "local"), "local_lock=all: another gateway's lock was seen"
    h.release()


def test_a_killed_gateways_locks_are_freed_when_it_mounts_again(mount_factory, tmp_path):
    """kill -9 of the gateway through which a process holds a lock: the lock
    stays on the server (the other gateway is refused); mounting again at
    the same mount point tells the server's status monitor this host
    restarted (SM_NOTIFY), and the server frees it."""
    a = mount_factory()
    b = mount_factory()
    (a.path / "locked").write_text("x")
    h = Holder(a.path / "locked")
    # (F_GETLK only: B asks for no lock, so B holds none.)
    assert getlk(b.path / "locked")[0] == fcntl.F_WRLCK
    os.kill(a.pid, signal.SIGKILL)
    a.proc.wait(timeout=30)
    h.p.kill()
    h.p.wait(timeout=30)
    subprocess.run(["fusermount3", "-u", "-z", str(a.path)], capture_output=True)
    assert getlk(b.path / "locked")[0] == fcntl.F_WRLCK, "the lock went with the gateway (nothing to recover)"
    proc, log = start_mount(a.path)
    try:
        deadline = time.time() + 30
        while not is_mounted(a.path):
            assert proc.poll() is None and time.time() < deadline, open(log).read()
            time.sleep(0.05)
        assert "told the server this host" in open(log).read()
        deadline = time.time() + 10
        while not try_lock(b.path / "locked"):
            assert time.time() < deadline, "the killed gateway's lock was not freed"
            time.sleep(0.2)
    finally:
        subprocess.run(["fusermount3", "-u", str(a.path)], capture_output=True)
        proc.wait(timeout=30)


@pytest.fixture
def host_b(bed, mount_factory, tmp_path):
    """A gateway on a second host: its own network namespace (address
    10.NET.101.1, the server at 10.NET.101.2) and host name, its mount in
    this mount namespace. Returns start(), which mounts it (again) and
    returns (mount point, process, log)."""
    bed.run("host", "up", "1")
    ns = f"/run/netns/{BED_ENV['MPNFS_TB_NS']}h1"
    mp = tmp_path / "host-b"
    mp.mkdir()
    procs = []

    def start():
        log = tmp_path / f"host-b-{len(procs)}.log"
        with open(log, "w") as lf:
            p = subprocess.Popen(["nsenter", f"--net={ns}", "unshare", "-u", "sh", "-c",
                                  f"hostname host-b && exec {BIN} 10.{NET}.101.2:{EXPORT} {mp} -f -o mountport=20048"],
                                 stdout=lf, stderr=subprocess.STDOUT)
        procs.append(p)
        deadline = time.time() + 30
        while not is_mounted(mp):
            assert p.poll() is None and time.time() < deadline, log.read_text()
            time.sleep(0.05)
        return mp, p, log

    yield start
    for p in procs:
        if is_mounted(mp):
            subprocess.run(["fusermount3", "-u", str(mp)], capture_output=True)
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)
    bed.run("host", "down", "1")


def test_a_gateway_on_another_host_is_excluded_and_its_killed_locks_freed_alone(mount_factory, host_b):
    """Host B (its own address and host name) is refused while A holds the
    lock, takes it once A releases; then B's gateway is killed holding it:
    A is refused until B's host mounts again and tells the server it
    restarted, which frees B's lock and not a lock A holds on another file."""
    a = mount_factory()
    (a.path / "locked").write_text("0\n")
    (a.path / "mine").write_text("a's\n")
    b_path, b_proc, _ = host_b()
    h = Holder(a.path / "locked")
    assert not try_lock(b_path / "locked"), "host B was granted a lock host A holds"
    h.release()
    assert try_lock(b_path / "locked")
    mine = Holder(a.path / "mine")  # A's own lock, which B's restart must leave
    hb = Holder(b_path / "locked")
    assert getlk(a.path / "locked")[0] == fcntl.F_WRLCK
    b_proc.kill()
    b_proc.wait(timeout=30)
    hb.p.kill()
    hb.p.wait(timeout=30)
    subprocess.run(["fusermount3", "-u", "-z", str(b_path)], capture_output=True)
    assert getlk(a.path / "locked")[0] == fcntl.F_WRLCK, "B's lock went with its gateway (nothing to recover)"
    _, _, log = host_b()
    assert "told the server this host" in log.read_text(), log.read_text()
    deadline = time.time() + 10
    while not try_lock(a.path / "locked"):
        assert time.time() < deadline, "B's lock was not freed by its restart"
        time.sleep(0.2)
    assert not try_lock(b_path / "mine"), "A's lock was freed by B's restart"
    mine.release()


@pytest.mark.parametrize("how", ["restart", "crash"])
def test_locks_held_when_the_server_restarts_are_reclaimed_in_its_grace_period(bed, two, how):
    """NFS-Ganesha restarts (stopped, or killed with -9) while gateway A
    holds a range lock and an flock: A reclaims both in the server's grace
    period (5 s on the bed), so B stays excluded through it and after it;
    both go when their holders release them."""
    a, b = two
    (a.path / "other").write_text("x\n")
    h1 = Holder(a.path / "locked", "ex", 0, 100)
    h2 = Holder(a.path / "other", "flock")
    bed.restart_server() if how == "restart" else bed.crash_server()
    end = time.time() + 12
    while time.time() < end:
        assert not try_lock(b.path / "locked", True, 50, 1), "B got a range A held before the server restarted"
        assert not try_lock(b.path / "other"), "B got a file A held with flock before the server restarted"
        time.sleep(0.5)
    assert try_lock(b.path / "locked", True, 100, 10), "a range A never held is refused"
    assert "reclaiming this mount's locks" in a.log_text()
    assert "no longer holds" not in a.log_text(), "a lock was taken for forgotten while the server held it"
    h1.release()
    h2.release()
    assert try_lock(b.path / "locked") and try_lock(b.path / "other")


def test_a_lock_held_while_its_path_fails_stays_held_and_goes_once_the_path_returns(bed, mount_factory, host_b):
    """Locks travel over a mount's first path (the server knows their owner
    by that address). That path fails while A holds a lock: the data still
    flows over the second path, host B stays excluded, and A's unlock, made
    while the path is down, reaches the server once it is back."""
    a = mount_factory(f"path={SERVER}+{SERVER2}")
    (a.path / "locked").write_text("0\n")
    b_path, _, _ = host_b()
    h = Holder(a.path / "locked")
    bed.link("down", 1)
    try:
        (a.path / "data").write_text("written over the other path\n")
        assert (a.path / "data").read_text() == "written over the other path\n"
        assert not try_lock(b_path / "locked"), "B got the lock while A's lock path was down"
        h.p.stdin.close()  # the holder exits: its unlock waits for the path
        time.sleep(2)
        assert not try_lock(b_path / "locked"), "the lock went without an unlock reaching the server"
    finally:
        bed.link("up", 1)
    assert h.p.wait(timeout=120) == 0
    deadline = time.time() + 60
    while not try_lock(b_path / "locked"):
        assert time.time() < deadline, "A's unlock never reached the server"
        time.sleep(0.2)


def test_locks_are_reclaimed_when_the_restarted_servers_lock_manager_moved(bed, two):
    """The server's lock manager comes back on another port (as one given
    no fixed port does): both gateways look it up again, A reclaims its
    lock there in the grace period, and B stays excluded until A lets go."""
    a, b = two
    conf = pathlib.Path(BED_ENV["MPNFS_TB"]) / "ganesha.conf"
    text = conf.read_text()
    assert "NLM_Port = 32803" in text and "Grace_Period = 5" in text
    h = Holder(a.path / "locked", "ex", 0, 100)
    for _ in range(40):  # (more lock calls than the new port will see in the test)
        assert try_lock(a.path / "locked", True, 200, 1)
    nlm_before = nlm_stats(a)
    assert nlm_before["endpoint"] == f"{SERVER}:32803" and nlm_before["ops"] >= 80, nlm_before
    try:
        conf.write_text(text.replace("NLM_Port = 32803", "NLM_Port = 32813")
                        .replace("Grace_Period = 5", "Grace_Period = 15"))
        bed.restart_server()
        end = time.time() + 20
        while time.time() < end:
            got = try_lock_within(b.path / "locked", 30, True, 50, 1)
            assert got is not None, "B's lock request got no answer: the lock manager's new port was not found"
            assert not got, "B got A's range after the lock manager moved"
            time.sleep(0.5)
        assert "lock manager is now on port 32813" in a.log_text()
        assert "reclaiming this mount's locks" in a.log_text()
        # The lock calls' statistics follow the connection to the new port,
        # and count on from what they were.
        nlm_moved = nlm_stats(a)
        assert nlm_moved["endpoint"] == f"{SERVER}:32813" and nlm_moved["state"] == "up", nlm_moved
        assert nlm_moved["ops"] >= nlm_before["ops"] + 1, (nlm_before, nlm_moved)
    finally:
        conf.write_text(text)
        bed.restart_server()
    # Back on its first port: A follows it and holds the lock there again.
    deadline = time.time() + 30
    while "now on port 32803" not in a.log_text():
        assert time.time() < deadline, "A did not follow the lock manager back to its port"
        time.sleep(0.5)
    got = try_lock_within(b.path / "locked", 60, True, 50, 1)
    assert got is False, f"B's request after the move back: {got}"
    h.release()
    deadline = time.time() + 30
    while not try_lock(b.path / "locked"):
        assert time.time() < deadline, "A's unlock did not reach the lock manager back on its port"
        time.sleep(0.2)
