"""A rank that finishes while the others still wait for it (issue 8, item 6).

    python finish_early.py spawn HOW     (tether.spawn, 2 ranks)
    torchrun ... finish_early.py torchrun HOW

Rank 1 finishes at once, by HOW: ``return`` (returns from the function), ``exit0``
(``sys.exit(0)``) or, under torchrun, ``finalize`` (``finalize()`` then the script ends),
``exit2`` (``sys.exit(2)`` reaches the top: no finalize), ``exit-thread``
(``sys.exit("...")`` with a non-daemon thread running, which keeps its process alive) or
``os-exit0`` (``os._exit(0)``: no exit function, no teardown); rank 0 does one barrier and
then waits in a second one (``barrier #2``), or in an all_reduce with ``--collective``.
Rank 0 must raise ``PeerFinished`` naming rank 1. With ``FINISH_EARLY_WORK=S`` rank 0
works S seconds in user code instead, waits for nobody, and ends cleanly.

With ``exit2`` rank 0 starts its wait once rank 1's exit functions have run (a file
says so): torchrun's SIGTERM then reaches rank 0 about when its first check of finished
ranks would (0.5 s into the wait), and the story must not depend on which comes first.
Rank 1's exit functions can last seconds on a loaded machine (tether's joins its stopped
threads): rank 0 says when its wait began (``waits``).
``FINISH_EARLY_SLOW_EXIT=S`` makes rank 1's teardown after them last S seconds more.
"""

import atexit
import os
import sys
import threading
import time

from lifecycle_common import emit, raised

import tether

LAUNCHER, HOW = sys.argv[1], sys.argv[2]
COLLECTIVE = "--collective" in sys.argv
EXITED = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"tether-finish-early-{os.environ.get('MASTER_PORT')}")


def _exited() -> None:  # registered before tether's: runs after tether's exit function
    emit("exited", rank=1, time=time.time())
    with open(EXITED, "w"):
        pass


class _SlowTeardown:
    """Python's teardown of rank 1 lasts ``FINISH_EARLY_SLOW_EXIT`` seconds more (a loaded
    machine's): this object's ``__del__`` runs as the interpreter clears the module."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.sleep = seconds, time.sleep

    def __del__(self) -> None:
        self.sleep(self.seconds)


if HOW == "exit2" and os.environ.get("RANK") == "1":
    atexit.register(_exited)
    _slow = _SlowTeardown(float(os.environ.get("FINISH_EARLY_SLOW_EXIT", "0")))


def fn(local_rank: int) -> None:
    rank = tether.get_rank()
    tether.barrier()
    if rank == 1:
        emit("finish", rank=rank, how=HOW, time=time.time())
        if HOW == "exit0":
            sys.exit(0)
        if HOW == "exit2":
            sys.exit(2)
        if HOW == "exit-thread":
            threading.Thread(target=time.sleep, args=(3600,), name="logger").start()
            sys.exit("fatal: no config")
        if HOW == "os-exit0":
            os._exit(0)
        return
    work = float(os.environ.get("FINISH_EARLY_WORK", "0"))
    if work:
        started = time.monotonic()
        while time.monotonic() - started < work:  # a final save, an evaluation: no peer needed
            time.sleep(0.05)
        emit("worked", rank=rank, seconds=round(time.monotonic() - started, 3))
        return
    if HOW == "exit2":
        while not os.path.exists(EXITED):
            time.sleep(0.005)
        os.unlink(EXITED)
    emit("waits", rank=rank, time=time.time())  # the notice's bound counts from here
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
