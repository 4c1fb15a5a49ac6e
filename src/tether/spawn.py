"""``tether.spawn``: start the ranks of one node as child processes and supervise them.

The launcher (the parent) hosts the job's store on node 0, so a rank's death never
takes the failure channel down. It is the judge of its children's liveness, from outside
their GIL (``liveness.py``): it watches every child's exit through its process sentinel,
and a child that dies without having posted a record (SIGKILL, segfault, ``os._exit``) is
posted on its behalf within milliseconds, from its exit status; a child stopped
(SIGSTOP) for ``lost_after`` is posted as lost and killed. With more than one node it
beats its node's heartbeat. Once anything failed, children still alive ``grace + 2``
seconds later are killed. Children die with their parent (``PR_SET_PDEATHSIG``), so even
a SIGKILL of the launcher leaves no orphan. The root-cause report is printed once, by
node 0's launcher.

Workers start from a forkserver by default (where the platform has one): a server process
that imported tether, and so torch, once, forks each worker, so a worker does not import
torch itself. That import is most of a spawned worker's start, and with more workers
than cores it is paid in turn (``benchmarks/startup.py`` measures both). The
worker gets the launcher's environment of the moment it starts, as with "spawn"; what
torch reads when it is *imported* (``OMP_NUM_THREADS`` for its OpenMP library, say)
keeps its value from the first ``spawn`` of the process, when the server started:
``start_method="spawn"`` re-reads it each time.

A function defined where a child cannot import it (``python -`` from stdin, ``python -c``,
a notebook) is run with the "fork" start method, as ignite does in Jupyter; with an
explicit ``start_method="spawn"`` it is refused with one line that says what to do, as is
a function that cannot be pickled, before any process starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from . import _checks
from ._checks import to_timedelta
from ._core.channel import Channel, generation
from ._core.hooks import Terminated
from ._core.liveness import NodeWatch, PeerJudge
from ._core.options import Options
from ._core.record import KIND_EXIT, KIND_SIGNAL, FailureRecord, describe_exit
from ._core.stores import job_store
from ._env import Topology, file_path, parse_init_method
from ._spawn_worker import JOB_ID, LaunchersHandler, WorkerSpec, run_worker
from .backends import check_backend
from .errors import ExitCode, JobFailed
from .report import RankOutcome, cause_line, end_quietly_if_uncaught, raised_everywhere, render_report

_PERIOD = 0.2  # seconds between the launcher's looks at its children's /proc state
_CONSEQUENCES = {int(c) for c in (ExitCode.PEER_FAILED, ExitCode.TIMEOUT, ExitCode.MISMATCH, ExitCode.WATCHDOG)}


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
        start_method: "forkserver" (default where the platform has it; the module
            docstring says why), "spawn" (the default elsewhere, and ignite's), or "fork"
            (the default for a function defined without a file, such as in a notebook).
        join: True (the default, and the only value: the launcher supervises its workers).
        daemon: start the workers as daemonic processes (default False, as torch's).
        max_restarts: after a failed attempt, start every worker again, up to this many
            times (default 0; one node only), as ``torchrun --max-restarts``: workers read
            the attempt in ``TORCHELASTIC_RESTART_COUNT``, and ``tether.Checkpointer``
            resumes where the failed attempt stopped.
        heartbeat, lost_after, grace, sync_timeout, warn_after, check_collectives: see
            ``initialize``.

    Raises:
        TypeError, ValueError: bad arguments, before any process starts.
        JobFailed: a worker failed; its root-cause report was printed once to stderr.
    """
    check_backend(backend, "spawn")
    nproc = _checks.check_nproc_per_node(nproc_per_node)
    nnodes = _checks.check_nnodes(kwargs.pop("nnodes", 1))
    node_rank = _checks.check_node_rank(kwargs.pop("node_rank", None if nnodes > 1 else 0), nnodes)
    addr = kwargs.pop("master_addr", None) or os.environ.get("MASTER_ADDR") or "127.0.0.1"
    port = kwargs.pop("master_port", None) or os.environ.get("MASTER_PORT")
    if port is not None:
        port = _checks.check_port(port)
    init_method = kwargs.pop("init_method", None)
    address, shared_file = parse_init_method(init_method), file_path(init_method)
    if address is not None:
        addr, port = address
    if nnodes > 1 and port is None and shared_file is None:
        raise ValueError(
            "If number of nodes larger than one, arguments master_addr and master_port should be specified "
            "(or init_method='tcp://HOST:PORT' or 'file:///shared/path')"
        )
    timeout = to_timedelta(kwargs.pop("timeout", None))
    start_method = _checks.check_start_method(fn, kwargs.pop("start_method", None))
    if kwargs.pop("join", True) is not True:
        raise ValueError(
            "spawn: join=False is not supported: tether's launcher supervises its workers until they end "
            "(run spawn in a thread of your own to do something else meanwhile)"
        )
    daemon = kwargs.pop("daemon", False)
    if not isinstance(daemon, bool):
        raise ValueError(f"spawn: daemon must be a bool, got {daemon!r}")
    max_restarts = _checks.check_max_restarts(kwargs.pop("max_restarts", 0), nnodes)
    options = Options.from_kwargs(kwargs, store_host=-1)
    world = nnodes * nproc
    store, addr = job_store(addr, port, world, node_rank, shared_file)
    mp = _context(start_method)
    for attempt in range(max_restarts + 1):
        gen = generation(store, JOB_ID, -1 - node_rank)  # each node's launcher counts its own incarnations
        # with the supervisor's own connection (``_Supervisor.client``), opened at once
        channel = Channel(store, Channel.make_prefix(JOB_ID, gen), -1, world, spares=1)
        procs: dict[int, multiprocessing.process.BaseProcess] = {}
        environ = dict(os.environ) if start_method == "forkserver" else None  # as of this attempt's start
        own_method = multiprocessing.get_start_method(allow_none=True)
        for local in range(nproc):
            topo = Topology(node_rank * nproc + local, world, local, nproc, nnodes, node_rank)
            spec = WorkerSpec(
                backend, topo, addr, store.port, timeout, options, os.getpid(), attempt, environ, own_method
            )
            procs[local] = mp.Process(
                target=run_worker,
                args=(spec, fn, args, kwargs_dict or {}),
                name=f"tether-rank-{topo.rank}",
                daemon=daemon,
            )
        try:
            _Supervisor(channel, procs, node_rank * nproc, options, node_rank == 0, nnodes).run()
            return
        except JobFailed:
            if attempt == max_restarts:
                raise
            sys.stderr.write(f"tether: starting every worker again (restart {attempt + 1} of {max_restarts})\n")
            sys.stderr.flush()


