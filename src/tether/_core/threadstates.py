"""A thread of torch's that runs tether's Python keeps its Python thread state for life.

**The hang.** A thread that C++ started (gloo's ``pt_gloo_runloop``) has no Python thread
state. Each time it enters Python, pybind11 makes one and, on the way out, deletes it.
Making one takes CPython's runtime lock (``HEAD_LOCK``) *without* the GIL. Before CPython
3.10.15 and 3.11.10 (gh-112275; 3.12 never had it) a child of ``os.fork`` takes that lock
before it makes it anew, so a fork while such a thread holds it leaves the child stuck
inside ``os.fork``, before its first line of Python, for good. A DataLoader's worker is such
a child; its rank waits for the worker's first batch, and every peer for that rank.

**Seen here** (``benchmarks/results/fork-workers.md``): 2-rank jobs forking DataLoader
workers between tether collectives hung; gdb on a stuck worker, walking the thread states
it inherited, found at their head one of a ``pt_gloo_runloop`` thread with a counter of 0:
made, not yet handed back. tether makes such entries: a wait that outlasts its first 5 ms
wakes on the work's completion callback, and DDP's buckets settle in theirs; each runs on
gloo's thread, and so does pybind11's drop of the callback after it and any tensor whose
last reference that thread lets go.

**The fix.** The first time one of tether's callbacks runs on a thread, it takes one more
hold of the thread's state (``PyGILState_Ensure``) and never gives it back, so pybind11
keeps the state instead of deleting it: that thread never makes another, and no later
entry of it, tether's or torch's, takes the lock without the GIL. A thread's first entry
still makes one, but for tether's callbacks the main thread is then waiting for it, not
forking. That left the gloo threads that had not yet run one of tether's callbacks: with
only those kept, a stuck worker's inherited states still began with one being made, for
the other gloo thread of its rank (``fork-workers.md``), entering Python for torch (to let
go of a tensor whose Python object died first, say). So ``Keeper`` also hands every
collective of tether's a callback that does nothing but keep its thread's state, until
every gloo thread of the process (``pt_gloo_runloop``, ``/proc/self/task``) has kept one;
it looks again every 2 s for threads of groups made since.

Cost: one state (a few KiB) per such thread, kept until the process ends, including after
its group is destroyed; a callback on each of the first collectives of a new group (until
each of its threads completed one), and a look at ``/proc/self/task`` at most every 2 s;
nothing on the CPython releases that have the fix, where none of it is done.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

# the first release of each line whose child re-makes the lock before it takes it
_FIXED_IN = {(3, 10): 15, (3, 11): 10}
NEEDED = sys.implementation.name == "cpython" and sys.version_info[2] < _FIXED_IN.get(sys.version_info[:2], 0)

_kept = threading.local()  # a thread state's own dict: kept as long as the state is


def keep_thread_state() -> None:
    """Keep the calling thread's Python thread state until the process ends (see above).

    Call it first in any Python that torch runs on a thread of its own. Idempotent and cheap
    after the first call on a thread (one attribute lookup).
    """
    if not NEEDED or getattr(_kept, "held", False):
        return
    import ctypes  # only where needed, and once per thread

    ctypes.pythonapi.PyGILState_Ensure()  # never released: the state outlives this callback
    _kept.held = True
    me = _identity(threading.get_native_id())
    if me is not None:
        KEEPER.kept.add(me)


LOOK_EVERY = 2.0  # seconds between looks for gloo threads that have not kept a state
_RUNLOOP = "pt_gloo_runloop"  # what torch names gloo's threads that complete its works


class Keeper:
    """Makes sure every gloo thread of this process keeps its Python thread state (see above)."""

    def __init__(self) -> None:
        self.kept: set[tuple[int, str]] = set()  # (thread id, start time): an id can be reused
        self._runloops: dict[str, tuple[int, str] | None] = {}  # each thread seen: its identity if gloo's
        self._pending = NEEDED
        self._next_look = 0.0

    def wanted(self) -> bool:
        """Should the next collective carry ``on_done``? On the main thread, per collective."""
        if not NEEDED:
            return False
        now = time.monotonic()
        if now >= self._next_look:
            self._next_look = now + LOOK_EVERY
            self._pending = bool(self._look() - self.kept)
        return self._pending

    def on_done(self, _: Any) -> None:
        """A work's completion callback: keep the state of the thread running it."""
        keep_thread_state()

    def _look(self) -> set[tuple[int, str]]:
        """gloo's threads in this process now (none where ``/proc`` is not); a thread's name and
        start are read once."""
        try:
            tids = set(os.listdir("/proc/self/task"))
        except OSError:
            return set()
        for gone in self._runloops.keys() - tids:
            del self._runloops[gone]
        for tid in tids - self._runloops.keys():
            try:
                ours = Path(f"/proc/self/task/{tid}/comm").read_text().strip() == _RUNLOOP
            except OSError:
                ours = False
            self._runloops[tid] = _identity(int(tid)) if ours else None
        return {me for me in self._runloops.values() if me is not None}


def _identity(tid: int) -> tuple[int, str] | None:
    try:
        stat = Path(f"/proc/self/task/{tid}/stat").read_text()
    except OSError:
        return None
    return tid, stat.rsplit(")", 1)[1].split()[19]  # field 22: the thread's start time


KEEPER = Keeper()
