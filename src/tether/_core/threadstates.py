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
go of a tensor whose Python object died first, say). So ``Keeper`` also hands a group's
collectives a callback that does nothing but keep its thread's state, until as many gloo
threads as the group has (gloo's ``_threads`` option, 2 by default) have run one, or for
at most its first ``CARRY_AT_MOST`` collectives: the measured cost of a callback on a
collective is a GIL hand-off per call, which a group whose works all land on one thread
must not pay for ever.

Cost: one state (a few KiB) per such thread, kept until the process ends, including after
its group is destroyed; a callback on a group's first collectives (2 of 3,000
``all_reduce(1)`` per rank, 2 ranks: ``fork-workers.md``), and per collective one look in a
dict; nothing on the CPython releases that have the fix, where none of it is done.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

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


CARRY_AT_MOST = 100  # collectives of one group that may carry ``Keeper``'s callback
_GLOO_THREADS = 2  # gloo's default ``_threads``, where a group's cannot be read


class Keeper:
    """Until every gloo thread of a group kept its Python thread state (see above): one per
    context, which the groups it knows by key outlive no longer than it does."""

    def __init__(self) -> None:
        self._groups: dict[str, _Watch] = {}

    def callback(self, key: str, pg: Any) -> Callable[[Any], None] | None:
        """The callback the next collective on group ``key`` (``pg``: its ProcessGroup) should
        carry, or None. On the main thread, per collective."""
        if not NEEDED:
            return None
        watch = self._groups.get(key)
        if watch is None:
            watch = self._groups[key] = _Watch(_threads_of(pg))
        if watch.done:
            return None
        watch.carried += 1
        if watch.carried > CARRY_AT_MOST:
            watch.done = True
            return None
        return watch.on_done


class _Watch:
    """One group's gloo threads seen to keep their states."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.seen: set[int] = set()
        self.carried = 0
        self.done = False

    def on_done(self, _: Any) -> None:
        """A work's completion callback: keep the state of the thread running it."""
        keep_thread_state()
        if threading.current_thread() is not threading.main_thread():  # the main thread: done at once
            self.seen.add(threading.get_native_id())
            self.done = len(self.seen) >= self.threads


def _threads_of(pg: Any) -> int:
    """How many threads gloo runs for ``pg`` (None: the default group)."""
    try:
        pg = pg if pg is not None else dist.distributed_c10d._get_default_group()
        return int(pg._get_backend(torch.device("cpu")).options._threads)
    except Exception:  # not gloo, or a torch that names it otherwise
        return _GLOO_THREADS
