"""The one module that injects faults into a rank, at a named place, for the fault matrix.

Used by ``tests/jobs/fault_job.py`` inside every rank. A case (one row of
``tests/fault_matrix.py``) names a *failure* and a *place*; ``run_case`` plays the case on
this rank and ``inject`` does the damage.

Failures (``FAILURES``)::

    raise      raise ValueError("injected fault on rank R")          F1, F2
    exit       os._exit(3)                                           F3
    sigkill    SIGKILL to itself                                     F3
    segfault   ctypes.string_at(0)                                   F3
    sigstop    SIGSTOP to itself (a frozen process)                  F4
    stall      sleep far past every timeout (never arrives)          F5
    mismatch   barrier() where the others call all_reduce(), or
               one_rank_first(rank=1) where the others say rank=0   F6
    kill_host  SIGKILL to the store's host: itself when it is rank 0
               under ``initialize-rank0`` (torchrun with its agent store
               off), else the ``tether.spawn`` launcher             F7
    sigterm    SIGTERM to itself                                     F8
    sigint     SIGINT to itself                                      F8
    term_launcher  SIGTERM to the ``tether.spawn`` launcher          F8

Places (``PLACES``), where the victim is when the fault strikes and where the others wait::

    first       inside ``one_rank_first(rank=victim)``'s block on the working rank;
                the others wait in the gate
    waiting     the victim waits in ``one_rank_first(rank=W)``, W != victim, and the fault
                comes from a thread of the victim; W's block holds the gate until the
                fault has struck
    collective  the victim's main thread is inside ``all_reduce``, the fault comes from a
                thread; one "late" rank joins the all_reduce only after the fault
    outside     the victim is in user code (no tether call); the others wait in ``all_reduce``
    backward    every rank trains a DDP model from ``auto_model``; the victim strikes before
                its backward, the others wait in ``loss.backward()`` (DDP's gradient
                all-reduce, through tether's communication hook; a stall row's timeout
                is the job's ``sync_timeout``)
    ddp_hand    as ``backward``, with a DDP the job built itself, without tether's hook:
                the others wait in the reducer's own all-reduce, in C++
    chain       a wait behind a wait: the victim is in user code; its partner (rank 0, or
                1 when the victim is 0) waits for it in a raw ``dist.all_reduce`` on a
                group of the two (``dist.new_group``); the others wait in a sync for both
                (stall rows: ``barrier``; the timeout is the job's ``sync_timeout``, which
                bounds the raw call too). The root cause is the victim, never the partner
    p2p         as ``chain``, but the partner waits in a raw ``dist.recv`` from the victim
                (gloo's point-to-point waits ignore the group's timeout: tether's
                ``recv`` bounds its own)
    rooted      as ``chain``, but the partner waits in a raw ``dist.reduce`` to itself
                (``dst=partner``): a collective's root is not its only peer, the victim
                is the one that did not arrive
    async       as ``chain``, but the partner waits in ``wait()`` on the work of an async
                ``dist.all_reduce`` (``async_op=True``), as ``ZeroRedundancyOptimizer.step``
                waits on its broadcasts' works
    irecv       as ``chain``, but the partner waits in ``wait()`` on an ``irecv`` from the
                victim made by ``dist.batch_isend_irecv``, as a pipeline stage waits for
                its neighbour's activations (gloo's point-to-point works ignore the
                group's timeout: tether bounds a ``wait()`` given none)
    made        the victim is in user code; the others make a group of every rank with a
                raw ``dist.new_group``, where gloo waits in C++ on the store for the
                victim's address (tether's gate before it: ``_core/making.py``; a stall
                row's timeout is the job's ``sync_timeout``)
    mesh        as ``made``, where torch makes the groups: the others build a 2-D
                ``DeviceMesh`` (2 x world/2), whose rows and columns torch makes with the
                ``new_group`` it imported by name
    dtensor     every rank holds a DTensor sharded on a 1-D mesh; the victim is in user
                code, the others gather it (``full_tensor()``) and wait in torch's
                functional collectives' ``wait_tensor``, in C++ (imported after tether
                started: ``_core/funcol.py`` wraps it as it is imported)
    store       the victim is in user code; the others wait in ``store.get`` on torch's
                default store for a key the victim never sets (``_core/storewaits.py``;
                a stall row's timeout is the job's ``sync_timeout``)

Events are ordered with keys on the job's store (``Sequencer``), not with sleeps: a rank
marks ``in/<rank>`` just before it enters its wait, and the victim strikes once every
rank it must strike after has marked. The only sleep is a short settle after the marks
(``SETTLE``), so that the waits have really begun; correctness never depends on it (a
failure posted before a rank blocks is raised at the start of its wait).
"""

