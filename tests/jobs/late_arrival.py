"""A rank that arrives after a barrier's timeout expired, but before the verdict asks.

    python late_arrival.py

2 ranks under ``tether.spawn`` (gloo, loopback). Rank 0 waits in ``barrier(timeout=1)``;
rank 1 prepares for 1.5 s in user code, then enters the barrier. Rank 0's question to the
other ranks (``Channel.ask_whereabouts``) is held back 1.2 s, as on a loaded machine
between the timeout and the question: when it asks, rank 1 is in the barrier too. The
rank that came late is rank 1, not rank 0, which waited.
"""

from __future__ import annotations

import time
from typing import Any

from lifecycle_common import emit, raised

import tether
from tether._core.channel import Channel

HELD_BACK = 1.2  # rank 0's question, after its timeout expired
TIMEOUT = 1.0
PREPARE = 1.5  # rank 1, in user code: it arrives 0.5 s after rank 0's timeout expired


def late_preparation() -> None:
    time.sleep(PREPARE)


def main(local_rank: int) -> None:
    rank = tether.get_rank()
    tether.barrier()
    if rank == 0:
        original = Channel.ask_whereabouts

        def held_back(self: Channel, *a: Any, **kw: Any) -> Any:
            time.sleep(HELD_BACK)
            return original(self, *a, **kw)

        Channel.ask_whereabouts = held_back  # type: ignore[method-assign]
    else:
        late_preparation()
    emit("arrives", rank=rank, time=time.time())
    try:
        tether.barrier(timeout=TIMEOUT)
    except tether.SyncTimeout as exc:
        raised(rank, exc, stalled=exc.stalled, late=exc.late, missing=exc.missing)
        raise


if __name__ == "__main__":
    tether.spawn("gloo", main, (), nproc_per_node=2)
