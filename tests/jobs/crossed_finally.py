"""A rank that raises runs a raw collective in its ``finally``; the others wait in tether's.

    python -m torch.distributed.run --nproc-per-node 3 crossed_finally.py

3 ranks all-reduce a number each step. At step 10 rank 1 raises inside ``try``; its
``finally:`` calls ``dist.barrier()`` (before ``destroy_process_group``, a common
clean-up), while ranks 0 and 2 wait for it in all_reduce #11. Nothing is posted (the
exception has not reached the top) and each side waits for the other: before, the job
waited until it was killed. Each rank reports what it raised: first in its loop, then out
of the ``finally``'s barrier.
"""

from __future__ import annotations

import torch.distributed as dist
from lifecycle_common import raised

import tether

tether.initialize("gloo")
rank = tether.get_rank()
try:
    try:
        for step in range(50):
            if rank == 1 and step == 10:
                raise ValueError("injected failure 0.1 on rank 1")
            tether.all_reduce(1.0)
    except BaseException as exc:
        raised(rank, exc, where="loop")
        raise
    finally:
        dist.barrier()
except BaseException as exc:
    raised(rank, exc, where="finally")
    raise
