"""One root cause, any exception, exit codes (issue 7, parts 5-7), under ``tether.spawn``.

    lifecycle_root.py simultaneous ITERS
        ITERS jobs of 4 ranks, one after the other: after a barrier, rank 0 broadcasts an
        instant 0.3 s ahead; ranks 1 and 2 spin until it and raise
        RuntimeError("boom from rank R") within the same millisecond, while ranks 0 and 3
        wait in all_reduce. After each job this process writes ``END OF JOB i`` to stderr.
    lifecycle_root.py exit CODE
        2 ranks, barrier and all_reduce, then CODE 0: both ranks call sys.exit(0);
        CODE n: rank 1 calls sys.exit(n), rank 0 waits in the next barrier.
    torchrun ... lifecycle_root.py torchrun-exit CODE
        The same under torchrun, the function run by ``tether.Parallel``.
    lifecycle_root.py weird {badstr,badrepr,huge,orphan,backend}
        2 ranks; after a barrier rank 1 raises an exception whose ``__str__`` raises, whose
        ``__repr__`` raises, or whose message is 1 MiB long; rank 0 waits in the next barrier.
        ``orphan``: rank 1 first takes a seq on the failure counter and writes no record,
        as a poster killed between its two store operations leaves it (``channel.py``'s
        rules: readers wait ``ROOT_WAIT`` for slot 1, then take the first readable record),
        then raises ValueError. ``backend``: rank 1 raises ``tether.BackendError``, a tether
        error that no posted failure explains (what tether raises for a backend error
        nobody's failure is behind).
    lifecycle_root.py group-timeout
        2 ranks, no ``sync_timeout``; both make a group with ``timeout=4 s``. After a barrier
        rank 1 sleeps in user code while rank 0 waits in a raw ``dist.all_reduce`` on that
        group, until the group's own (gloo's) timeout expires. (A job-wide ``timeout=4 s``
        bounds the job's own ``init_process_group`` too: under a loaded fresh-clone run rank
        1's rendezvous timed out there first, waiting for rank 0's address.)

Ranks print ``LC`` lines (``raised``, ``done``, ``struck``); the launcher prints
``LC {"event": "launcher", ...}`` per job (exc None: spawn returned) and exits 1 if any
job failed.
"""

from __future__ import annotations

import datetime
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from lifecycle_common import emit, launcher_failed, raised

import tether
from tether._core.context import peek

GROUP_TIMEOUT = 4.0
HUGE = "huge message (hug3): " + "x" * (1 << 20)


class BadStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ of BadStr raised")


class BadRepr(Exception):
    def __repr__(self) -> str:
        raise RuntimeError("__repr__ of BadRepr raised")


def simultaneous(local_rank: int, job: int) -> None:
    rank = tether.get_rank()
    try:
        tether.barrier()
        t0 = tether.broadcast(time.time() + 0.3 if rank == 0 else 0.0, src=0)
        if rank in (1, 2):
            while time.time() < t0:
                pass
            raise RuntimeError(f"boom from rank {rank}")
        tether.all_reduce(1)
    except BaseException as exc:
        if rank not in (1, 2):  # the failing ranks report nothing: they fail as close together as they can
            raised(rank, exc, job=job)
        raise
    emit("done", rank=rank, job=job)


def exits(local_rank: int, code: int) -> None:
    rank = tether.get_rank()
    try:
        tether.barrier()
        total = tether.all_reduce(rank + 1)
    except BaseException as exc:
        raised(rank, exc)
        raise
    emit("done", rank=rank, total=total)
    if code == 0 or rank == 1:
        sys.exit(code)
    try:
        tether.barrier()
    except BaseException as exc:
        raised(rank, exc)
        raise
    emit("passed", rank=rank)


def weird(local_rank: int, kind: str) -> None:
    rank = tether.get_rank()
    try:
        tether.barrier()
        if rank == 1:
            emit("struck", rank=rank, time=time.time())
            if kind == "badstr":
                raise BadStr("weird str (s7r)")
            if kind == "badrepr":
                raise BadRepr("weird repr (r3pr)")
            if kind == "orphan":
                ctx = peek()
                channel = ctx.channel if ctx is not None else None
                assert channel is not None
                channel.connection.add(channel.key("fail", "n"), 1)  # seq 1, its slot never written
                raise ValueError("after an orphaned seq (0rph)")
            if kind == "backend":
                raise tether.BackendError("the backend failed and nobody's failure explains it (b4ck)")
            raise ValueError(HUGE)
        tether.barrier()
    except BaseException as exc:
        if rank != 1:
            raised(rank, exc)
        raise
    emit("passed", rank=rank)


def group_timeout(local_rank: int) -> None:
    rank = tether.get_rank()
    try:
        group = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=GROUP_TIMEOUT))
        tether.barrier()
        if rank == 1:
            emit("struck", rank=rank, time=time.time())
            time.sleep(60)  # alive, in user code: the verdict ends it
        dist.all_reduce(torch.ones(1), group=group)
    except BaseException as exc:
        raised(rank, exc)
        raise
    emit("passed", rank=rank)


def launch(fn: Callable[..., None], args: tuple[object, ...], nproc: int, job: int = 0) -> bool:
    try:
        tether.spawn("gloo", fn, args, nproc_per_node=nproc)
    except BaseException as exc:
        launcher_failed(exc, job=job)
        return False
    emit("launcher", exc=None, job=job)
    return True


def main() -> None:
    scenario = sys.argv[1]
    if scenario == "simultaneous":
        ok = True
        for job in range(int(sys.argv[2])):
            ok = launch(simultaneous, (job,), 4, job) and ok
            sys.stderr.write(f"END OF JOB {job}\n")
            sys.stderr.flush()
    elif scenario == "exit":
        ok = launch(exits, (int(sys.argv[2]),), 2)
    elif scenario == "torchrun-exit":
        with tether.Parallel(backend="gloo") as parallel:
            parallel.run(exits, int(sys.argv[2]))
        ok = True
    elif scenario == "group-timeout":
        ok = launch(group_timeout, (), 2)
    else:
        ok = launch(weird, (sys.argv[2],), 2)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
