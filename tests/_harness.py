"""Run a job in its own session, bounded from outside, and check that nothing is left.

Every distributed test starts a job (``python script.py`` or torchrun) as the leader of a
new session, with a unique ``TETHER_TEST_JOB`` tag in its environment. Every process the
job starts inherits the tag — torchrun's workers too, although torchrun starts them in
sessions of their own — so the test can find, kill and prove gone every process of the
job by its leader's session and by scanning /proc for the tag. The leader is forked from
a process that has imported torch already (``_zygote``) wherever that starts it as
``python`` would.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import importlib.util
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from _zygote import ForkedJob, Zygote

ROOT = Path(__file__).resolve().parent.parent
JOBS = Path(__file__).resolve().parent / "jobs"


@dataclass
class Result:
    returncode: int | None
    stdout: str
    stderr: str
    elapsed: float
    leftovers: list[int]

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


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


def tagged_pids(tag: str) -> list[int]:
    """Live (non-zombie) processes whose environment carries ``TETHER_TEST_JOB=<tag>``."""
    needle = f"TETHER_TEST_JOB={tag}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if needle not in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                continue
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if stat[stat.rindex(")") + 2] != "Z":
            found.append(int(entry))
    return found


def _dump_stacks(tag: str, leader: int, wait: float = 3.0) -> None:
    """Have every process of the job print its threads' Python stacks to its stderr, and end.

    Jobs run with ``PYTHONFAULTHANDLER=1``: on SIGABRT, faulthandler writes every thread's
    stack, then the process aborts. Used on a job that ran past its bound, so a hang's
    test output says where each process waited (a --full run's job once hung with no line
    of output at all). Core dumps are turned off first: no core file in the checkout.
    """
    for pid in _job_pids(tag, leader):
        with contextlib.suppress(OSError):  # gone meanwhile, or not ours to limit
            resource.prlimit(pid, resource.RLIMIT_CORE, (0, 0))
            os.kill(pid, signal.SIGABRT)
    deadline = time.monotonic() + wait
    while _job_pids(tag, leader) and time.monotonic() < deadline:  # a stopped process stays: killed below
        time.sleep(0.05)


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def run(args: list[str], bound: float, env: dict[str, str] | None = None, settle: float = 3.0) -> Result:
    """Run ``args`` as a new session; kill the session at ``bound`` seconds.

    ``leftovers`` lists processes of the job still alive ``settle`` seconds after the
    leader exited (a launcher's children may take a moment to be reaped); they are
    killed before this returns. A job's leader is forked from the zygote where it may be
    (``_zygote``); every other process of the job starts as the job starts it.
    """
    tag = uuid.uuid4().hex
    full_env = {**_base_env(), **(env or {}), "TETHER_TEST_JOB": tag}
    start = time.monotonic()
    proc: subprocess.Popen[str] | ForkedJob | None = _zygote().start(args, full_env, str(ROOT))
    if proc is None:
        pipe = subprocess.PIPE
        proc = subprocess.Popen(
            args, cwd=ROOT, env=full_env, stdout=pipe, stderr=pipe, text=True, start_new_session=True
        )
    try:
        out, err = proc.communicate(timeout=bound)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        _dump_stacks(tag, proc.pid)
        _kill(_job_pids(tag, proc.pid))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        code = None
    elapsed = time.monotonic() - start
    deadline = time.monotonic() + settle
    left = _job_pids(tag, proc.pid)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = _job_pids(tag, proc.pid)
    _kill(left)
    # the job's whole output, into the test's captured stdout, which pytest shows for a
    # failed test only: assertion messages quote a tail of it, and a flake's cause was
    # once earlier than that tail
    print(f"==== job {args[1:]}: exit {code}, {elapsed:.1f} s, left {left}")
    print(f"---- its stdout\n{out}---- its stderr\n{err}---- end of job")
    return Result(code, out, err, elapsed, left)


def _job_pids(tag: str, leader: int) -> list[int]:
    """The job's live processes: its leader's session, and every process carrying its tag
    (torchrun's workers start sessions of their own; a forked leader's /proc environ is the
    zygote's, without the tag)."""
    return sorted(set(session_pids(leader)) | set(tagged_pids(tag)))


def _base_env() -> dict[str, str]:
    # faulthandler: a job's process that aborts in C++ (SIGABRT, seen once in CI) prints
    # every thread's Python stack, so the failing test's output says where it was
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}


@functools.cache
def _zygote() -> Zygote:
    return Zygote(_base_env())


def python(
    script: str, *script_args: str, bound: float, env: dict[str, str] | None = None, settle: float = 3.0
) -> Result:
    """Run ``tests/jobs/<script>`` with this interpreter (``settle``: see ``run``)."""
    return run([sys.executable, str(JOBS / script), *script_args], bound, env, settle)


def torchrun(
    script: str,
    *script_args: str,
    nproc: int,
    bound: float,
    env: dict[str, str] | None = None,
    launcher: tuple[str, ...] = (),
) -> Result:
    """Run ``tests/jobs/<script>`` under ``python -m torch.distributed.run`` on loopback.

    ``launcher``: more torchrun options (``("--max-restarts", "1")``).
    """
    args = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(nproc),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        "--monitor_interval",
        "0.1",
        *launcher,
        str(JOBS / script),
        *script_args,
    ]
    return run(args, bound, env)


def made_once(factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]) -> Path:
    """A directory ``make`` fills once per test session, shared by pytest-xdist's workers.

    Each worker has its own base temporary directory; their parent is the session's (under
    xdist only: without it, the parent is shared by every past session). The first worker
    to take the lock makes it; the others wait, then find it done.
    """
    if "PYTEST_XDIST_WORKER" not in os.environ:
        out = factory.mktemp(name)
        make(out)
        return out
    root = factory.getbasetemp().parent
    out = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / ".made").exists():
            shutil.rmtree(out, ignore_errors=True)  # a maker that failed part-way
            out.mkdir()
            make(out)
            (out / ".made").touch()
    return out


def free_port() -> int:
    """A port for a test's server to listen on: the jobs' own choice
    (``jobs/lifecycle_common.free_port``: below the kernel's ephemeral range)."""
    return int(_jobs_common().free_port())


@functools.cache
def _jobs_common() -> Any:
    """``tests/jobs/lifecycle_common.py``, which job scripts import by name (it imports no torch)."""
    spec = importlib.util.spec_from_file_location("lifecycle_common", JOBS / "lifecycle_common.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
