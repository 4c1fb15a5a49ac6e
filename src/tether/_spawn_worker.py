"""The worker side of ``tether.spawn``: a child joins the job, runs the function, and ends.

A worker dies with its launcher (``PR_SET_PDEATHSIG``), gets the launcher's environment
and the variables a launcher sets (torchrun's, ignite's), joins the launcher's store,
runs the user's function, and on a failure posts it and exits at once with the code that
names it (``errors.ExitCode``). A worker that finishes says how, for a peer that still
waits for it; it then exits without Python's module teardown, which torch makes slow.
The launcher's side, and why workers start from a forkserver, are in ``spawn.py``.
"""

from __future__ import annotations

import atexit
import ctypes
import datetime
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

from torch._C._distributed_c10d import TCPStore

from ._core import context
from ._core.ending import finalize
from ._core.failures import report_failure
from ._core.hooks import end_process, exit_code_for, is_success
from ._core.options import Launch, Options
from ._core.runtime import start
from ._env import Topology
from .errors import ExitCode

JOB_ID = "spawn"  # the launcher's store is new for every job: no stale keys to avoid
_WORKER_LAUNCH = Launch(owned=True, judge_peers=False, node_beats=False)  # the launcher judges and beats


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs to join the job: sent to it, pickled, by the launcher."""

    backend: str
    topology: Topology
    master_addr: str
    master_port: int
    timeout: datetime.timedelta | None
    options: Options
    parent_pid: int
    restart: int = 0  # which attempt this is (``max_restarts``), as TORCHELASTIC_RESTART_COUNT
    environ: dict[str, str] | None = None  # the launcher's environment, for a worker forked from a server
    # the launcher's multiprocessing start method (None: the platform's default) and so the
    # worker's: its own children (a DataLoader's workers) start as the launcher's, or a
    # torchrun rank's, would. A worker forked from the server had inherited "forkserver":
    # a rank tether ended, or a SIGKILL, then left a server and its workers running forever
    start_method: str | None = None


class LaunchersHandler:
    """The launcher's SIGINT/SIGTERM handler (``spawn._Supervisor``), which forwards the stop
    to every worker. A worker forked from the launcher (start method "fork", a notebook's
    default) inherited it: a SIGTERM there forwarded the stop again, from the worker, and
    never raised, until a RecursionError ended the rank ("job failed. Root cause: rank 1
    failed: RecursionError"). ``run_worker`` drops it."""

    def __init__(self, forward: Callable[[int], None]) -> None:
        self._forward = forward

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self._forward(signum)


def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL this worker when its parent dies: the launcher, or the forkserver, which ends
    when the launcher does. Exit at once if the launcher is gone already."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if not _alive(parent_pid):  # the launcher died before prctl took effect
        os._exit(int(ExitCode.PEER_FAILED))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_worker(spec: WorkerSpec, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """A child: join the job, run ``fn``, and on failure post it and exit at once."""
    _die_with_parent(spec.parent_pid)
    if spec.environ is not None:  # forked from the server: its environment is from when it started
        os.environ.clear()
        os.environ.update(spec.environ)
    multiprocessing.set_start_method(spec.start_method, force=True)
    topo = spec.topology
    # what a launcher tells its children (torchrun, ignite's spawn): code that reads them works
    os.environ.update(
        RANK=str(topo.rank),
        LOCAL_RANK=str(topo.local_rank),
        WORLD_SIZE=str(topo.world_size),
        LOCAL_WORLD_SIZE=str(topo.nproc_per_node),
        GROUP_RANK=str(topo.node_rank),
        TORCHELASTIC_RESTART_COUNT=str(spec.restart),
        MASTER_ADDR=spec.master_addr,
        MASTER_PORT=str(spec.master_port),
    )
    code = 0
    try:
        for sig, default in ((signal.SIGTERM, signal.SIG_DFL), (signal.SIGINT, signal.default_int_handler)):
            if isinstance(signal.getsignal(sig), LaunchersHandler):  # forked from the launcher
                signal.signal(sig, default)
        # blocked in tether's forkserver (``spawn._context``): a stop that came since the fork
        # is delivered now (SIGTERM's default action, or a KeyboardInterrupt caught below)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
        store = TCPStore(
            spec.master_addr,
            spec.master_port,
            topo.world_size,
            False,
            timeout=spec.timeout or datetime.timedelta(minutes=5),
        )
        start(
            spec.backend,
            topo,
            store,
            job_id=JOB_ID,
            hosts_store=False,
            options=spec.options,
            launch=_WORKER_LAUNCH,
            timeout=spec.timeout,
        )
        fn(topo.local_rank, *args, **kwargs)
        _leaving("returned from the function")
    except BaseException as exc:
        if not is_success(exc):  # sys.exit(0) is a normal end
            behind = report_failure(exc)  # a raw backend error may have a peer's failure behind it
            code = exit_code_for(behind if isinstance(behind, BaseException) else exc)
        else:
            _leaving("called sys.exit(0)")
    finally:
        try:
            finalize()
        except Exception:
            code = code or int(ExitCode.RAISED)
    if code:
        end_process(code)  # promptly, even with non-daemon threads alive
    _exit_cleanly()


def _leaving(how: str) -> None:
    """Say how this worker finishes, for a peer that still waits for it (``PeerFinished``)."""
    ctx = context.peek()
    if ctx is not None:
        ctx.leaving = how


def _exit_cleanly() -> None:
    """Python's shutdown without its module teardown, which torch makes last ~1 s.

    Non-daemon threads are joined and atexit handlers run, as at a normal exit; only the
    final teardown of modules and objects is skipped, which a child that is about to
    vanish does not need (measured: 1-2 s of the happy path per worker on this machine).
    """
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