def _context(start_method: str) -> Any:
    """The ``multiprocessing`` context; a forkserver that imports tether before it forks.

    Python's forkserver means to preload ``__main__`` (its default list), but in CPython
    3.11 the server never gets the main module's path (the launcher sends
    ``init_main_from_path``, the server reads ``main_path``), so each worker would still
    import torch itself. tether adds its preload module (``_forkserver.py``) to the list
    while no server runs; a server already running (the user's, or an earlier ``spawn``'s)
    is used as it is.
    """
    mp: Any = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
        server = getattr(multiprocessing.forkserver, "_forkserver", None)
        preload = list(getattr(server, "_preload_modules", None) or [])
        if _PRELOAD not in preload and getattr(server, "_forkserver_pid", None) is None:
            mp.set_forkserver_preload([*preload, _PRELOAD])
            # Started now, with SIGINT and SIGTERM blocked, which it keeps (its children
            # unblock them as they start: ``_forkserver.py``). A stop sent to the job's
            # whole process group (SLURM's scancel, timeout(1), systemd's stop, a Ctrl-C)
            # reached the server too: dead, it took every worker with it at once
            # (``PR_SET_PDEATHSIG``), so no rank stopped cleanly or saved, and the launcher
            # read each code as 255 ("job failed ... exited with code 255").
            # The resource tracker first: its start unblocks both (CPython's bpo-33613).
            multiprocessing.resource_tracker.ensure_running()
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
            try:
                multiprocessing.forkserver.ensure_running()
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # one that came meanwhile is delivered now
    return mp


_PRELOAD = "tether._forkserver"


def _the_stop(record: FailureRecord) -> bool:
    """Whether ``record`` is the launcher's stop itself, not a rank's failure: a rank's own
    ``Terminated``, or the exit this launcher posted for a rank the SIGTERM ended without a
    record of its own: before tether's handler was in (killed by SIGTERM), or in its clean
    ``finalize()`` once its function had returned (exit code 143; under load, "job failed.
    Root cause: rank 1 failed: SystemExit: process exited with code 143")."""
    ended = {f"process {describe_exit(code)}" for code in (-signal.SIGTERM, 128 + signal.SIGTERM)}
    return record.exc_type == Terminated.__name__ or (record.reporter == -1 and record.message in ended)


