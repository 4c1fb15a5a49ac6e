"""Missing members that leave their calls while a timeout's verdict waits for theirs.

    python moved_on.py

3 ranks under ``tether.spawn`` (gloo, loopback). Rank 1 waits in ``barrier(timeout=2)``.
When it expires, ranks 0 and 2 are each in a wait of their own (``store.get`` on torch's
default store, a wait tether knows): both missing, both inside calls, so the verdict holds
for the verdict of theirs (``verdicts.expire``). As that hold begins, rank 1 lets them go on
(the key they wait for), and gives them ``MOVE`` seconds: rank 2 stalls in user code, rank
0 waits for it in a raw ``all_reduce`` of their pair. No other verdict comes (neither wait
has a timeout). The rank that stalled is rank 2; the answers to the question asked before
the hold still put rank 0, as rank 2, in a store wait.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from lifecycle_common import emit, raised

import tether
from tether._core import verdicts

TIMEOUT = 2.0
MOVE = 1.0  # seconds for ranks 0 and 2 to leave their store waits
STALL = 60.0
GO = "moved_on/go"


def main(local_rank: int) -> None:
    rank = tether.get_rank()
    pair = dist.new_group([0, 2])  # every rank makes it, as torch wants
    store = dist.distributed_c10d._get_default_store()
    tether.barrier()
    try:
        if rank == 1:
            original = verdicts._hold_for_other_verdicts

            def let_go_first(*args: Any) -> float:
                store.set(GO, "1")
                emit("let_go", rank=rank, time=time.time())
                time.sleep(MOVE)
                return original(*args)

            verdicts._hold_for_other_verdicts = let_go_first
            tether.barrier(timeout=TIMEOUT)
        else:
            store.get(GO)
            if rank == 2:
                emit("stall", rank=rank, time=time.time())
                time.sleep(STALL)
            else:
                dist.all_reduce(torch.ones(1), group=pair)  # waits for rank 2
    except tether.SyncTimeout as exc:
        raised(rank, exc, stalled=exc.stalled, missing=exc.missing, waiting=exc.waiting)
        raise


if __name__ == "__main__":
    tether.spawn("gloo", main, (), nproc_per_node=3, grace=2.0)  # the ladder ends ranks 0 and 2 sooner