from __future__ import annotations

import ctypes
import datetime
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import tether as idist

FAILURES = (
    "raise",
    "exit",
    "sigkill",
    "segfault",
    "sigstop",
    "stall",
    "mismatch",
    "kill_host",
    "sigterm",
    "sigint",
    "term_launcher",
)
PLACES = (
    "first",
    "waiting",
    "collective",
    "outside",
    "backward",
    "ddp_hand",
    "chain",
    "p2p",
    "rooted",
    "async",
    "made",
    "mesh",
    "dtensor",
    "store",
    "irecv",
)
SETTLE = 0.2  # seconds after the marks before a thread strikes (see the module docstring)
START_LINE = 120.0  # seconds the first barrier waits for the last rank to start
RESULT = "RESULT "  # prefix of the one machine-readable line a rank prints when it catches


@dataclass(frozen=True)
class Case:
    """What one job run does; travels as JSON on the command line."""

    failure: str
    place: str
    victim: int
    launcher: str
    timeout: float | None = None  # the waits' timeout= (stall rows)
    heartbeat: float = 0.5
    lost_after: float = 2.0
    grace: float = 3.0
    mismatch: str = "barrier"  # "barrier" (vs all_reduce) or "first" (one_rank_first targets)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Case:
        return cls(**json.loads(text))

    @property
    def options(self) -> dict[str, float]:
        options = {"heartbeat": self.heartbeat, "lost_after": self.lost_after, "grace": self.grace}
        # the places whose waits take no timeout= of their own: the job's sync_timeout bounds them
        raw = ("backward", "ddp_hand", "chain", "p2p", "rooted", "async", "made", "mesh", "dtensor", "irecv", "store")
        if self.place in raw and self.timeout is not None:
            options["sync_timeout"] = self.timeout
        return options


class Sequencer:
    """Orders events across ranks with keys on the job's store (its own connection)."""

    def __init__(self) -> None:
        from tether._core.runtime import current  # the test reaches into tether's store on purpose

        store = current().store
        assert store is not None, "the fault job needs tether's store"
        self._store = store.clone()
        self._store.set_timeout(datetime.timedelta(minutes=5))
        self._prefix = "faulttest/"

    def mark(self, name: str) -> None:
        self._store.set(self._prefix + name, "1")

    def wait(self, names: Iterable[str]) -> None:
        keys = [self._prefix + n for n in names]
        if keys:
            self._store.wait(keys)

    def wait_for_failure(self, within: float = 60.0) -> None:
        """Return once tether has posted a failure (its channel's counter), or after ``within`` s.

        Main thread only: it reads on the channel's own connection.
        """
        from tether._core.runtime import current

        channel = current().channel
        assert channel is not None, "the fault job needs tether's failure channel"
        deadline = time.monotonic() + within
        while channel.failure_count() == 0 and time.monotonic() < deadline:
            time.sleep(0.01)


def result(rank: int, exc: BaseException) -> None:
    """Print this rank's RESULT line for the exception it caught (a job's SIGTERM waits for it)."""
    from lifecycle_common import stops_held  # tests/jobs: on the path of the job that calls this

    with stops_held():
        _result(rank, exc)


def _result(rank: int, exc: BaseException) -> None:
    message = str(exc).splitlines()[0] if str(exc) else ""
    data: dict[str, object] = {"rank": rank, "type": type(exc).__name__, "message": message}
    data["failing"] = getattr(exc, "rank", None)
    data["time"] = time.time()
    if isinstance(exc, idist.SyncTimeout):
        data["missing"] = exc.missing
        data["failing"] = exc.record.rank if exc.record is not None else None
        data["pid"] = exc.record.pid if exc.record is not None else None
    if isinstance(exc, idist.SyncMismatch):
        data["calls"] = {str(k): v for k, v in exc.calls.items()}
        data["failing"] = exc.record.rank if exc.record is not None else None
    if not isinstance(exc, idist.TetherError):
        data["failing"] = rank  # its own exception
    sys.stdout.write(RESULT + json.dumps(data) + "\n")
    sys.stdout.flush()


