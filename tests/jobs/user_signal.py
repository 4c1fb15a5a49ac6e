"""A handler of the user's for SIGTERM that returns (it sets a flag) does not end a tether wait.

    python user_signal.py

``tether.spawn``, 2 ranks. Each rank installs its own SIGTERM handler (it counts, as a
"stop after this step" flag would). Rank 0 then waits for rank 1, which comes 1 s late,
three times: in a barrier (a store gate), in ``one_rank_first`` (rank 1 goes first) and
in an all_reduce (a collective), and a thread sends rank 0 SIGUSR1 (handled too) 0.2 s and
SIGTERM 0.3 s into each wait. Every wait must complete with its result, and rank 0's
handlers must have run three times each.
Each rank reports ``LC done`` with what it saw.
"""

import os
import signal
import threading
import time

from lifecycle_common import emit, raised

import tether

LATE = 1.0


def fn(local_rank: int) -> None:
    rank = tether.get_rank()
    seen: list[float] = []
    other: list[float] = []  # a handler for another signal (a profiler's, a debugger's)
    signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(time.monotonic()))
    signal.signal(signal.SIGUSR1, lambda signum, frame: other.append(time.monotonic()))
    tether.barrier()
    results = []
    try:
        for kind in ("barrier", "one_rank_first", "all_reduce"):
            if rank == 0:
                threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR1)).start()
                threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
            else:
                time.sleep(LATE)
            start = time.monotonic()
            if kind == "barrier":
                tether.barrier()
                results.append(None)
            elif kind == "one_rank_first":
                with tether.one_rank_first(rank=1):
                    results.append(rank)
            else:
                results.append(tether.all_reduce(0.1 + rank))
            emit("waited", rank=rank, kind=kind, seconds=time.monotonic() - start)
    except BaseException as exc:
        raised(rank, exc)
        raise
    emit("done", rank=rank, handled=len(seen), other=len(other), results=results)


if __name__ == "__main__":
    tether.spawn("gloo", fn, (), nproc_per_node=2)
