"""A node's heartbeat, beaten by a process of its own, so that no rank's GIL can stop it.

With more than one node, every node beats a counter on the job's store, and a node whose
counter stands still for ``lost_after`` is lost with all its ranks (``liveness.NodeWatch``).
Under ``tether.spawn`` the launcher beats. Under torchrun or SLURM it was the keeper
thread of the node's local rank 0, a Python thread: a C call that held that rank's GIL
for ``lost_after`` (a ``sorted`` or ``pickle.dumps`` of a few million objects does)
stopped the beat, and the other nodes ended a healthy job. Now local rank 0 starts this
script (``start``), which beats for it as long as its process lives and is not stopped:

    python -I beater.py HOST PORT KEY PID PERIOD

It speaks TCPStore's wire protocol (VALIDATE, then ADD) on a socket of its own, and reads
the rank's state in /proc every ``PERIOD`` seconds: running (busy or not), it beats;
stopped (SIGSTOP, a tracer), it does not, so that the node is lost as before; gone, it
exits. The kernel kills it with the thread that started it (``PR_SET_PDEATHSIG``); a
store that closes its connection ends it too. The rank's keeper beats again itself if
this process is gone (``liveness.NodeWatch``).

The standard library only, and no import of tether's package: its first beat comes 46 ms
after ``start``, and it holds 12 MiB (``benchmarks/results/beater.md``), where importing
torch would take a second and hundreds of MB. ``liveness`` and
``stores`` take their /proc reader and the wire protocol's numbers from here, so that
there is one of each.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import struct
import subprocess
import sys
import time

# TCPStore's wire protocol (torch/csrc/distributed/c10d/TCPStoreBackend.hpp, torch 2.13):
# a client first sends VALIDATE with the magic number, then queries. ADD sends the key (a
# 64-bit length, then its bytes) and a 64-bit delta, and gets the new value back; the
# server keeps a torch client's keys under "/" + key. PING carries a 32-bit nonce that the
# server sends back (``stores.StorePing``).
VALIDATE, ADD, PING = 0, 4, 13
MAGIC = 0x3C85F7CE
_PR_SET_PDEATHSIG = 1


def process_state(pid: int) -> str | None:
    """The state letter of ``pid`` in /proc (``R``, ``S``, ``T``...), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fp:
            stat = fp.read()
    except OSError:
        return None
    state = stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3].decode()
    return None if state in ("Z", "X") else state


def stopped(state: str | None) -> bool:
    return state in ("T", "t")


def connect(host: str, port: int, timeout: float) -> socket.socket:
    """A connection to a TCPStore's server, validated as its clients do."""
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.sendall(struct.pack("=BI", VALIDATE, MAGIC))
    return sock


def add(sock: socket.socket, key: str, delta: int) -> int:
    """TCPStore's ADD of ``delta`` to the raw ``key``; the new value."""
    raw = key.encode()
    sock.sendall(struct.pack("=BQ", ADD, len(raw)) + raw + struct.pack("=q", delta))
    reply = b""
    while len(reply) < 8:
        chunk = sock.recv(8 - len(reply))
        if not chunk:
            raise ConnectionError("the store closed the connection")
        reply += chunk
    return int(struct.unpack("=q", reply)[0])


def start(host: str, port: int, key: str, period: float) -> subprocess.Popen[bytes] | None:
    """Start a beater for this process on the store at ``host:port``; None if it could not.

    ``key`` is the counter's name as a torch client of the ``TCPStore`` itself (no
    ``PrefixStore``) names it. The process shares this one's session, output and pid
    namespace.
    """
    argv = [sys.executable, "-I", __file__, host, str(port), "/" + key, str(os.getpid()), repr(period)]
    try:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, close_fds=True)
    except OSError:
        return None


def main(argv: list[str]) -> int:
    host, port, key, pid, period = argv[0], int(argv[1]), argv[2], int(argv[3]), float(argv[4])
    with contextlib.suppress(OSError, AttributeError):  # Linux (glibc): die with the starting thread
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != pid:  # it ended before the line above
        return 0
    try:
        sock = connect(host, port, timeout=max(2.0, period))
    except OSError:
        return 1
    with sock:
        while (state := process_state(pid)) is not None:
            if not stopped(state):
                try:
                    add(sock, key, 1)
                except TimeoutError:  # a slow store: the next beat reads this one's late reply
                    pass
                except OSError:  # the store is gone: the job is ending
                    return 0
            time.sleep(period)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
