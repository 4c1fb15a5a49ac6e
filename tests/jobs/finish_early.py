"""A rank that finishes while the others still wait for it (issue 8, item 6).

    python finish_early.py spawn HOW     (tether.spawn, 2 ranks)
    torchrun ... finish_early.py torchrun HOW

Rank 1 finishes at once, by HOW: ``return`` (returns from the function), ``exit0``
(``sys.exit(0)``) or, under torchrun, ``finalize`` (``finalize()`` then the script ends);
rank 0 does one barrier and then waits in a second one (``barrier #2``), or in an
all_reduce with ``--collective``. Rank 0 must raise ``PeerFinished`` naming rank 1.
"""

import sys
import time

from lifecycle_common import emit, raised

import tether

LAUNCHER, HOW = sys.argv[1], sys.argv[2]
COLLECTIVE = "--collective" in sys.argv


def fn(local_rank: int) -> None:
    rank = tether.get_rank()
    tether.barrier()
    if rank == 1:
        emit("finish", rank=rank, how=HOW, time=time.time())
        if HOW == "exit0":
            sys.exit(0)
        return
    try:
        if COLLECTIVE:
            tether.all_reduce(0.1)
        else:
            tether.barrier()
    except BaseException as exc:
        raised(rank, exc)
        raise


if __name__ == "__main__":
    if LAUNCHER == "spawn":
        try:
            tether.spawn("gloo", fn, (), nproc_per_node=2)
        except tether.JobFailed as exc:
            emit("launcher", exit_codes={str(k): v for k, v in exc.exit_codes.items()})
            raise
    else:
        tether.initialize("gloo")
        fn(tether.get_local_rank())
        tether.finalize()
