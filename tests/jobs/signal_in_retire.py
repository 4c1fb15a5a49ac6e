"""A signal that lands while a rank retires its context goes where the interpreter's
wakeup fd then points: it must be the keeper's pipe, still open, or none.

    python signal_in_retire.py

``tether.spawn``, 2 ranks. Each rank installs a SIGUSR1 handler (a preemption notice's,
as SLURM's ``--signal``), then returns; in its retire, right after the watchdog stopped,
it opens four files (a checkpoint's, a log's: they take the lowest free fds) and sends
itself SIGUSR1. The watchdog used to close its pipe in its stop, while the interpreter
still wrote each signal's number to it until the hooks came off a moment later: the
signal's byte went into the user's file that took the fd's number, or, with no file
there, Python printed "Exception ignored when trying to write to the signal wakeup fd"
(seen in a fresh-clone run, a launcher's SIGTERM landing there).
Each rank reports ``LC retired`` with its handler's count and the files' bytes.
"""

import contextlib
import signal
import tempfile
import threading
from typing import Any

from lifecycle_common import emit

import tether
from tether._core.watchdog import Watchdog


def fn(local_rank: int) -> None:
    rank = tether.get_rank()
    caught: list[int] = []
    signal.signal(signal.SIGUSR1, lambda signum, frame: caught.append(signum))
    stop = Watchdog.stop

    def stop_then_signal(self: Watchdog, *args: Any, **kwargs: Any) -> None:
        stop(self, *args, **kwargs)
        with contextlib.ExitStack() as stack:
            files = [stack.enter_context(tempfile.TemporaryFile()) for _ in range(4)]
            signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)  # its C handler runs before this returns
            written = []
            for f in files:
                f.seek(0)
                written.append(f.read().hex())
        emit("retired", rank=rank, written=written, caught=caught)

    Watchdog.stop = stop_then_signal  # type: ignore[method-assign]
    tether.barrier()


if __name__ == "__main__":
    tether.spawn("gloo", fn, (), nproc_per_node=2)
