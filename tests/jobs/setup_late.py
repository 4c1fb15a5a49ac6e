"""A rank that reaches ``initialize`` late, under a short ``sync_timeout`` (torchrun, 2 ranks).

    torchrun --nproc_per_node 2 setup_late.py

Rank 1 starts ``LATE`` seconds after rank 0 (its imports were slow), with
``sync_timeout=TIMEOUT`` shorter than that: the start-up is not a sync, and both ranks
must come up. Then rank 1 stalls in user code while rank 0 waits for it in a raw
``dist.all_reduce``: that wait is bounded by ``sync_timeout`` (plus tether's margin), as
every wait is once the group exists. Before, the group was created with the
``sync_timeout`` bound, and rank 0 raised ``SyncTimeout`` inside ``init_process_group``.

    torchrun --nproc_per_node 2 setup_late.py timeout

The job's own ``timeout=INIT_TIMEOUT`` bounds the start-up, as it bounds torch's
``init_process_group``: rank 1 is still in its imports (asleep, ``NEVER`` seconds) when
rank 0's rendezvous gives up waiting for it. Rank 0 raises a ``SyncTimeout`` naming rank
1; then torchrun ends rank 1. Rank 0 first times one new connection to the job's store
(``connect_s`` in its ``raised`` line): the test's bound counts the start's connections
in it.
"""

import time

from lifecycle_common import emit, safe_str

LATE = 3.0
TIMEOUT = 1.0
INIT_TIMEOUT = 3.0
NEVER = 60.0


def main() -> None:
    import os
    import sys

    if sys.argv[1:] == ["timeout"]:
        never_comes()
        return

    import torch
    import torch.distributed as dist

    import tether

    rank = int(os.environ["RANK"])
    if rank == 1:
        time.sleep(LATE)
    began = time.time()
    tether.initialize("gloo", sync_timeout=TIMEOUT)
    emit("initialized", rank=rank, took=time.time() - began)
    total = tether.all_reduce(rank + 1)
    emit("summed", rank=rank, total=total)
    try:
        if rank == 1:
            emit("stall", rank=rank, time=time.time())
            time.sleep(60)
        dist.all_reduce(torch.ones(1))
    except BaseException as exc:
        emit("raised", rank=rank, exc=type(exc).__name__, msg=safe_str(exc)[:400], time=time.time())
        raise


def never_comes() -> None:
    import datetime
    import os

    import torch.distributed as dist

    import tether

    rank = int(os.environ["RANK"])
    if rank == 1:
        time.sleep(NEVER)
    # how long one new connection to the job's store takes here: a start opens several
    # before its rendezvous's clock starts, and a slow resolver makes each slow
    # (tests/slow_resolver.py: 1 s each under --answer-after 0.5)
    t0 = time.time()
    dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False)
    connect_s = time.time() - t0
    began = time.time()
    try:
        tether.initialize("gloo", timeout=datetime.timedelta(seconds=INIT_TIMEOUT))
    except BaseException as exc:
        emit(
            "raised",
            rank=rank,
            exc=type(exc).__name__,
            msg=safe_str(exc)[:400],
            took=time.time() - began,
            connect_s=connect_s,
        )
        raise
    emit("initialized", rank=rank)


if __name__ == "__main__":
    main()
