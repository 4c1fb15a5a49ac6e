"""Two ranks fail within the same second under torchrun (issue 8, item 3).

Four ranks; after a barrier every rank sleeps until the same wall-clock instant (0.1 s
past a whole second). Rank 2 then raises at once, rank 1 10 ms later; ranks 0 and 3 wait
in a barrier. torchrun's error files have whole-second timestamps and ties go to the
lowest rank: tether's must still make torchrun's Root Cause rank 2.
"""

import signal
import time

from lifecycle_common import emit, raised, start_in_step

import tether

rank = start_in_step()
try:
    if rank == 2:
        emit("struck", rank=rank, time=time.time())
        raise RuntimeError("boom from rank 2")
    if rank == 1:
        # torchrun SIGTERMs the other ranks once rank 2 exited; on a loaded machine that once
        # came before this sleep ended, and rank 1 never struck. Held back: its own raise is its fate
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        time.sleep(0.01)
        emit("struck", rank=rank, time=time.time())
        raise RuntimeError("boom from rank 1")
    tether.barrier()
except BaseException as exc:
    raised(rank, exc)
    raise
tether.finalize()
