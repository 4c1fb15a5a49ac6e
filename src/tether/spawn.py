"""``tether.spawn``: start the ranks of one node as child processes and supervise them.

The launcher (the parent) hosts the job's store on node 0, so a rank's death never
takes the failure channel down. It watches every child's exit through its process
sentinel: a child that dies without having posted a record (SIGKILL, segfault,
``os._exit``) is posted on its behalf within milliseconds, from its exit status. Once
anything failed, children still alive ``grace + 2`` seconds later are killed. Children
die with their parent (``PR_SET_PDEATHSIG``), so even a SIGKILL of the launcher leaves
no orphan. The root-cause report is printed once, by node 0's launcher.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import datetime
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from torch._C._distributed_c10d import TCPStore

from ._core.channel import Channel
from ._core.hooks import exit_code_for
from ._core.record import KIND_EXIT, KIND_LOST, KIND_SIGNAL, FailureRecord, describe_exit
from ._core.runtime import Options, finalize, report_failure, start, to_timedelta
from ._env import Topology, parse_init_method
from .backends import check_backend
from .errors import ExitCode, JobFailed
from .report import RankOutcome, render_report

JOB_ID = "spawn"  # the launcher's store is new for every job: no stale keys to avoid
_CONSEQUENCES = {int(c) for c in (ExitCode.PEER_FAILED, ExitCode.TIMEOUT, ExitCode.MISMATCH, ExitCode.WATCHDOG)}


@dataclass(frozen=True)
class _WorkerSpec:
    backend: str
    topology: Topology
    master_addr: str
    master_port: int
    timeout: datetime.timedelta | None
    options: Options
    parent_pid: int


def _check_count(value: object, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


def spawn(
    backend: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs_dict: dict[str, Any] | None = None,
    nproc_per_node: int = 1,
    **kwargs: Any,
) -> None:
    """Run ``fn(local_rank, *args, **kwargs_dict)`` in ``nproc_per_node`` new processes.

    Args:
        backend: "gloo", "nccl" or "mpi".
        fn: a picklable function (module level, with the "spawn" start method).
        nnodes, node_rank: this launcher's node among ``nnodes`` (default 1 and 0).
        master_addr, master_port: where node 0's launcher hosts the store (default
            127.0.0.1 and a free port; give the port when ``nnodes > 1``).
        init_method: "tcp://HOST:PORT", instead of master_addr/master_port.
        timeout: torch's process-group timeout (timedelta or seconds).
        start_method: "spawn" (default), "fork" or "forkserver".
        heartbeat, lost_after, grace, sync_timeout, warn_after: see ``initialize``.

    Raises:
        TypeError, ValueError: bad arguments, before any process starts.
        JobFailed: a worker failed; its root-cause report was printed once to stderr.
    """
    check_backend(backend)
    nproc = _check_count(nproc_per_node, "nproc_per_node")
    nnodes = _check_count(kwargs.pop("nnodes", 1), "nnodes")
    node_rank = kwargs.pop("node_rank", 0)
    if not isinstance(node_rank, int) or not 0 <= node_rank < nnodes:
        raise ValueError(f"node_rank must be an int in [0, {nnodes}), got {node_rank!r}")
    addr, port = kwargs.pop("master_addr", None) or "127.0.0.1", kwargs.pop("master_port", None)
    address = parse_init_method(kwargs.pop("init_method", None))
    if address is not None:
        addr, port = address
    if nnodes > 1 and port is None:
        raise ValueError("spawn with nnodes > 1 needs master_port (or init_method='tcp://HOST:PORT')")
    timeout = to_timedelta(kwargs.pop("timeout", None))
    start_method = kwargs.pop("start_method", "spawn")
    if start_method not in multiprocessing.get_all_start_methods():
        raise ValueError(f"start_method must be one of {multiprocessing.get_all_start_methods()}, got {start_method!r}")
    options = Options.from_kwargs(kwargs, store_host=-1)
    world = nnodes * nproc
    store = TCPStore(
        addr, port or 0, world, node_rank == 0, timeout=datetime.timedelta(minutes=5), wait_for_workers=False
    )
    channel = Channel(store, JOB_ID, -1, world)
    mp = multiprocessing.get_context(start_method)
    procs: dict[int, multiprocessing.process.BaseProcess] = {}
    for local in range(nproc):
        topo = Topology(node_rank * nproc + local, world, local, nproc, nnodes, node_rank)
        spec = _WorkerSpec(backend, topo, addr, store.port, timeout, options, os.getpid())
        procs[local] = mp.Process(
            target=_worker, args=(spec, fn, args, kwargs_dict or {}), name=f"tether-rank-{topo.rank}"
        )
    _Supervisor(channel, procs, node_rank * nproc, options, node_rank == 0).run()


class _Supervisor:
    def __init__(
        self,
        channel: Channel,
        procs: dict[int, multiprocessing.process.BaseProcess],
        first_rank: int,
        options: Options,
        prints_report: bool,
    ) -> None:
        self.channel = channel
        self.procs = procs
        self.first_rank = first_rank
        self.kill_after = (options.watchdog.grace or 5.0) + 2.0
        self.prints_report = prints_report
        self.deadline: float | None = None
        self.codes: dict[int, int | None] = {}

    def run(self) -> None:
        saved = self._forward_signals()
        try:
            for p in self.procs.values():
                p.start()
            self._supervise()
        finally:
            for sig, handler in saved.items():
                signal.signal(sig, handler)
        if any(self.codes.values()):
            self._fail()

    def _forward_signals(self) -> dict[signal.Signals, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}

        def forward(signum: int, frame: object) -> None:
            for p in self.procs.values():
                if p.pid is not None and p.exitcode is None:
                    os.kill(p.pid, signum)
            self._arm()

        return {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}

    def _arm(self) -> None:
        if self.deadline is None:
            self.deadline = time.monotonic() + self.kill_after

    def _supervise(self) -> None:
        alive: dict[Any, int] = {p.sentinel: local for local, p in self.procs.items()}
        while alive:
            wait = None if self.deadline is None else max(0.0, self.deadline - time.monotonic())
            for sentinel in multiprocessing.connection.wait(list(alive), wait):
                local = alive.pop(sentinel)
                proc = self.procs[local]
                proc.join()
                self.codes[local] = proc.exitcode
                if proc.exitcode:
                    self._arm()
                    self._post_death(self.first_rank + local, proc.exitcode)
                    self._kill_lost(alive.values())
            if self.deadline is not None and time.monotonic() >= self.deadline:
                for local in alive.values():
                    self.procs[local].kill()

    def _kill_lost(self, alive: Iterable[int]) -> None:
        """Kill at once a child that the channel declared lost (frozen): it cannot recover."""
        with contextlib.suppress(Exception):
            lost = {r.rank for r in self.channel.records() if r.kind == KIND_LOST}
            for local in alive:
                if self.first_rank + local in lost:
                    self.procs[local].kill()

    def _post_death(self, rank: int, code: int) -> None:
        """Post a record for a child that died without one (killed, or exited non-zero)."""
        try:
            records = self.channel.records()
            consequence = code in _CONSEQUENCES and records  # it stopped because of a posted failure
            if consequence or any(r.rank == rank for r in records):
                return
            how = describe_exit(code)
            self.channel.post(
                FailureRecord(
                    rank=rank,
                    kind=KIND_SIGNAL if code < 0 else KIND_EXIT,
                    exc_type=signal.Signals(-code).name if code < 0 else "SystemExit",
                    message=f"process {how}",
                    pid=self.procs[rank - self.first_rank].pid or 0,
                    time=time.time(),
                    reporter=-1,
                )
            )
        except Exception as exc:  # the store's host (another node) may be gone already
            print(f"tether: could not post the death of rank {rank}: {exc}", file=sys.stderr)

    def _fail(self) -> None:
        records: list[FailureRecord] = []
        with contextlib.suppress(Exception):  # another node's launcher may host the store, and be gone
            records = self.channel.records()
        outcomes = {
            self.first_rank + local: RankOutcome(
                self.first_rank + local, code, _line(code, records, self.first_rank + local)
            )
            for local, code in self.codes.items()
        }
        report = render_report(records, outcomes) if records else ""
        if self.prints_report:
            sys.stderr.write(report or f"tether: job failed; worker exit codes {self.codes}\n")
        elif not records:  # the store is unreadable: node 0's launcher, its host, may be gone
            sys.stderr.write(f"tether: job failed and the job's store is unreachable; worker exit codes {self.codes}\n")
        else:
            sys.stderr.write("tether: job failed; node 0's launcher prints the root-cause report\n")
        sys.stderr.flush()
        raise JobFailed(records[0] if records else None, self.codes, report)


def _line(code: int | None, records: list[FailureRecord], rank: int) -> str:
    if code == 0:
        return "finished"
    if records and records[0].rank == rank:
        return f"ROOT CAUSE: {records[0].exc_type}: {records[0].message} ({describe_exit(code)})"
    names = {int(c): c.name for c in ExitCode}
    if code is not None and code in names:
        return f"stopped: {names[code]} ({describe_exit(code)})"
    return describe_exit(code)


def _die_with_parent(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(int(ExitCode.PEER_FAILED))


def _worker(spec: _WorkerSpec, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """A child: join the job, run ``fn``, and on failure post it and exit at once."""
    _die_with_parent(spec.parent_pid)
    code = 0
    try:
        topo = spec.topology
        store = TCPStore(
            spec.master_addr,
            spec.master_port,
            topo.world_size,
            False,
            timeout=spec.timeout or datetime.timedelta(minutes=5),
        )
        start(spec.backend, topo, store, job_id=JOB_ID, hosts_store=False, options=spec.options, timeout=spec.timeout)
        fn(topo.local_rank, *args, **kwargs)
    except BaseException as exc:
        code = exit_code_for(exc)
        report_failure(exc)
    finally:
        try:
            finalize()
        except Exception:
            code = code or int(ExitCode.RAISED)
    if code:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # promptly, even with non-daemon threads alive
    _exit_cleanly()


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
