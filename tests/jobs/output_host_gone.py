"""A stall under ``torch.multiprocessing.spawn``, where rank 0 hosts the store (2 ranks).

    python output_host_gone.py PORT

Each rank calls ``tether.initialize("gloo", init_method="tcp://127.0.0.1:PORT", ...)``
with ``sync_timeout=TIMEOUT``. Rank 1 stalls in user code; rank 0's barrier times out,
rank 0 exits and its store closes with it; ``mp.spawn`` then SIGTERMs rank 1. Rank 1
must end quietly: before, it wrote to the closed store, and torch's client logged a
warning with a C++ stack, then tether said it "could not post this rank's failure".
"""

import os
import sys
import time

from lifecycle_common import emit, safe_str

TIMEOUT = 2.0


def rank_main(rank: int, port: int) -> None:
    import tether

    tether.initialize("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, sync_timeout=TIMEOUT)
    try:
        tether.barrier()  # both ranks past initialize: rank 1's stall is in user code, however slow its start
        if rank == 1:
            emit("stall", rank=rank, pid=os.getpid())
            time.sleep(60)
        tether.barrier()
    except BaseException as exc:
        emit("raised", rank=rank, exc=type(exc).__name__, msg=safe_str(exc)[:300])
        raise
    finally:
        tether.finalize()


def main() -> None:
    import torch.multiprocessing as mp

    mp.spawn(rank_main, args=(int(sys.argv[1]),), nprocs=2)


if __name__ == "__main__":
    main()
