"""Shared by the ``lifecycle_*`` job scripts (issue 7): one-line reports and plain rank processes.

Every report is written with one ``os.write`` (under ``PIPE_BUF``), so the lines of different
processes never interleave. A rank that catches an exception prints a line for people and a
line for the test::

    rank 0 raised PeerLost: rank 2 failed: Lost: ...
    LC {"event": "raised", "rank": 0, "exc": "PeerLost", "failing": 2, "orig_type": "Lost", ...}

Other events (``done``, ``stop``, ``round``, ``exit``, ``launcher``, ...) are ``LC`` lines too;
``tests/test_*.py`` read them with ``lc_events``. This module imports no torch, so a parent
that only starts ranks starts fast.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

MAX_MSG = 400


def hold_gil(seconds: float) -> float:
    """One C call that holds the GIL for ``seconds`` of wall time: libc's ``usleep``, as a C
    extension that blocks without releasing the GIL. Returns the seconds it held.

    It used to be ``sum(range(N))`` with N calibrated in the job, whose length followed the
    machine's load: calibrated while the machine was busier, it held 2.5 and 2.6 s of 5;
    meant for 13 s, 7.6 (the test needs 8); with a second, rescaled call when the first fell
    short, 7.3 (a ``--full`` run on 2026-12-06).
    """
    keeps_the_gil = ctypes.PyDLL(None)  # libc, through PyDLL: its calls do not release the GIL (CDLL's do)
    t = time.perf_counter()
    keeps_the_gil.usleep(int(seconds * 1_000_000))
    return time.perf_counter() - t


def _line(event: str, data: dict[str, Any]) -> str:
    return "LC " + json.dumps({"event": event, **data}, sort_keys=True, default=repr) + "\n"


def emit(event: str, **data: Any) -> None:
    os.write(1, _line(event, data).encode())


@contextlib.contextmanager
def stops_held() -> Iterator[None]:
    """A report's line is written whole: SIGTERM is held meanwhile, then sent again.

    torchrun SIGTERMs the survivors 0.1 s after a worker exited; one that landed while a
    survivor wrote its ``raised``/``RESULT`` line cut the line, and the test, not seeing
    the exception the rank had raised, failed (CI, once). The stop itself still happens.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: came.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if came:
            os.kill(os.getpid(), signal.SIGTERM)


def safe_str(obj: object) -> str:
    """``str(obj)``, or a placeholder when its ``__str__`` raises."""
    try:
        return str(obj)
    except BaseException:
        return f"<str() of {type(obj).__name__} raised>"


def raised(rank: int, exc: BaseException, **extra: Any) -> None:
    """Report the exception this rank caught (it re-raises it afterwards)."""
    with stops_held():
        _raised(rank, exc, extra)


def _raised(rank: int, exc: BaseException, extra: dict[str, Any]) -> None:
    import tether

    msg = safe_str(exc)
    data: dict[str, Any] = {
        "rank": rank,
        "exc": type(exc).__name__,
        "mro": [c.__name__ for c in type(exc).__mro__],
        "msg": msg[:MAX_MSG],
        "time": time.time(),
        "pid": os.getpid(),
        "peer_failure": isinstance(exc, tether.PeerFailure),
        "interrupt": isinstance(exc, (KeyboardInterrupt, SystemExit)),
        **extra,
    }
    if isinstance(exc, tether.PeerFailure):
        message = safe_str(exc.message)
        data.update(failing=exc.rank, orig_type=exc.exc_type, orig_msg=message[:MAX_MSG], orig_len=len(message))
    first = msg.splitlines()[0][:300] if msg else ""
    os.write(1, (f"rank {rank} raised {type(exc).__name__}: {first}\n" + _line("raised", data)).encode())


def launcher_failed(exc: BaseException, **extra: Any) -> None:
    """Report what a launching process (``tether.spawn``, ``Parallel``) raised."""
    import tether

    data: dict[str, Any] = {
        "exc": type(exc).__name__,
        "mro": [c.__name__ for c in type(exc).__mro__],
        "msg": safe_str(exc)[:MAX_MSG],
        **extra,
    }
    if isinstance(exc, tether.JobFailed):
        rec = exc.record
        data.update(
            exit_codes={str(k): v for k, v in exc.exit_codes.items()},
            root_rank=rec.rank if rec is not None else None,
            root_type=rec.exc_type if rec is not None else None,
            root_msg=safe_str(rec.message)[:MAX_MSG] if rec is not None else None,
        )
    emit("launcher", **data)


