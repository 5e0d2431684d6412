"""PostgreSQL 15 on the mount, run by a non-root user (the `postgres` system
user) on an allow_other mount: initdb (with data checksums), `pgbench -i`, a
timed pgbench run, an immediate stop (a crash: no shutdown checkpoint) and a
restart that must recover, then the TPC-B invariants (the sums of the account,
branch and teller balances and of the history deltas are equal; every
transaction pgbench reported is in the history, and nothing more) and
`pg_amcheck --heapallindexed` over every database. On a default mount over one
path and over four, with direct_io, in each cache mode, and in write-back with
fill=block, seq_cutoff=0 and direct_io (writeback-fill-block).

Then write-back crashed: pgbench on a cache_mode=writeback mount while the
gateway is killed with SIGKILL (writeback-kill9), or while the NFS server
restarts with the flusher busy (writeback-server-restart); a new mount of the
same cache directory, recovery and the same invariants, with the
history counted against pgbench's per-transaction log (see below).

MPNFS_IT_PG_MODES=ID[,ID...] runs only those cases (the IDs above and
writeback-kill9, writeback-server-restart; contrib/test.sh chooses some for
the sanitizer builds); unset, all of them."""
import contextlib
import os
import pathlib
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

from conftest import ALL_PATHS, SLOT, is_mounted
from test_cache import cache_stats
from test_writeback import free_export  # noqa: F401 (autouse: frees an export a failed case left claimed)
from test_writeback import owner_record

PGBIN = "/usr/lib/postgresql/15/bin"
SCALE = 2         # 200k accounts (26 MiB, above shared_buffers), 20 tellers, 2 branches
CLIENTS = 4
RUN_SECONDS = 10
TIMEOUT = 300     # any one PostgreSQL command; a hang fails the test instead of blocking it

MODES = ["default-1path", "default-4paths", "direct_io",
         "cache_readonly", "cache_writethrough", "cache_writeback", "writeback-fill-block"]
SELECTED = os.environ.get("MPNFS_IT_PG_MODES")


def mount_options(mode, cache_dir):
    opts = ["allow_other"]  # root mounts; the postgres user works in it
    if mode == "default-4paths":
        opts.append(f"path={ALL_PATHS}")
    elif mode == "direct_io":
        opts.append("direct_io")
    elif mode == "writeback-fill-block":
        # Whole-block fills, the WAL cached too (contrib/bench/OLTP.md's setting).
        opts += [f"cache_dir={cache_dir}", "cache_size=256M", "cache_mode=writeback",
                 "cache_block=64", "fill=block", "seq_cutoff=0", "direct_io"]
    elif mode.startswith("cache_"):
        opts += [f"cache_dir={cache_dir}", "cache_size=256M", "cache_mode=" + mode[len("cache_"):]]
    return ",".join(opts)


