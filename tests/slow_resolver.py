"""Run a command under a slow DNS resolver: how a CI host's resolver can look.

    python tests/slow_resolver.py .venv/bin/python -m pytest -rf
    python tests/slow_resolver.py --answer-after 1.5 .venv/bin/python tests/jobs/store_waits.py raise default get

c10d formats a socket's address with ``getnameinfo`` and no ``NI_NUMERICHOST`` (torch's
``socket.cpp``: for each new store connection, and in its timeout warnings): a reverse
lookup of ``::ffff:127.0.0.1``, which ``/etc/hosts`` does not list, so it goes to the
resolver. Here it usually answers in about a millisecond, and in 5 of 300 lookups after
its 5-s timeout (``benchmarks/results/store-connect.md``); a CI host once took long
enough to fail a test (``test_lifecycle.py``'s teardown test, 2026-12-04).

Two resolvers:

* **Never answers** (the default): each lookup takes 10 s (``timeout:5 attempts:2``) and
  ends in ``EAI_AGAIN``, and c10d prints "The hostname of the client socket cannot be
  retrieved. err=-3". c10d then stops asking, it seems: in one process, the first new
  connection took 10 s and the next four 0.0 s each (2026-12-07, by hand).
* **Answers late** (``--answer-after S``): every query gets "no such name" after ``S``
  seconds, so every lookup succeeds, late, and c10d asks again for each connection: with
  1.5 s, a new connection (``TCPStore.clone()``) took 3.0 s, both ends' lookups (same
  day, by hand). This is the resolver that shows a wait on a connection that opens late.

How: a UDP and a TCP socket bound to port 53 of a loopback address (the first free of
``ADDRESSES``: runs side by side get one each), and the command run in a mount namespace
of its own (``unshare -m``) whose ``/etc/resolv.conf`` names only that server. Needs root
(the mount namespace and port 53); the host's own resolver is left alone. Measured with
the first (2026-12-04, 2 cores): the default suite took 1612 s and failed 2 tests, both
since made independent of the connection time; after that (at commit cb2031c) it passed
whole: 348 passed, 89 skipped in 1627 s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

ADDRESSES = [f"127.0.53.{i}" for i in range(1, 255)]  # port 53 on the first one free: one per run
NEVER = "options timeout:5 attempts:2"
LATE = "options timeout:5 attempts:1"  # an answer within 5 s is taken


def available() -> bool:
    """What running a command under it takes, tried: root, a mount namespace with a bind
    mount of ``/etc/resolv.conf`` in it (a container may deny both), port 53 on loopback."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    trial = ["unshare", "-m", "sh", "-c", "mount --bind /etc/resolv.conf /etc/resolv.conf"]
    if subprocess.run(trial, capture_output=True, timeout=30).returncode != 0:
        return False
    try:
        udp, tcp, _ = _bound()
    except OSError:
        return False
    udp.close()
    tcp.close()
    return True


def _bound() -> tuple[socket.socket, socket.socket, str]:
    """A UDP and a TCP socket on port 53 of the first address of ``ADDRESSES`` free for both."""
    for host in ADDRESSES:
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            udp.bind((host, 53))
            tcp.bind((host, 53))
        except OSError:
            udp.close()
            tcp.close()
            continue
        return udp, tcp, host
    raise OSError(f"port 53 is taken on every address {ADDRESSES[0]}..{ADDRESSES[-1]}")


def no_such_name(query: bytes) -> bytes:
    """The answer to a DNS ``query``: its id and question, rcode 3 (no such name)."""
    ident, flags = struct.unpack("!HH", query[:4])
    end = 12  # the question's name: labels up to a zero byte, then its type and class
    while query[end] != 0:
        end += query[end] + 1
    end += 5
    flags = 0x8000 | (flags & 0x7900) | 0x0080 | 3  # a response; the query's opcode and RD; RA; NXDOMAIN
    return struct.pack("!HHHHHH", ident, flags, 1, 0, 0, 0) + query[12:end]


def _answer_late(udp: socket.socket, after: float) -> None:
    def answer(query: bytes, peer: tuple[str, int]) -> None:
        time.sleep(after)
        udp.sendto(no_such_name(query), peer)

    while True:
        query, peer = udp.recvfrom(4096)
        threading.Thread(target=answer, args=(query, peer), daemon=True).start()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--answer-after", type=float, default=None, metavar="S", help="answer every query after S s")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if not args.command:
        parser.error("no command")
    udp, tcp, host = _bound()
    with udp, tcp, tempfile.NamedTemporaryFile("w", suffix=".resolv.conf") as conf:
        tcp.listen(64)  # connections are accepted by the kernel and never served
        if args.answer_after is not None:
            threading.Thread(target=_answer_late, args=(udp, args.answer_after), daemon=True).start()
        # else queries queue up unread
        conf.write(f"nameserver {host}\n{NEVER if args.answer_after is None else LATE}\n")
        conf.flush()
        inner = 'mount --bind "$0" /etc/resolv.conf && exec "$@"'
        command = subprocess.Popen(["unshare", "-m", "sh", "-c", inner, conf.name, *args.command])
        # a stop the command's test sends its whole process group (``jobs/spawn_stopped_early.py``)
        # reaches this process too: ignored, as a shell ignores it while a command runs, so the
        # resolver goes on answering until the command ends (it had died of it, and the job
        # with it: "LAUNCHER OSError" in a run of the default suite under this resolver)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        return command.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
