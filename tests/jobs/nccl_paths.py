"""NCCL's wait and abort paths, run without a GPU (issue 9): real gloo jobs, fake NCCL pieces.

    python nccl_paths.py HOW

Every HOW runs 2 ranks under ``tether.spawn`` (gloo, loopback), except ``keeps_world``
(one process, a real gloo group). What is fake is only what the issue names: a work
object that behaves as NCCL's does, and an abort that hangs.

* ``waits_finish``: both ranks wait on a work whose future is done at once while
  ``is_completed()`` stays false for 0.4 s; ``wait(timeout)`` would abort NCCL's
  communicator, so the fake raises if it is called. The wait must last until completion.
* ``waits_peer_fails``: the work never completes; rank 1 raises 0.3 s in. Rank 0 must
  raise ``PeerFailure`` naming rank 1.
* ``waits_timeout``: the work never completes; rank 0 waits with ``timeout=1``. Both ranks
  raise ``SyncTimeout``.
* ``issue_blocks``: rank 0's ``tether.all_reduce`` blocks in the *issue*, as a NCCL
  communicator's first collective does while it connects the ranks (seen on a GPU), until
  the ladder aborts the communicator; the issue then raises NCCL's ``DistBackendError``
  ("internal error"). Rank 1 raises 0.3 s in. Rank 0 must raise ``PeerFailure`` naming
  rank 1, chained to the backend's error, not that error.
* ``finalize_abort_hangs``: rank 1 raises; rank 0 catches ``PeerFailure`` and calls
  ``finalize()`` with an abort that never returns: finalize must return within the abort's
  budget.
* ``ladder_abort_hangs``: rank 1 raises while rank 0 sleeps outside tether; the ladder's
  abort holds the GIL forever. The GIL-free exit rung must still end rank 0 (SIGALRM).
* ``keeps_world``: tether's NCCL abort path, run on a gloo group, leaves torch's registry of
  groups in place (torch's ``_abort_process_group`` clears it).
"""

import ctypes
import sys
import threading
import time
from typing import Any

import torch
from lifecycle_common import emit, raised

import tether
from tether._core.group import Group
from tether._core.runtime import current
from tether._core.waits import run_work

HOW = sys.argv[1]
COMPLETES_AFTER = 0.4


class FakeNcclWork:
    """A work as ProcessGroupNCCL returns it: its future completes when the kernel is enqueued."""

    def __init__(self, completes_after: float | None) -> None:
        self._done_at = None if completes_after is None else time.monotonic() + completes_after
        self.polls = 0
        self._future: torch.futures.Future[Any] = torch.futures.Future()
        self._future.set_result([])  # "completed" at enqueue

    def get_future(self) -> torch.futures.Future[Any]:
        return self._future

    def is_completed(self) -> bool:
        self.polls += 1
        return self._done_at is not None and time.monotonic() >= self._done_at

    def wait(self, timeout: Any = None) -> bool:
        if timeout is not None:
            raise AssertionError("a timed wait on NCCL busy-waits and aborts the communicator on expiry")
        if not self.is_completed():
            raise AssertionError("work.wait() before the GPU finished: it would block the CPU outside tether")
        return True


def waits(local_rank: int) -> None:
    rank = tether.get_rank()
    ctx = current()
    world = Group("w", (0, 1), None)
    tether.barrier()
    if rank == 1 and HOW == "waits_peer_fails":
        time.sleep(0.3)
        raise RuntimeError("rank 1 broke while rank 0 waited on the GPU")
    if rank == 1 and HOW == "waits_timeout":
        time.sleep(1.5)  # outside tether: rank 0's wait expires at 1 s; then rank 1 learns of it
        try:
            tether.barrier()
        except BaseException as exc:
            raised(rank, exc)
            raise
        return
    start = time.monotonic()  # before the work's clock starts: elapsed >= COMPLETES_AFTER exactly
    work = FakeNcclWork(COMPLETES_AFTER if HOW == "waits_finish" else None)
    try:
        timeout = 1.0 if HOW == "waits_timeout" else None
        run_work(ctx, lambda: work, world, "all_reduce(SUM, float32[4])", timeout, polled=True)
    except BaseException as exc:
        emit("waited", rank=rank, elapsed=time.monotonic() - start, polls=work.polls)
        raised(rank, exc)
        raise
    emit("waited", rank=rank, elapsed=time.monotonic() - start, polls=work.polls)
    tether.barrier()


def issue_blocks(local_rank: int) -> None:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    watchdog = _rank_1_breaks("rank 1 broke while rank 0 issued its all_reduce")
    rank = tether.get_rank()
    aborted = threading.Event()
    watchdog._abort = aborted.set  # the communicator's abort: what ends NCCL's blocking issue

    def connecting(*args: Any, **kwargs: Any) -> Any:  # NCCL connecting its ranks at the first collective
        aborted.wait(30.0)
        raise dist.DistBackendError(
            "NCCL error in: ProcessGroupNCCL.cpp:3780, internal error - please report this issue"
        )

    c10d.all_reduce = connecting
    start = time.monotonic()
    try:
        tether.all_reduce(torch.ones(4))
    except BaseException as exc:
        emit("waited", rank=rank, elapsed=time.monotonic() - start, cause=type(exc.__cause__).__name__)
        raised(rank, exc)
        raise


def finalize_abort_hangs(local_rank: int) -> None:
    rank = tether.get_rank()
    tether.barrier()
    if rank == 1:
        raise RuntimeError("rank 1 broke")
    try:
        tether.barrier()
    except tether.PeerFailure as exc:
        raised(rank, exc)
        current().backend.abort = lambda: threading.Event().wait()  # type: ignore[method-assign]
        start = time.monotonic()
        tether.finalize()
        emit("finalized", rank=rank, elapsed=time.monotonic() - start)


def _rank_1_breaks(message: str) -> Any:
    """After a barrier, rank 1 raises ``message`` 0.3 s later; rank 0 gets its watchdog."""
    tether.barrier()
    if tether.get_rank() == 1:
        time.sleep(0.3)
        raise RuntimeError(message)
    watchdog = current().watchdog
    assert watchdog is not None
    return watchdog


def ladder_abort_hangs(local_rank: int) -> None:
    watchdog = _rank_1_breaks("rank 1 broke")
    rank = tether.get_rank()
    watchdog._abort = lambda: ctypes.PyDLL(None).sleep(60)  # a C call that keeps the GIL
    emit("sleeping", rank=rank, time=time.time())
    time.sleep(60)  # outside tether: only the ladder can end this rank


def keeps_world() -> None:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    from tether._env import Topology
    from tether.backends import NativeBackend

    store = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    NativeBackend(Topology(), "nccl", owns_group=False).abort()  # the path the ladder takes on NCCL
    emit("world", initialized=dist.is_initialized(), groups=len(c10d._world.pg_map), world_size=dist.get_world_size())


if __name__ == "__main__":
    if HOW == "keeps_world":
        keeps_world()
        sys.exit(0)
    jobs = {
        "issue_blocks": issue_blocks,
        "finalize_abort_hangs": finalize_abort_hangs,
        "ladder_abort_hangs": ladder_abort_hangs,
    }
    fn = jobs.get(HOW, waits)
    try:
        tether.spawn("gloo", fn, (), nproc_per_node=2, grace=2.0)
    except tether.JobFailed as exc:
        emit("launcher", exit_codes={str(k): v for k, v in exc.exit_codes.items()})
        raise
