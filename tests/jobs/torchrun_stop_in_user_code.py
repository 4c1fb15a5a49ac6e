"""torchrun's SIGTERM reaches a victim in its own code, while a thread is inside torch.

Two ranks under torchrun. Rank 1 raises. Rank 0 is in user code (no tether call) when
torchrun, 0.1 s after rank 1 exited, SIGTERMs it: ``Terminated``, a ``SystemExit``. A
daemon thread of rank 0 meanwhile polls a store key (``TCPStore.wait`` with a 20 ms
timeout, in a loop), as any background thread doing torch work may be inside C++.

The ``SystemExit`` never reaches an excepthook: Python's teardown ran, and the thread,
returning from C++ into a finalizing interpreter, aborted the process (SIGABRT: "terminate
called without an active exception"; once in CI, a fault test's rank). tether must end
the rank at once with the code of the failure behind the stop (``PEER_FAILED``, 3) and
its error file saying that failure.

Argument: ``finalize`` (``finally: tether.finalize()``) or ``exit`` (no ``finalize``:
tether's atexit function sees the stop).
"""

import contextlib
import datetime
import os
import sys
import threading
import time

import torch.distributed as dist
from lifecycle_common import emit, raised, start_in_step

import tether

how = sys.argv[1]
# its own store (only the thread's call matters), made before the ranks' common start: a
# new store connection can take a slow resolver's lookups (1 s under
# tests/slow_resolver.py --answer-after 0.5), and rank 1's failure came meanwhile
client = dist.TCPStore("127.0.0.1", 0, 1, True) if os.environ["RANK"] == "0" else None
rank = start_in_step()


def poll(store: dist.Store) -> None:
    while True:
        with contextlib.suppress(Exception):  # its timeout: back into C++ at once
            store.wait(["never set"], datetime.timedelta(seconds=0.02))


if client is not None:
    threading.Thread(target=poll, args=(client,), daemon=True).start()
try:
    if rank == 1:
        emit("struck", rank=rank)
        raise RuntimeError("boom from rank 1")
    emit("in user code", rank=rank)
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:  # torchrun's SIGTERM comes 0.1 s after rank 1 exited
        time.sleep(0.01)
    emit("never stopped", rank=rank)
except BaseException as exc:
    raised(rank, exc)
    raise
finally:
    if how == "finalize":
        tether.finalize()
