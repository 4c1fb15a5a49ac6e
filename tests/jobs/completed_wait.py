"""The wait on a work that already completed returns, also once a peer's failure is known (``tether.spawn``, 2 ranks).

    python completed_wait.py

Both ranks issue an async ``dist.all_reduce`` of 0.1 and poll until its work completed.
Then rank 1 raises; rank 0 waits until tether knows (the job's failure is posted) and
only then calls ``work.wait()``: the data are there, nothing is waited for, and it
returns with the sum (as ``ZeroRedundancyOptimizer.step`` finishes its step on parameters
that arrived). Its next wait that would block, a ``tether.barrier()``, raises
``PeerFailure`` naming rank 1. Before, the ``work.wait()`` itself raised it.
"""

import time

import torch
import torch.distributed as dist
from lifecycle_common import emit, raised

import tether


def fn(local_rank: int) -> None:
    from tether._core.runtime import current  # the test reaches into tether's watchdog on purpose

    rank = tether.get_rank()
    t = torch.full((1,), 0.1, dtype=torch.float64)
    work = dist.all_reduce(t, async_op=True)
    assert work is not None
    while not work.is_completed():
        time.sleep(0.001)
    tether.barrier()  # both works completed
    if rank == 1:
        emit("fault", rank=rank, time=time.time())
        raise ValueError("rank 1 failed after its all-reduce 0.1")
    watchdog = current().watchdog
    assert watchdog is not None
    while watchdog.failure is None:
        time.sleep(0.001)
    began = time.time()
    try:
        done = work.wait()
        emit("waited", rank=rank, done=done, value=t.item())
        tether.barrier()
    except BaseException as exc:
        raised(rank, exc, after=time.time() - began)
        raise


if __name__ == "__main__":
    tether.spawn("gloo", fn, (), nproc_per_node=2)