class _Supervisor:
    def __init__(
        self,
        channel: Channel,
        procs: dict[int, multiprocessing.process.BaseProcess],
        first_rank: int,
        options: Options,
        prints_report: bool,
        nnodes: int = 1,
    ) -> None:
        self.channel = channel
        self.procs = procs
        self.first_rank = first_rank
        self.kill_after = (options.watchdog.grace or 5.0) + 2.0
        self.prints_report = prints_report
        self.deadline: float | None = None
        self.codes: dict[int, int | None] = {}
        config = options.watchdog
        self.judge = PeerJudge(channel, config.lost_after, time.monotonic, deaths=False)  # sentinels see deaths
        nproc = len(procs)
        self.nodes = NodeWatch(channel, first_rank // nproc, nnodes, nproc, config.lost_after, time.monotonic)
        self.world_size = nnodes * nproc
        self.heartbeat = config.heartbeat
        self.client = channel.client()
        self.store_gone = False
        self.interrupted = False  # the launcher got SIGINT (Ctrl-C)
        self.terminated = False  # the launcher got SIGTERM (a scheduler's stop, a preemption)
        self._sent: set[tuple[int, int]] = set()  # (pid, signal) forwarded (``_send``)
        self.extended = False  # the kill deadline was extended for an emergency checkpoint

    def run(self) -> None:
        saved = self._forward_signals()
        try:
            self._start()
            self._supervise()
        finally:
            for sig, handler in saved.items():
                signal.signal(sig, handler)
        if self.interrupted:
            # Ctrl-C is the user's act, not a rank's failure: one line, then Python's own
            # KeyboardInterrupt (an uncaught one exits with 130)
            sys.stderr.write(f"tether: job interrupted (SIGINT); every rank stopped ({self._codes()})\n")
            sys.stderr.flush()
            raise KeyboardInterrupt
        try:
            if self.terminated:
                self._stopped()
            if any(self.codes.values()):
                self._fail()
        finally:
            self._leave()

    def _start(self) -> None:
        """Start the workers; a stop (Ctrl-C, SIGTERM) meanwhile starts no more of them.

        The first start waits for the forkserver, which imports torch (1-2 s): a Ctrl-C to
        the terminal's process group there reached the server too, which died of it with
        a traceback of its import, and this start raised ``EOFError("unexpected EOF")``
        with another (SIGTERM to the group: the same ``EOFError``). The server now takes
        no stop (``_forkserver.py``), and a start that one broke all the same (a server
        not tether's) ends the starting. Workers started after the stop came get it now.
        """
        for proc in self.procs.values():
            if self.interrupted or self.terminated:
                break
            try:
                proc.start()
            except (EOFError, OSError):
                if not (self.interrupted or self.terminated):
                    raise
                break  # the server was stopped with this launcher
        for signum, stopped in ((signal.SIGINT, self.interrupted), (signal.SIGTERM, self.terminated)):
            if stopped:
                self._send(signum)

    def _send(self, signum: int) -> None:
        """Send ``signum`` to every started worker still running that has not had it yet."""
        for proc in self.procs.values():
            if proc.pid is not None and proc.exitcode is None and (proc.pid, signum) not in self._sent:
                self._sent.add((proc.pid, signum))
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signum)

    def _codes(self) -> str:
        """How each rank ended: ``rank 0: exited with code 3, rank 1: killed by SIGKILL``."""
        return ", ".join(
            f"rank {self.first_rank + k}: {describe_exit(self.codes[k]) if k in self.codes else 'not started'}"
            for k in sorted(self.procs)
        )

    def _stopped(self) -> None:
        """The launcher was told to stop (SIGTERM: a scheduler's cancel or preemption), and
        every rank has: one line, the emergency checkpoint's if a survivor wrote one, and
        ``SystemExit(143)``, as Python's default for SIGTERM ends a process, not a
        ``JobFailed``: the job is not started again (``max_restarts``), as torchrun's agent
        is not. A rank's own failure that came first still gets its report; ranks that all
        finished (a handler of the user's took the SIGTERM as "stop after this step") end
        the job as it would have ended."""
        if len(self.codes) == len(self.procs) and not any(self.codes.values()):
            sys.stderr.write("tether: job stopped (SIGTERM); every rank finished\n")
            return
        records: list[FailureRecord] = []
        with contextlib.suppress(Exception):
            records = [] if self.store_gone else self.channel.records()
        if records and not _the_stop(records[0]):
            with contextlib.suppress(JobFailed):
                self._fail()
        else:
            lines = [f"tether: job stopped (SIGTERM); every rank stopped ({self._codes()})", *self._emergency_note()]
            sys.stderr.write("\n".join(lines) + "\n")
            sys.stderr.flush()
        raise Terminated(128 + signal.SIGTERM)

    def _leave(self) -> None:
        """The end of a multi-node job's launcher: each other node's says it is done with
        the store; node 0's, which hosts it, keeps it until every other node's launcher is
        done, or lost (posted, or no heartbeat for ``lost_after``: killed, its host gone), for at
        most ``kill_after`` + ``lost_after`` + 1 s (the longest another node's ranks may take
        to end after this node's: a staller's grace, then its launcher's kill).

        Before, node 0's launcher left as soon as its own ranks had: a rank of another node
        still ending (a staller, in its grace) lost the store under it (C++ warnings with
        stacks), and that node's launcher said "the job's store is unreachable".
        """
        nodes = self.nodes
        if nodes.nnodes <= 1 or self.store_gone:
            return
        done = self.channel.key("launchers", "done")
        with contextlib.suppress(Exception):  # node 0's launcher may be gone (killed)
            if nodes.node != 0:
                self.client.append(done, f"{nodes.node},")  # type: ignore[attr-defined]
                return
            start = next_look = time.monotonic()
            lost = {r.rank // nodes.nproc_per_node for r in self.channel.records() if r.exc_type == "NodeLost"}
            others = set(range(1, nodes.nnodes)) - lost  # a node found lost will not say it is done
            while others and time.monotonic() - start < self.kill_after + nodes.lost_after + 1.0:
                if self.client.check([done]):
                    others -= {int(n) for n in self.client.get(done).decode().split(",") if n}
                now = time.monotonic()
                if others and now >= next_look:  # a heartbeat apart: one read a node, and this node's beat
                    next_look = now + self.heartbeat
                    nodes.beat(self.client)  # the others must not find it silent
                    for node in list(others):
                        silent = nodes.silent_for(node, self.client)
                        if silent is not None and silent > nodes.lost_after:
                            others.discard(node)  # silent: it will not say it is done
                time.sleep(0.02)

    def _forward_signals(self) -> dict[signal.Signals, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}

        def forward(signum: int) -> None:
            self.interrupted = self.interrupted or signum == signal.SIGINT
            self.terminated = self.terminated or signum == signal.SIGTERM
            self._sent.clear()  # a second Ctrl-C goes to every rank too
            self._send(signum)
            self._arm()

        handler = LaunchersHandler(forward)
        return {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}

    def _arm(self) -> None:
        if self.deadline is None:
            self.deadline = time.monotonic() + self.kill_after

    def _supervise(self) -> None:
        alive: dict[Any, int] = {p.sentinel: local for local, p in self.procs.items() if p.pid is not None}
        self.judge.pids.update({self.first_rank + local: p.pid for local, p in self.procs.items() if p.pid})
        next_beat = time.monotonic()
        while alive:
            wait = _PERIOD if self.deadline is None else max(0.0, min(_PERIOD, self.deadline - time.monotonic()))
            ready = multiprocessing.connection.wait(list(alive), wait)
            if not ready:
                next_beat = self._judge(next_beat)
            for sentinel in ready:
                local = alive.pop(sentinel)
                proc = self.procs[local]
                proc.join()
                self.codes[local] = proc.exitcode
                if proc.exitcode:
                    self._arm()
                    self._post_death(self.first_rank + local, proc.exitcode)
            if self.deadline is not None and time.monotonic() >= self.deadline and not self._saving():
                for local in alive.values():
                    self.procs[local].kill()

    def _emergency_note(self) -> list[str]:
        """The report's line on the emergency checkpoint, if a survivor tried one."""
        state = None
        if not self.store_gone:
            with contextlib.suppress(Exception):
                state = self.channel.emergency(self.client)
        if state is None:
            return []
        what = state[0]
        if what.startswith("saved: "):
            return [f"Emergency checkpoint: {what.removeprefix('saved: ')}"]
        return [f"Emergency checkpoint: none ({what})"]

    def _saving(self) -> bool:
        """A survivor writes an emergency checkpoint (``tether.checkpoint``): wait out its budget, once."""
        if self.store_gone or self.extended:
            return False
        with contextlib.suppress(Exception):
            state = self.channel.emergency(self.client)
            if state is not None and state[0] == "saving":
                self.extended = True
                self.deadline = time.monotonic() + state[1]
                return True
        return False

    def _judge(self, next_beat: float) -> float:
        """Children stopped for ``lost_after`` are posted lost (and killed); nodes beat and are judged."""
        if self.store_gone:
            return next_beat
        try:
            found = self.judge.check(self.client)
            now = time.monotonic()
            if now >= next_beat:
                found += self.nodes.check(self.client)
                next_beat = now + self.heartbeat
            for record in found:
                self.channel.post(record)
                self._arm()
        except Exception as exc:  # another node's launcher may host the store, and be gone: say it once
            sys.stderr.write(f"tether: the launcher lost the job's store: {str(exc).splitlines()[0]}\n")
            self.store_gone = True
        return next_beat

    def _post_death(self, rank: int, code: int) -> None:
        """Post a record for a child that died without one (killed, or exited non-zero)."""
        if self.store_gone:
            return
        try:
            records = self.channel.records()
            consequence = code in _CONSEQUENCES and records  # it stopped because of a posted failure
            if consequence or any(r.rank == rank for r in records) or not self.channel.claim_loss(rank):
                return
            how = describe_exit(code)
            self.channel.post(
                FailureRecord(
                    rank=rank,
                    kind=KIND_SIGNAL if code < 0 else KIND_EXIT,
                    exc_type=signal.Signals(-code).name if code < 0 else "SystemExit",
                    message=f"process {how}",
                    pid=self.procs[rank - self.first_rank].pid or 0,
                    host=socket.gethostname(),  # the launcher's children run on its own host
                    time=time.time(),
                    reporter=-1,
                )
            )
        except Exception as exc:  # the store's host (another node) may be gone already
            sys.stderr.write(f"tether: could not post the death of rank {rank}: {str(exc).splitlines()[0]}\n")
            self.store_gone = True

    def _fail(self) -> None:
        records: list[FailureRecord] = []
        if not self.store_gone:
            with contextlib.suppress(Exception):  # another node's launcher may host the store, and be gone
                records = self.channel.records()
        if records:
            records[0] = self._placed(records[0])
        everywhere = raised_everywhere(records, self.world_size)
        outcomes = {
            self.first_rank + local: RankOutcome(
                self.first_rank + local, code, _line(code, records, self.first_rank + local, everywhere)
            )
            for local, code in self.codes.items()
        }
        report = render_report(records, outcomes, self.world_size, self._emergency_note()) if records else ""
        if self.prints_report:
            sys.stderr.write(report or f"tether: job failed; worker exit codes {self.codes}\n")
        elif not records:  # the store is unreadable: node 0's launcher, its host, may be gone
            sys.stderr.write(f"tether: job failed and the job's store is unreachable; worker exit codes {self.codes}\n")
        else:
            sys.stderr.write("tether: job failed; node 0's launcher prints the root-cause report\n")
        sys.stderr.flush()
        cause = cause_line(records, self.world_size) if records else None
        error = JobFailed(records[0] if records else None, self.codes, report, cause)
        end_quietly_if_uncaught(error)
        raise error

    def _placed(self, record: FailureRecord) -> FailureRecord:
        """``record`` with the host and pid of its rank filled in where its reporter did not
        know them (a timeout posted by a rank that waited): a child's from this launcher,
        another node's rank's as it registered."""
        local = record.rank - self.first_rank
        if record.host or record.rank < 0:
            return record
        if 0 <= local < len(self.procs):
            return dataclasses.replace(record, host=socket.gethostname(), pid=record.pid or self.procs[local].pid or 0)
        with contextlib.suppress(Exception):  # another node's launcher may host the store, and be gone
            found = self.channel.placed(record.rank)
            if found is not None:
                return dataclasses.replace(record, host=found[0], pid=found[1])
        return record


def _line(code: int | None, records: list[FailureRecord], rank: int, everywhere: bool = False) -> str:
    if code == 0:
        return "finished"
    if everywhere:
        return f"raised it ({describe_exit(code)})"
    if records and records[0].rank == rank:
        return f"ROOT CAUSE: {records[0].error} ({describe_exit(code)})"
    names = {int(c): c.name for c in ExitCode}
    if code is not None and code in names:
        return f"stopped: {names[code]} ({describe_exit(code)})"
    return describe_exit(code)
