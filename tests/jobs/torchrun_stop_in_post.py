"""A launcher's SIGTERM lands while a victim posts its failure (CI, 4 ranks, a mismatch).

Two ranks under torchrun, started in step (see ``start_in_step``): rank 1 raises at once;
rank 0 waits in a barrier, gets ``PeerFailure``, and ``finalize()`` in its ``finally``
posts it. That post's store round trip is where torchrun's SIGTERM (0.1 s after rank 1
exited) once landed: the ``Terminated`` it raised replaced the failure, rank 0 exited 143
with no error file, and torchrun named rank 0 -- the same second, the lower rank -- as
root cause. Here rank 0 sends itself the SIGTERM at that very point, deterministically:
``Channel.mark_done`` on the main thread (the post's first store call) sends it first.
"""

import os
import signal
import threading

from lifecycle_common import emit, raised, start_in_step

import tether
from tether._core.channel import Channel

rank = start_in_step()
if rank == 0:
    mark_done = Channel.mark_done

    def stopped_in_the_post(self: Channel, how: str, client: object = None) -> None:
        if threading.current_thread() is threading.main_thread():
            emit("stop sent", rank=rank)
            os.kill(os.getpid(), signal.SIGTERM)
        mark_done(self, how, client)  # type: ignore[arg-type]

    Channel.mark_done = stopped_in_the_post  # type: ignore[method-assign]
try:
    if rank == 1:
        emit("struck", rank=rank)
        raise RuntimeError("boom from rank 1")
    tether.barrier()
except BaseException as exc:
    raised(rank, exc)
    raise
finally:
    tether.finalize()
