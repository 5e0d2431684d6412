#!/usr/bin/env python3
"""What an application sees while a path fails under it.

Streams MIB MiB to (write) or from (read) FILE in 1 MiB blocks, takes path K
of the test bed down DOWN seconds in, and prints one JSON line: throughput
per half second, before and after the failure, and the stall: the longest
wait for one block, counted from the moment the command that takes the path
down starts (the command runs beside the stream; how long it took is
down_command_s). A write ends with an fsync, timed apart (final_fsync_s):
it waits for everything the page cache still holds, failure or not.

A syncwrite opens the file O_DSYNC: each block is on the server when its
write returns, as a database's log writer wants it.

  timeline.py {read|write|syncwrite} FILE MIB K DOWN
"""
import json
import os
import subprocess
import sys
import threading
import time

TESTBED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "testbed.sh")


def main():
    mode, path, mib, k, down_at = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], float(sys.argv[5])
    block = bytearray(os.urandom(1 << 20))
    done = []  # (seconds, MiB moved)
    down = None
    # The command that takes the path down is started now, before the file
    # is open, and waits for a line on its stdin. A process started while
    # the file is open would inherit the descriptor, and its close (at exec
    # or exit) is a close of the file: the kernel flushes the file's dirty
    # pages then, and the stream would wait for that flush, not for the
    # failover.
    cmd = subprocess.Popen(["sh", "-c", 'read go && exec "$0" link down "$1"', TESTBED, k],
                           stdin=subprocess.PIPE)
    ended = []  # when the command ended, noted by a thread that waits for it

    def wait_cmd():
        cmd.wait()
        ended.append(time.monotonic())
    waiter = threading.Thread(target=wait_cmd, daemon=True)
    writing = mode in ("write", "syncwrite")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC if writing else os.O_RDONLY
    if mode == "syncwrite":
        flags |= os.O_DSYNC
    fd = os.open(path, flags, 0o644)
    t0 = time.monotonic()
    for i in range(mib):
        if down is None and time.monotonic() - t0 >= down_at:
            # The failure counts from the command's start; the command runs
            # beside the stream, not in its way.
            down = time.monotonic() - t0
            cmd.stdin.write(b"go\n")
            cmd.stdin.close()
            waiter.start()
        if writing:
            block[:8] = i.to_bytes(8, "little")
            os.write(fd, block)
        elif len(os.read(fd, 1 << 20)) == 0:
            break
        done.append((time.monotonic() - t0, i + 1))
    fsync_s = 0.0
    if writing:
        f0 = time.monotonic()
        os.fsync(fd)
        fsync_s = time.monotonic() - f0
    os.close(fd)
    if down is None:
        cmd.kill()
        sys.exit("the transfer ended before the path went down; make it longer")
    waiter.join(60)
    if not ended:
        cmd.kill()
        sys.exit("the command taking the path down did not end")
    if cmd.returncode != 0:
        sys.exit("taking the path down failed")
    down_took = ended[0] - t0 - down
    if not done:
        sys.exit("nothing moved")
    end = done[-1][0]
    stall, prev = 0.0, down
    for t, _ in done:
        if t >= down:
            stall = max(stall, t - prev)
            prev = t

    def moved_at(t):
        m = 0
        for s, n in done:
            if s > t:
                break
            m = n
        return m

    def rate(a, b):
        return (moved_at(b) - moved_at(a)) * 1.048576 / max(b - a, 1e-6)

    print(json.dumps({
        "mode": mode,
        "down_at": round(down, 2),
        "down_command_s": round(down_took, 2),
        "seconds": round(end, 2),
        "before_mbs": round(rate(max(0.5, down - 2), down), 1),
        "after_mbs": round(rate(down + 3, max(down + 3.5, end - 0.5)), 1),
        "stall_s": round(stall, 2),
        "final_fsync_s": round(fsync_s, 2),
        "per_half_second_mbs": [round(rate(i / 2, i / 2 + 0.5), 1) for i in range(int(end * 2))],
    }))


if __name__ == "__main__":
    main()
