#!/usr/bin/python3
"""Records replies of a real server as inputs for the protocol fuzz targets
(test/fuzz), which start from them, and for the codec tests, which check
that each decodes to what the server sent.

A proxy on loopback stands between an mpnfs mount and the test bed's
NFS-Ganesha (contrib/testbed.sh up 1), for the NFS and MOUNT ports. It
reads the RPC records both ways, matches each reply to its call by xid,
and writes one reply of each shape (procedure, status, length) into the
directory of the target that decodes it, in that target's input format
(a selector byte, then the result): fuzz_rpc_reply (the whole reply, cut
to 4 KiB), fuzz_nfs3_results, fuzz_readdir and fuzz_mount. The workload is ordinary file system use
through the mount (tar, ls -l, cat, chmod, ln -s, rm, mv, df, sync).

  contrib/fuzz/record-corpus.py BUILD/src/mpnfs [CORPUS_DIR]

CORPUS_DIR defaults to test/fuzz/captured; files are named by the SHA-1
of their bytes, as libFuzzer names them."""
import hashlib
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

NET = os.environ.get("MPNFS_TB_NET", "77")
SERVER = f"10.{NET}.1.2"
EXPORT = os.environ.get("MPNFS_TB", "/tmp/mpnfs-tb") + "/export"

# NFSv3 procedure -> fuzz_nfs3_results' selector (its switch on data[0] % 16).
NFS_SELECTOR = {1: 0, 2: 1, 3: 2, 4: 3, 5: 4, 6: 5, 7: 6, 8: 8, 9: 8, 10: 8, 11: 8, 12: 1, 13: 1,
                14: 9, 15: 10, 16: 14, 17: 15, 18: 11, 19: 12, 20: 13, 21: 7}


def records(sock):
    """The RPC records read from a socket (RFC 5531 record marking)."""
    buf = b""
    while True:
        frags = b""
        while True:
            while len(buf) < 4:
                chunk = sock.recv(65536)
                if not chunk:
                    return
                buf += chunk
            mark = struct.unpack(">I", buf[:4])[0]
            n = mark & 0x7FFFFFFF
            while len(buf) < 4 + n:
                chunk = sock.recv(1 << 20)
                if not chunk:
                    return
                buf += chunk
            frags += buf[4:4 + n]
            buf = buf[4 + n:]
            if mark & 0x80000000:
                break
        yield frags


def reply_body(msg):
    """The result of an accepted, successful reply, or None."""
    if len(msg) < 12 or struct.unpack(">II", msg[4:12]) != (1, 0):
        return None
    vlen = struct.unpack(">I", msg[16:20])[0]
    at = 20 + vlen + (-vlen % 4)
    if struct.unpack(">I", msg[at:at + 4])[0] != 0:
        return None
    return msg[at + 4:]


class Recorder:
    def __init__(self, corpus):
        self.corpus = corpus
        self.calls = {}
        self.lock = threading.Lock()
        self.written = {}
        self.shapes = set()

    def save(self, target, data):
        # One of each shape: the selector and status words, and the length.
        shape = (target, len(data), data[:5] if target != "fuzz_rpc_reply" else data[4:24])
        with self.lock:
            if shape in self.shapes:
                return
            self.shapes.add(shape)
        d = os.path.join(self.corpus, target)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, hashlib.sha1(data).hexdigest())
        with self.lock:
            if not os.path.exists(path):
                with open(path, "wb") as f:
                    f.write(data)
                self.written[target] = self.written.get(target, 0) + 1

    def call(self, msg):
        if len(msg) >= 24:
            xid, _, _, prog, _, proc = struct.unpack(">IIIIII", msg[:24])
            with self.lock:
                self.calls[xid] = (prog, proc)

    def reply(self, msg):
        if len(msg) < 4:
            return
        with self.lock:
            prog, proc = self.calls.pop(struct.unpack(">I", msg[:4])[0], (None, None))
        # Large READ replies add nothing but length: their data is cut.
        self.save("fuzz_rpc_reply", msg[:4096])
        body = reply_body(msg)
        if body is None:
            return
        if prog == 100003 and proc in NFS_SELECTOR:
            if proc == 6 and len(body) > 4096:
                return  # a full-size READ: its small ones are kept
            self.save("fuzz_nfs3_results", bytes([NFS_SELECTOR[proc]]) + body)
            if proc in (16, 17):
                self.save("fuzz_readdir", bytes([proc == 17]) + body)
        elif prog == 100005 and proc == 1:
            self.save("fuzz_mount", b"\x01" + body)