_DRAW = random.SystemRandom()  # not the random module's state, which a test or job may seed
# Ports drawn by any test or job of this machine, each a file made when drawn: a port is
# not drawn again while its file is younger than ``_HELD`` seconds. A job that draws its
# ports at its start and listens on one ten seconds later lost it once to another test's
# draw meanwhile (EADDRINUSE, ``lifecycle_cycles.py``'s third round, 2026-12-07).
_DRAWN = os.path.join(tempfile.gettempdir(), "tether-test-ports")
_HELD = 600.0


def free_port() -> int:
    """A port for a test's server to listen on, below the kernel's ephemeral range.

    A port the kernel hands out for ``bind(0)`` comes from the range it also takes the
    source ports of outgoing connections from (``ip_local_port_range``: 32768-60999
    here): free when asked, it was taken before the job's store bound it, by a
    connection of the test running beside it (EADDRINUSE, seen in a full run). One
    drawn at random below that range, and bound once to check it is free, is not.
    """
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768
    for _ in range(100):
        port = _DRAW.randrange(20000, max(ephemeral, 20001))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        if _hold(port):
            return port
    with socket.socket() as s:  # the range below is all taken: the kernel's choice
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _hold(port: int) -> bool:
    """Mark ``port`` drawn; False if another draw holds it (see ``_DRAWN``)."""
    os.makedirs(_DRAWN, exist_ok=True)
    path = os.path.join(_DRAWN, str(port))
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        try:
            if time.time() - os.stat(path).st_mtime < _HELD:
                return False
            os.utime(path)  # an old draw's: taken over
            return True
        except OSError:
            return False


def start(argv: Sequence[str], env: dict[str, str] | None = None, stderr: Any = None) -> subprocess.Popen[bytes]:
    """Start ``python <argv>``: a rank in a fresh interpreter (it inherits the job's tag)."""
    return subprocess.Popen([sys.executable, *argv], env={**os.environ, **(env or {})}, stderr=stderr)


def wait_all(procs: dict[str, subprocess.Popen[bytes]], bound: float) -> dict[str, int | None]:
    """Wait for every process (name -> process) until ``bound`` seconds; kill the rest.

    Emits ``LC {"event": "exit", "name": ..., "code": ...}`` per process (code None: it was
    still running at the bound and was killed). A process past the bound first gets SIGABRT,
    so that faulthandler (``PYTHONFAULTHANDLER``, inherited from the harness) writes each of
    its threads' Python stack to its stderr: where it hung (a rank killed at the bound of a
    fresh clone's run left no word of it, 2026-12-06).
    """
    deadline = time.monotonic() + bound
    codes: dict[str, int | None] = {}
    for name, proc in procs.items():
        try:
            codes[name] = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            codes[name] = None
    for name, proc in procs.items():
        if codes[name] is None:
            proc.send_signal(signal.SIGABRT)
            try:
                proc.wait(timeout=3.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        emit("exit", name=name, code=codes[name])
    return codes


# The start of a ``run_pair`` program that reports, as ``TEARDOWN <rank> <tether threads
# still running>``, what is left right before Python's teardown: an ``atexit`` function
# registered before tether's runs after it.
TEARDOWN_REPORT = """
import atexit, os, sys, threading

def at_teardown():
    running = sorted(t.name for t in threading.enumerate() if t.name.startswith("tether-"))
    os.write(1, f"TEARDOWN {sys.argv[2]} {running}\\n".encode())

atexit.register(at_teardown)
"""


def run_pair(program: str, label: str = "") -> None:
    """Run ``program`` (``python -c``) as ranks 0 and 1 of a fresh ``tcp://`` job, to the end.

    Prints ``EXIT <label><rank> <code>``, then ``STDERR <label><rank>: <line>`` for each
    line the rank wrote to stderr: a teardown that aborts (SIGABRT, "terminate called
    ...") or a C++ store warning shows there. Each rank gets 60 s.
    """
    method = f"tcp://127.0.0.1:{free_port()}"
    procs = [
        subprocess.Popen([sys.executable, "-c", program, method, str(r)], stderr=subprocess.PIPE, text=True)
        for r in range(2)
    ]
    for r, proc in enumerate(procs):
        _, err = proc.communicate(timeout=60)
        os.write(1, f"EXIT {label}{r} {proc.returncode}\n".encode())
        for line in err.splitlines():
            os.write(1, f"STDERR {label}{r}: {line}\n".encode())


def start_in_step() -> int:
    """``tether.initialize("gloo")``, then sleep until 0.1 s past the next whole second but one.

    Every rank wakes at the same wall-clock instant, early in a second: a failure and its
    victims then share torchrun's one-second timestamp. Returns this rank.
    """
    import math

    import tether  # here, not at the top: this module imports no torch

    tether.initialize("gloo")
    rank = tether.get_rank()
    tether.barrier()
    start = math.ceil(time.time()) + 1.1
    time.sleep(start - time.time())
    return rank
