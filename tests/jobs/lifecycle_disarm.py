"""``finalize()`` disarms the ladder (issue 7): a rank that is done with a failed job lives on.

    lifecycle_disarm.py
        starts 3 rank processes (``lifecycle_disarm.py rank R PORT``), each calling
        ``tether.initialize("gloo", init_method="tcp://127.0.0.1:PORT", rank=R,
        world_size=3, grace=2)``. After a barrier rank 1 raises ValueError("bad 0.1")
        (uncaught). Ranks 0 and 2 then call ``tether.finalize()``, work locally for
        grace + 3 s, print "alive rank R" and exit 0. They got there two ways:

        rank 0  caught the PeerFailure of its next barrier (the ladder stood down)
        rank 2  was in user code (1 s) when the failure came, and no tether call raised
                it before finalize(): the ladder was armed and never stood down

This process prints ``LC {"event": "exit", "name": "<rank>", "code": ...}`` per rank.
"""

from __future__ import annotations

import os
import sys
import time

from lifecycle_common import emit, free_port, raised, start, wait_all

GRACE = 2.0


def rank_main(rank: int, port: int) -> None:
    import tether

    tether.initialize("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=3, grace=GRACE)
    tether.barrier()
    if rank == 1:
        raise ValueError("bad 0.1")
    if rank == 2:
        time.sleep(1.0)  # user code: the failure arrives here and is never raised to this rank
    else:
        try:
            tether.barrier()
        except tether.PeerFailure as exc:
            raised(rank, exc)
        else:
            emit("passed", rank=rank)  # the barrier must not pass: rank 1 never arrives
    tether.finalize()
    emit("finalized", rank=rank, time=time.time())
    time.sleep(GRACE + 3.0)  # local work after the job: the ladder must be disarmed
    os.write(1, f"alive rank {rank}\n".encode())


def main() -> None:
    if sys.argv[1:2] == ["rank"]:
        rank_main(int(sys.argv[2]), int(sys.argv[3]))
        return
    port = free_port()
    procs = {str(r): start([__file__, "rank", str(r), str(port)]) for r in (0, 1, 2)}
    codes = wait_all(procs, bound=90.0)
    sys.exit(0 if codes["0"] == codes["2"] == 0 else 1)


if __name__ == "__main__":
    main()