def inject(case: Case, rank: int) -> None:
    """Do the damage of ``case.failure`` on this process (from any thread)."""
    f = case.failure
    sys.stdout.write(f"STRUCK {json.dumps({'rank': rank, 'time': time.time()})}\n")
    sys.stdout.flush()
    if f == "raise":
        raise ValueError(f"injected fault on rank {rank}")
    if f == "exit":
        os._exit(3)
    if f == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if f == "segfault":
        ctypes.string_at(0)
    if f == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
        return
    if f == "stall":
        time.sleep(3600)
        return
    if f == "kill_host":
        os.kill(os.getpid() if case.launcher == "initialize-rank0" else launcher_pid(), signal.SIGKILL)
        time.sleep(3600)  # the parent's death takes this process with it
    if f == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
        return
    if f == "sigint":
        os.kill(os.getpid(), signal.SIGINT)
        return
    if f == "term_launcher":
        os.kill(launcher_pid(), signal.SIGTERM)
        return
    raise AssertionError(f"unknown failure {f!r}")


def _strike_later(case: Case, rank: int, seq: Sequencer, after: list[int]) -> None:
    """From a thread: strike once the ranks ``after`` have marked that they wait."""

    def strike() -> None:
        seq.wait(f"in/{r}" for r in after)
        time.sleep(SETTLE)
        seq.mark("struck")
        inject(case, rank)

    threading.Thread(target=strike, name="fault-injector", daemon=True).start()


def _value(rank: int, timeout: float | None) -> float:
    return float(idist.all_reduce(rank + 1, timeout=timeout))


def launcher_pid() -> int:
    """The ``tether.spawn`` launcher's pid (a worker's parent is the forkserver by default)."""
    return int(os.environ["FAULT_LAUNCHER_PID"])