def proxy(rec, listener, upstream):
    def pump(src, dst, on_record):
        try:
            for msg in records(src):
                on_record(msg)
                dst.sendall(struct.pack(">I", 0x80000000 | len(msg)) + msg)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        server = socket.create_connection(upstream)
        threading.Thread(target=pump, args=(client, server, rec.call), daemon=True).start()
        threading.Thread(target=pump, args=(server, client, rec.reply), daemon=True).start()


def listen():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    return s


def workload(mnt):
    sh = lambda cmd: subprocess.run(cmd, shell=True, cwd=mnt, check=True, timeout=300,
                                    stdout=subprocess.DEVNULL)
    sh("mkdir -p corpus-rec && tar cf - -C /usr/share/doc bash | tar xf - -C corpus-rec")
    sh("cd corpus-rec && cp -r /usr/share/doc/coreutils . && ls -lR > /dev/null")
    sh("cd corpus-rec && for i in $(seq 1 300); do echo $i > f$i; done && ls -l > /dev/null")
    sh("cd corpus-rec && ln -s f1 link && readlink link && ln f2 hard && chmod 600 f3 && touch -d 2001-01-01 f4")
    sh("cd corpus-rec && mv f5 f5b && rm f6 && mkdir d && rmdir d && mkfifo fifo && cat f1 f2 >/dev/null")
    sh("cd corpus-rec && dd if=/dev/urandom of=big bs=64k count=20 2>/dev/null && sync && cat big >/dev/null")
    sh("df . >/dev/null; stat -f . >/dev/null; ls nonexistent 2>/dev/null; true")
    sh("cd corpus-rec && cat f7 > /dev/null && echo appended >> f7 && sync")
    # Failures the server answers (with their attributes and wcc data).
    sh("cd corpus-rec && mkdir e && touch e/x && (mkdir e; rmdir e; ln f8 f9; mknod -m 0 zz p; true) 2>/dev/null")
    sh("cd corpus-rec && chmod 000 e && (su nobody -s /bin/sh -c 'ls e; touch e/y' ; true) 2>/dev/null")
    sh("rm -rf corpus-rec")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    binary = sys.argv[1]
    corpus = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "test", "fuzz", "captured")
    rec = Recorder(corpus)
    nfs, mnt_l = listen(), listen()
    for lst, port in ((nfs, 2049), (mnt_l, 20048)):
        threading.Thread(target=proxy, args=(rec, lst, (SERVER, port)), daemon=True).start()
    with tempfile.TemporaryDirectory() as mnt:
        nfs_port, mount_port = nfs.getsockname()[1], mnt_l.getsockname()[1]
        proc = subprocess.Popen([binary, f"127.0.0.1:{EXPORT}", mnt, "-f", "-o",
                                 f"port={nfs_port},mountport={mount_port}"],
                                stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.time() + 30
            while not os.path.ismount(mnt):
                if proc.poll() is not None or time.time() > deadline:
                    sys.exit("mpnfs did not mount: " + (proc.stderr.read() if proc.poll() is not None else ""))
                time.sleep(0.1)
            workload(mnt)
        finally:
            subprocess.run(["fusermount3", "-u", mnt])
            proc.wait(timeout=60)
    for target, n in sorted(rec.written.items()):
        print(f"{target}: {n} new inputs")


if __name__ == "__main__":
    main()
