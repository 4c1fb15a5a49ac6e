"""A timeout whose missing member waits, in a sync of its own, for a rank this one does not hold.

    python chained_timeouts.py

4 ranks under ``tether.spawn`` (gloo, loopback), as in a 2 x 2 DeviceMesh's groups: rank 0
stalls in user code; rank 2 waits for it in ``barrier(group=[0, 2], timeout=LONG)``; rank 3
waits for rank 2 in ``barrier(group=[2, 3], timeout=SHORT)``, which expires first; rank 1
waits for rank 0 in ``barrier(group=[0, 1], timeout=LONG)``. Rank 3's verdict finds rank 2
missing, waiting in another call: the rank that stalled is rank 0, which rank 3's sync
does not hold, and the job's root cause must be rank 0.
"""

from __future__ import annotations

import time

from lifecycle_common import emit, raised

import tether

SHORT = 2.0  # rank 3's barrier: it expires first
LONG = 3.0  # the barriers that hold rank 0
STALL = 60.0


def main(local_rank: int) -> None:
    rank = tether.get_rank()
    for pair in ([0, 2], [2, 3], [0, 1]):  # every rank makes each list's group on its first use
        tether.barrier(group=pair)
    try:
        if rank == 0:
            emit("stall", rank=rank, time=time.time())
            time.sleep(STALL)
        elif rank == 3:
            tether.barrier(group=[2, 3], timeout=SHORT)
        else:
            tether.barrier(group=[0, rank], timeout=LONG)
    except tether.SyncTimeout as exc:
        raised(rank, exc, stalled=exc.stalled, missing=exc.missing, waiting=exc.waiting)
        raise


if __name__ == "__main__":
    tether.spawn("gloo", main, (), nproc_per_node=4)