def run_case(case: Case) -> None:
    """Play ``case`` on this rank; returns only if no fault stopped it."""
    rank, world = idist.get_rank(), idist.get_world_size()
    seq = Sequencer()
    # The start line: ranks start unevenly (seconds apart under load), and neither a timeout=
    # nor the job's sync_timeout (the raw-wait rows set it) may catch a late starter.
    idist.barrier(timeout=START_LINE)
    others = [r for r in range(world) if r != case.victim]
    me_victim = rank == case.victim
    timeout = case.timeout

    if case.failure == "mismatch":
        seq.mark(f"in/{rank}")
        if case.mismatch == "barrier":
            if me_victim:
                idist.barrier(timeout=timeout)
            else:
                idist.all_reduce(1, timeout=timeout)
        else:
            with idist.one_rank_first(rank=1 if me_victim else 0, timeout=timeout):
                pass
        idist.barrier(timeout=timeout)
        return

    if case.place == "first":
        if not me_victim:
            seq.mark(f"in/{rank}")
        with idist.one_rank_first(rank=case.victim, timeout=timeout):
            if me_victim:
                seq.wait(f"in/{r}" for r in others)
                time.sleep(SETTLE)
                inject(case, rank)
        idist.barrier(timeout=timeout)
        return

    if case.place == "waiting":
        working = 0 if case.victim != 0 else 1
        if me_victim:
            _strike_later(case, rank, seq, [r for r in range(world) if r != working and r != rank])
        if rank != working:
            seq.mark(f"in/{rank}")
        with idist.one_rank_first(rank=working, timeout=timeout):
            if rank == working:
                seq.wait(["struck"])
                # A signal's handler runs on the victim's main thread some time after the
                # strike; a release before it lands would let the victim through the gate
                # and into the next barrier, which the survivors would then pass.
                seq.wait_for_failure()
        idist.barrier(timeout=timeout)
        return

    if case.place == "collective":
        late = world - 1 if case.victim != world - 1 else 0
        if me_victim:
            _strike_later(case, rank, seq, [r for r in range(world) if r != late and r != rank])
        if rank == late:
            seq.wait(["struck"])
        else:
            seq.mark(f"in/{rank}")
        _value(rank, timeout)
        idist.barrier(timeout=timeout)
        return

    if case.place == "outside":
        if me_victim:
            seq.wait(f"in/{r}" for r in others)
            time.sleep(SETTLE)
            inject(case, rank)
        else:
            seq.mark(f"in/{rank}")
        if case.failure == "stall":
            idist.barrier(timeout=timeout)  # F5: the others wait here; the victim never arrives
        else:
            _value(rank, timeout)  # F2: the others wait in a collective
        idist.barrier(timeout=timeout)
        return

    if case.place in ("backward", "ddp_hand"):
        _train(case, rank, seq, others)
        return

    if case.place in ("chain", "p2p", "rooted", "async", "irecv"):
        import torch
        import torch.distributed as dist

        partner = 0 if case.victim != 0 else 1
        pair = dist.new_group(sorted((partner, case.victim)))  # every rank makes it, as torch wants
        if me_victim:
            seq.wait(f"in/{r}" for r in others)
            time.sleep(SETTLE)
            inject(case, rank)
        seq.mark(f"in/{rank}")
        if rank == partner and case.place == "p2p":
            dist.recv(torch.zeros(1), src=case.victim)  # the victim never sends
        elif rank == partner and case.place == "rooted":
            dist.reduce(torch.ones(1), dst=partner, group=pair)  # its own src/dst: the victim is missing
        elif rank == partner and case.place == "async":
            work = dist.all_reduce(torch.ones(1), group=pair, async_op=True)
            assert work is not None
            work.wait()  # the caller's own wait on the work
        elif rank == partner and case.place == "irecv":
            (work,) = dist.batch_isend_irecv([dist.P2POp(dist.irecv, torch.zeros(1), case.victim)])
            work.wait()  # the victim never sends
        elif rank == partner:
            dist.all_reduce(torch.ones(1), group=pair)
        elif case.failure == "stall":
            idist.barrier(timeout=timeout)
        else:
            _value(rank, timeout)
        idist.barrier(timeout=timeout)
        return

    if case.place in ("made", "mesh"):
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        if me_victim:
            seq.wait(f"in/{r}" for r in others)
            time.sleep(SETTLE)
            inject(case, rank)
        seq.mark(f"in/{rank}")
        if case.place == "made":
            dist.new_group(list(range(world)))  # every rank's, the victim's too: gloo waits for its address
        else:
            init_device_mesh("cpu", (2, world // 2))
        idist.barrier(timeout=timeout)
        return

    if case.place == "dtensor":
        import torch
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor

        mesh = init_device_mesh("cpu", (world,))
        shards = distribute_tensor(torch.full((world, 2), 0.1), mesh, [Shard(0)])
        if me_victim:
            seq.wait(f"in/{r}" for r in others)
            time.sleep(SETTLE)
            inject(case, rank)
        seq.mark(f"in/{rank}")
        shards.full_tensor()  # the victim's shard never comes
        idist.barrier(timeout=timeout)
        return

    if case.place == "store":
        import torch.distributed as dist

        if me_victim:
            seq.wait(f"in/{r}" for r in others)
            time.sleep(SETTLE)
            inject(case, rank)
        seq.mark(f"in/{rank}")
        dist.distributed_c10d._get_default_store().get("faulttest/never set")
        idist.barrier(timeout=timeout)
        return

    raise AssertionError(f"unknown place {case.place!r}")


def _train(case: Case, rank: int, seq: Sequencer, others: list[int]) -> None:
    import torch

    torch.manual_seed(0)
    if case.place == "ddp_hand":
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(torch.nn.Linear(8, 1))
    else:
        model = idist.auto_model(torch.nn.Linear(8, 1))
    x = torch.full((4, 8), 0.1)
    for _ in range(2):  # DDP rebuilds its buckets in the second forward: behind us before the strike
        model(x).sum().backward()
    if rank == case.victim:
        seq.wait(f"in/{r}" for r in others)
        time.sleep(SETTLE)
        inject(case, rank)
    else:
        seq.mark(f"in/{rank}")
    model(x).sum().backward()
    idist.barrier()
