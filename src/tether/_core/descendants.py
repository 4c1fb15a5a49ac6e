"""The processes a rank started, ended with it when it ends on a failure or a stop.

A rank's own helpers (``subprocess.Popen`` of a logger, a ``tensorboard``, a shell
command's children) outlived a failed job and kept its stdout open: ``python train.py |
tee log`` never returned. torchrun ends a worker's process group when it stops a worker
that is still running; a tether rank ends by itself first (a victim exits 3 within
milliseconds), so torchrun never came to it, and ``tether.spawn`` never ended a rank's
helpers at all. By hand (2 ranks, each with a ``sleep 1000`` helper, rank 1 raising):
both helpers lived on under either launcher; plain torch under torchrun left rank 1's.

``terminate`` sends SIGTERM to every descendant of this process still in its session,
read from ``/proc`` (Linux; elsewhere nothing is done). A descendant that left the
session (``setsid``, ``start_new_session=True``: a daemon by intent) is left alone with
everything under it. No SIGKILL follows: multiprocessing's resource tracker ignores
SIGTERM and must outlive the rank to unlink what the rank leaked, and a helper that
ignores SIGTERM chose to. A clean exit ends nothing, as Python's does not.
"""

from __future__ import annotations

import contextlib
import os
import signal

_PROC = "/proc"


def terminate() -> list[int]:
    """SIGTERM this process's descendants in its session; returns the pids signalled."""
    try:
        session = os.getsid(0)
        children = _children_by_parent()
    except OSError:
        return []
    signalled: list[int] = []
    todo = [os.getpid()]
    while todo:
        for pid, its_session in children.get(todo.pop(), ()):
            if its_session != session:
                continue  # detached on purpose, with its subtree
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
                signalled.append(pid)
            todo.append(pid)
    return signalled


def _children_by_parent() -> dict[int, list[tuple[int, int]]]:
    """``{ppid: [(pid, session), ...]}`` of every process ``/proc`` shows."""
    found: dict[int, list[tuple[int, int]]] = {}
    for entry in os.scandir(_PROC):
        if not entry.name.isdigit():
            continue
        try:
            with open(os.path.join(entry.path, "stat"), "rb") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        # after the command's ")": state, ppid, pgrp, session, ...
        fields = stat[stat.rindex(b")") + 2 :].split()
        found.setdefault(int(fields[1]), []).append((int(entry.name), int(fields[3])))
    return found
