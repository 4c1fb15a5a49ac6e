"""Run one benchmark job as a new session, bounded, and make sure nothing of it survives.

Shared by ``sync.py`` and ``faults.py``: every job is a fresh interpreter (torchrun, or a
launcher calling ``tether.spawn``) started as the leader of its own session, so that a
timeout can kill the whole process tree by its session id, and so that we can prove by
scanning /proc that no process of the job is left.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Finished:
    returncode: int | None  # None: killed at the bound
    stdout: str
    stderr: str
    started: float  # time.time() just before the launcher was started
    exited: float  # time.time() when the launcher's exit was seen
    leftovers: list[int]  # processes of the session still alive after ``settle`` (then killed)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def session_pids(sid: int) -> list[int]:
    """Live (non-zombie) processes whose session id is ``sid``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[3]) == sid:
            found.append(int(entry))
    return found


def run(args: list[str], bound: float, env: dict[str, str] | None = None, settle: float = 3.0) -> Finished:
    """Run ``args`` as a new session; SIGKILL the session at ``bound`` seconds."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    started = time.time()
    proc = subprocess.Popen(
        args, cwd=ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=bound)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        code = None
    except BaseException:  # Ctrl-C, SIGTERM (see exit_on_sigterm): take the job down with us
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    exited = time.time()
    deadline = time.monotonic() + settle
    left = session_pids(proc.pid)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = session_pids(proc.pid)
    if left:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return Finished(code, out, err, started, exited, left)


def exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit, so that ``run`` kills the job it is waiting on."""

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
