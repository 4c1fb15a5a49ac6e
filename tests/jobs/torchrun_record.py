"""torch's ``@record`` on ``main``, as torchrun's documentation asks, and a failure (issue 8, item 3).

Two ranks; after a barrier both sleep until 0.1 s past a whole second, then rank 1
raises and rank 0 waits in a barrier. ``@record`` writes rank 0's error file as the
``PeerFailure`` leaves ``main``, stamped with that second: the root cause's second too.
torchrun's Root Cause must still be rank 1.
"""

import time

from lifecycle_common import emit, raised, start_in_step
from torch.distributed.elastic.multiprocessing.errors import record

import tether


@record
def main() -> None:
    rank = start_in_step()
    try:
        if rank == 1:
            emit("struck", rank=rank, time=time.time())
            raise RuntimeError("boom 0.1 from rank 1")
        tether.barrier()
    except BaseException as exc:
        emit("left", rank=rank, time=time.time())
        raised(rank, exc)
        raise
    tether.finalize()


if __name__ == "__main__":
    main()