def start_time(pid):
    """The process's start time (clock ticks since boot), which tells it from
    a later process given the same PID; None once it is reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


class Postgres:
    """One PostgreSQL cluster in `top`/data, run as the postgres user, its
    socket and server log in a private directory in /tmp."""

    def __init__(self, top, port):
        self.user = pwd.getpwnam("postgres")
        self.top = top
        self.data = top / "data"
        self.port = port
        self.sock = pathlib.Path(tempfile.mkdtemp(prefix="mpnfs-pg-", dir="/tmp"))
        os.chown(self.sock, self.user.pw_uid, self.user.pw_gid)
        self.log = self.sock / "server.log"
        self.pid = None  # the postmaster's, from postmaster.pid, while it may run
        self.started = None  # its start_time()
        self.env = {"PATH": PGBIN + ":/usr/bin:/bin", "HOME": str(self.sock), "LANG": "C",
                    "PGHOST": str(self.sock), "PGPORT": str(port), "PGUSER": "postgres",
                    "PGDATABASE": "postgres"}

    def as_user(self, cmd):
        return ["setpriv", f"--reuid={self.user.pw_uid}", f"--regid={self.user.pw_gid}",
                "--clear-groups", *cmd]

    def run(self, *cmd, timeout=TIMEOUT):
        return subprocess.run(self.as_user(cmd), env=self.env, cwd=self.sock,
                              capture_output=True, text=True, timeout=timeout)

    def moved_to(self, top):
        """The same cluster, found under another mount point."""
        self.top = top
        self.data = top / "data"

    def ok(self, *cmd, timeout=TIMEOUT):
        r = self.run(*cmd, timeout=timeout)
        assert r.returncode == 0, f"{' '.join(cmd)}: exit {r.returncode}\n{r.stdout}\n{r.stderr}" \
                                  f"\n--- server log ---\n{self.log_text()[-6000:]}"
        return r.stdout

    def log_text(self):
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def initdb(self):
        self.top.mkdir()
        os.chown(self.top, self.user.pw_uid, self.user.pw_gid)
        os.chmod(self.top, 0o700)
        self.ok("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
                "--locale=C", "--data-checksums")
        with open(self.data / "postgresql.conf", "a") as f:
            f.write(f"listen_addresses = ''\nport = {self.port}\n"
                    f"unix_socket_directories = '{self.sock}'\n"
                    "max_connections = 20\n"
                    # Small, so that the run reads and writes data pages through the
                    # mount and checkpoints come from WAL volume during the load.
                    "shared_buffers = 16MB\nmax_wal_size = 32MB\nmin_wal_size = 32MB\n")

    def start(self):
        self.ok("pg_ctl", "start", "-w", "-t", str(TIMEOUT), "-D", str(self.data),
                "-l", str(self.log))
        self.pid = int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        self.started = start_time(self.pid)

    def sql(self, query):
        return self.ok("psql", "-X", "-At", "-v", "ON_ERROR_STOP=1", "-c", query).strip()

    def is_ours(self, pid):
        """The process is still our postmaster (not a reused PID)."""
        try:
            with open(f"/proc/{pid}/status") as f:
                status = f.read()
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            return False
        uid = re.search(r"^Uid:\s+(\d+)", status, re.M)
        return (uid and int(uid.group(1)) == self.user.pw_uid
                and str(self.data).encode() in cmdline)

    def kill(self):
        """Immediate shutdown of the postmaster we started (SIGQUIT: it ends its
        children), by its PID, without touching the mount (which may hang).
        Returns once the process is reaped: until then the next start refuses
        to run, since a postmaster.pid the dead mount kept names a PID that
        kill(PID, 0) still finds (a process exiting or dumping core, a zombie)."""
        if self.pid is None:
            try:  # a start that timed out may still have left one running
                r = subprocess.run(["head", "-1", str(self.data / "postmaster.pid")],
                                   capture_output=True, text=True, timeout=10)
                self.pid = int(r.stdout.strip()) if r.returncode == 0 else None
            except (subprocess.TimeoutExpired, ValueError):
                pass
            if self.pid is not None and self.is_ours(self.pid):
                self.started = start_time(self.pid)
        if self.pid is None or self.started is None:
            self.pid = None
            return

        def alive():
            return start_time(self.pid) == self.started

        for sig in (signal.SIGQUIT, signal.SIGKILL):  # its children follow the postmaster's death
            if alive():
                try:
                    os.kill(self.pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.time() + 30
            while alive() and time.time() < deadline:
                time.sleep(0.1)
        assert not alive(), f"postmaster {self.pid} still exists a minute after SIGQUIT and SIGKILL"
        self.started = None
        self.pid = None


@pytest.mark.parametrize("mode", MODES)
def test_pgbench_crash_recovery(mount_factory, tmp_path, mode):
    if SELECTED is not None and mode not in SELECTED.split(","):
        pytest.skip(f"not in MPNFS_IT_PG_MODES={SELECTED}")
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    m = mount_factory(mount_options(mode, cache_dir))
    pg = Postgres(m.path / f"pg-{mode}", 25432 + 10 * SLOT + MODES.index(mode))
    try:
        pg.initdb()
        pg.start()
        pg.ok("pgbench", "-i", "-q", "-s", str(SCALE))
        out = pg.ok("pgbench", "-c", str(CLIENTS), "-j", "2", "-T", str(RUN_SECONDS))
        done = int(re.search(r"number of transactions actually processed: (\d+)", out).group(1))
        failed = re.search(r"number of failed transactions: (\d+)", out)
        assert done > 0 and (failed is None or int(failed.group(1)) == 0), out

        # Every transaction pgbench counted was committed (synchronous_commit=on:
        # its WAL is flushed). The crash: no shutdown checkpoint, recovery next start.
        pg.ok("pg_ctl", "stop", "-m", "immediate", "-w", "-D", str(pg.data))
        pg.pid = None
        before = len(pg.log_text())
        pg.start()
        assert "automatic recovery in progress" in pg.log_text()[before:], pg.log_text()[before:]

        counts = pg.sql("select (select count(*) from pgbench_accounts), "
                        "(select count(*) from pgbench_tellers), "
                        "(select count(*) from pgbench_branches)")
        assert counts == f"{100000 * SCALE}|{10 * SCALE}|{SCALE}", counts
        sums = pg.sql("select (select sum(abalance) from pgbench_accounts), "
                      "(select sum(bbalance) from pgbench_branches), "
                      "(select sum(tbalance) from pgbench_tellers), "
                      "(select sum(delta) from pgbench_history), "
                      "(select count(*) from pgbench_history)").split("|")
        assert sums[0] == sums[1] == sums[2] == sums[3], sums
        assert int(sums[4]) == done, f"history has {sums[4]} rows, pgbench reported {done}"

        r = pg.run("pg_amcheck", "--all", "--install-missing", "--heapallindexed",
                   "--parent-check")
        assert r.returncode == 0, f"pg_amcheck: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
        pg.ok("pg_ctl", "stop", "-m", "fast", "-w", "-D", str(pg.data))
        pg.pid = None
    finally:
        pg.kill()
        shutil.rmtree(pg.sock, ignore_errors=True)
    shutil.rmtree(pg.top)  # through the mount: the export is left as it was


# --- Write-back, crashed ----------------------------------------------------
#
# pgbench on a cache_mode=writeback mount while (a) the gateway is killed with
# SIGKILL, or (b) the NFS server restarts while the flusher is writing dirty
# data to it. Afterwards the same cache_dir is mounted again (a kill's dirty
# data is flushed before that mount is offered), PostgreSQL recovers, and the
# TPC-B invariants hold: equal balance sums; at least every transaction whose
# COMMIT returned to pgbench is in the history, and at most one more per
# client (a COMMIT made durable whose reply the crash cut off); pg_amcheck is
# clean. Finally the cluster is started once more on a mount without a cache,
# to show that the server alone holds the same state.

WB_MODES = ["writeback-kill9", "writeback-server-restart"]
KILL_AFTER = 6     # seconds of pgbench progress (committing) before the gateway is killed
RESTART_AFTER = 5  # ... before the server restarts
WB_RUN_SECONDS = 15


def wb_options(cache_dir, extra):
    return (f"allow_other,cache_dir={cache_dir},cache_size=256M,cache_mode=writeback,"
            + extra)


def wb_port(mode):
    return 25432 + 10 * SLOT + len(MODES) + WB_MODES.index(mode)


class Bench:
    """pgbench running in the background as the postgres user, with its
    per-transaction log (-l) and a progress line a second, in a private
    directory outside the mount (which may die under it)."""

    def __init__(self, pg, seconds):
        self.dir = pg.sock / "bench"
        self.dir.mkdir()
        os.chown(self.dir, pg.user.pw_uid, pg.user.pw_gid)
        self.out_path, self.err_path = self.dir / "stdout", self.dir / "stderr"
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(
                pg.as_user(["pgbench", "-c", str(CLIENTS), "-j", "2", "-T", str(seconds),
                            "-l", "--log-prefix", str(self.dir / "tx"), "--progress=1"]),
                env=pg.env, cwd=self.dir, stdout=out, stderr=err)

    def output(self):
        return self.out_path.read_text() + self.err_path.read_text()

    def progress(self):
        """(seconds since the start, transactions per second) of each progress line."""
        return [(float(s), float(t)) for s, t in
                re.findall(r"^progress: ([\d.]+) s, ([\d.]+) tps", self.err_path.read_text(), re.M)]

    def wait_committing(self, seconds, timeout=TIMEOUT):
        """Until pgbench has reported `seconds` seconds of progress, the last
        of them with transactions committed."""
        deadline = time.time() + timeout
        while True:
            p = self.progress()
            if len(p) >= seconds and p[-1][1] > 0:
                return
            assert self.proc.poll() is None, f"pgbench ended early:\n{self.output()}"
            assert time.time() < deadline, f"pgbench made no progress:\n{self.output()}"
            time.sleep(0.1)

    def wait(self, timeout=TIMEOUT):
        return self.proc.wait(timeout=timeout)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def committed(self):
        """Completion times (Unix time) of the transactions whose COMMIT
        returned to pgbench: the lines of its logs with a latency in the
        third field (a failed or skipped transaction has a word there), and
        the other lines."""
        times, other = [], []
        for f in self.dir.glob("tx.*"):
            for line in f.read_text().splitlines():
                fields = line.split()
                if len(fields) >= 6 and fields[2].isdigit():
                    times.append(int(fields[4]) + int(fields[5]) / 1e6)
                else:
                    other.append(line)
        return sorted(times), other


def tpcb_state(pg):
    """Row counts of the fixed tables, the four balance sums and the history rows."""
    counts = pg.sql("select (select count(*) from pgbench_accounts), "
                    "(select count(*) from pgbench_tellers), "
                    "(select count(*) from pgbench_branches)")
    assert counts == f"{100000 * SCALE}|{10 * SCALE}|{SCALE}", counts
    return pg.sql("select (select sum(abalance) from pgbench_accounts), "
                  "(select sum(tbalance) from pgbench_tellers), "
                  "(select sum(bbalance) from pgbench_branches), "
                  "(select sum(delta) from pgbench_history), "
                  "(select count(*) from pgbench_history)").split("|")


def start_recovering(pg):
    before = len(pg.log_text())
    pg.start()
    assert "automatic recovery in progress" in pg.log_text()[before:], pg.log_text()[before:]


def check_tpcb(pg, low, high):
    """Equal balance sums, low <= history rows <= high, pg_amcheck clean."""
    state = tpcb_state(pg)
    a, t, b, d, n = state
    assert a == t == b == d, f"sums (accounts, tellers, branches, history): {state}"
    assert low <= int(n) <= high, \
        f"history has {n} rows; COMMITs that returned to pgbench: {low}, at most {high} may be"
    r = pg.run("pg_amcheck", "--all", "--install-missing", "--heapallindexed", "--parent-check")
    assert r.returncode == 0, f"pg_amcheck: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return state


def unmount_flushed(m):
    """Unmounts and waits for the gateway to end, which it does once the
    cache is flushed; then nothing is dirty and the export is free."""
    r = subprocess.run(["fusermount3", "-u", str(m.path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert m.proc.wait(timeout=TIMEOUT) == 0, m.log_text()[-4000:]
    assert not owner_record(), "the export is still claimed after the unmount"


def check_on_the_server(pg, m, mount_factory, state):
    """Stops the cluster and unmounts `m` (flushing it); then, on a mount
    without a cache, the server alone must hold `state`."""
    pg.ok("pg_ctl", "stop", "-m", "fast", "-w", "-D", str(pg.data))
    pg.pid = None
    unmount_flushed(m)
    m3 = mount_factory("allow_other")
    pg.moved_to(m3.path / pg.top.name)
    pg.start()
    assert tpcb_state(pg) == state
    pg.ok("pg_ctl", "stop", "-m", "fast", "-w", "-D", str(pg.data))
    pg.pid = None


def skip_unselected(mode):
    if SELECTED is not None and mode not in SELECTED.split(","):
        pytest.skip(f"not in MPNFS_IT_PG_MODES={SELECTED}")


class WbCluster:
    """A write-back mount (`extra` options added) holding a cluster loaded by
    `pgbench -i`; the mount options, and the pgbench run once started."""

    def __init__(self, mount_factory, tmp_path, mode, extra):
        cache_dir = tmp_path / "cache"
        cache_dir.mkdir()
        self.opts = wb_options(cache_dir, extra)
        self.m = mount_factory(self.opts)
        self.pg = Postgres(self.m.path / f"pg-{mode}", wb_port(mode))
        self.bench = None


@contextlib.contextmanager
def wb_cluster(mount_factory, tmp_path, mode, extra):
    """A WbCluster; at the end pgbench and PostgreSQL are stopped, and on
    success the cluster is removed (through the last mount)."""
    skip_unselected(mode)
    c = WbCluster(mount_factory, tmp_path, mode, extra)
    try:
        c.pg.initdb()
        c.pg.start()
        c.pg.ok("pgbench", "-i", "-q", "-s", str(SCALE))
        yield c
    finally:
        if c.bench:
            c.bench.kill()
        c.pg.kill()
        shutil.rmtree(c.pg.sock, ignore_errors=True)
    shutil.rmtree(c.pg.top)


def test_pgbench_writeback_gateway_killed(mount_factory, tmp_path):
    # dirty_age=600: nothing is flushed by age before the kill.
    with wb_cluster(mount_factory, tmp_path, "writeback-kill9", "dirty_age=600") as c:
        m, pg = c.m, c.pg
        bench = c.bench = Bench(pg, TIMEOUT)
        bench.wait_committing(2)
        # Data pages written and fsynced into the cache: recovery starts from
        # this checkpoint and needs them.
        pg.sql("checkpoint")
        bench.wait_committing(KILL_AFTER)
        assert cache_stats(m)["dirty_bytes"] > 0, "nothing dirty in the cache at the kill"
        t_kill = time.time()
        os.kill(m.pid, signal.SIGKILL)
        m.proc.wait(timeout=30)
        pg.kill()  # immediate: it sees ENOTCONN anyway
        rc = bench.wait(timeout=60)
        r = subprocess.run(["fusermount3", "-u", "-z", str(m.path)], capture_output=True)
        if r.returncode != 0:
            subprocess.run(["umount", "-l", str(m.path)], capture_output=True)
        assert not is_mounted(m.path)

        # The kill came while pgbench was committing: it did not end by itself,
        # and COMMITs returned up to the last second before the kill.
        out = bench.output()
        assert rc != 0 and "aborted" in out, f"pgbench exit {rc}\n{out}"
        times, other = bench.committed()
        assert not other, f"failed or skipped transactions in pgbench's log: {other[:5]}"
        assert len(times) > 0 and times[-1] > t_kill - 1, \
            f"{len(times)} commits, the last {t_kill - times[-1]:.2f} s before the kill"
        # A COMMIT can return after the kill only if it was durable before it,
        # one per client at most.
        late = sum(1 for t in times if t > t_kill)
        assert late <= CLIENTS, f"{late} COMMITs returned after the kill"
        reported = re.search(r"number of transactions actually processed: (\d+)", out)
        assert reported and int(reported.group(1)) == len(times), out

        # The same cache: its dirty data is flushed before the mount is offered.
        m2 = mount_factory(c.opts)
        assert "left by an earlier mount" in m2.log_text(), m2.log_text()
        assert "write-back data of the earlier mount is on the server" in m2.log_text()
        assert cache_stats(m2)["dirty_bytes"] == 0
        pg.moved_to(m2.path / pg.top.name)
        start_recovering(pg)
        state = check_tpcb(pg, len(times), len(times) + CLIENTS)
        check_on_the_server(pg, m2, mount_factory, state)


def test_pgbench_writeback_server_restarted(bed, mount_factory, tmp_path):
    # dirty_age=1: the flusher is always at work.
    with wb_cluster(mount_factory, tmp_path, "writeback-server-restart", "dirty_age=1") as c:
        m, pg = c.m, c.pg
        bench = c.bench = Bench(pg, WB_RUN_SECONDS)
        bench.wait_committing(RESTART_AFTER)
        # Restart the server while dirty data is being flushed: some is in
        # the cache and the flusher has written some since the last look.
        st0 = cache_stats(m)
        deadline = time.time() + 60
        while True:
            st = cache_stats(m)
            if st["dirty_bytes"] > 0 and st["flushed_bytes"] > st0["flushed_bytes"]:
                break
            assert time.time() < deadline, f"the flusher is idle: {st0} {st}"
            time.sleep(0.05)
        bed.restart_server()
        t_back = time.time()
        rc = bench.wait()
        out = bench.output()
        assert rc == 0, f"pgbench exit {rc}\n{out}"
        failed = re.search(r"number of failed transactions: (\d+)", out)
        assert failed is None or int(failed.group(1)) == 0, out
        times, other = bench.committed()
        assert not other, f"failed or skipped transactions in pgbench's log: {other[:5]}"
        reported = re.search(r"number of transactions actually processed: (\d+)", out)
        assert reported and int(reported.group(1)) == len(times) > 0, out
        assert times[-1] > t_back, "no COMMIT after the server came back"
        st1 = cache_stats(m)
        assert st1["flushed_bytes"] > st["flushed_bytes"], f"no flush after the restart: {st1}"

        # Crash PostgreSQL (no shutdown checkpoint), unmount (which flushes),
        # and recover on a new mount of the same cache.
        pg.ok("pg_ctl", "stop", "-m", "immediate", "-w", "-D", str(pg.data))
        pg.pid = None
        unmount_flushed(m)
        m2 = mount_factory(c.opts)
        assert "left by an earlier mount" not in m2.log_text(), m2.log_text()
        pg.moved_to(m2.path / pg.top.name)
        start_recovering(pg)
        # pgbench ended normally: no transaction was in flight. (A flush
        # round sends only a block's current slot: the old slot of a block
        # being copied, sent too, could race its new copy to the server and
        # lose data.)
        state = check_tpcb(pg, len(times), len(times))
        check_on_the_server(pg, m2, mount_factory, state)
