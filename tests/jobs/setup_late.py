"""A rank that reaches ``initialize`` late, under a short ``sync_timeout`` (torchrun, 2 ranks).

    torchrun --nproc_per_node 2 setup_late.py

Rank 1 starts ``LATE`` seconds after rank 0 (its imports were slow), with
``sync_timeout=TIMEOUT`` shorter than that: the start-up is not a sync, and both ranks
must come up. Then rank 1 stalls in user code while rank 0 waits for it in a raw
``dist.all_reduce``: that wait is bounded by ``sync_timeout`` (plus tether's margin), as
every wait is once the group exists. Before, the group was created with the
``sync_timeout`` bound, and rank 0 raised ``SyncTimeout`` inside ``init_process_group``.
"""

import time

from lifecycle_common import emit, safe_str

LATE = 3.0
TIMEOUT = 1.0


def main() -> None:
    import os

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


if __name__ == "__main__":
    main()
