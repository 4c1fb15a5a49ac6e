"""Tensors lent to a backend's threads, and an exit that waits until they are given back.

gloo runs each collective on a worker thread of its own (``pt_gloo_runloop``), which
holds the work, and with it the work's tensors, a little beyond the moment the caller's
wait returns: it drops them at the end of its loop. On torch 2.13 a tensor with a Python
object keeps that object alive while C++ holds other references to it ("PyObject
preservation", ``c10/util/intrusive_ptr.h``), so the thread that drops the last of those
references decrefs the Python object, and takes the GIL to do it. torch skips that decref
once Python's teardown has begun (``Py_IsInitialized()`` false), but a worker that passed
that check just before and then waits for the GIL across the start of the teardown is
ended by Python (``take_gil`` calls ``pthread_exit``), and the unwinding through torch's
``noexcept`` destructor aborts the process: "terminate called without an active
exception", SIGABRT, exit status 134 or -6.

Seen in CI on a rank that returned without ``finalize()`` (the core dump: the gloo worker
in ``~AsyncAllreduceWork`` -> ``TensorImpl::decref_pyobject`` -> ``gil_scoped_acquire`` ->
``take_gil`` -> ``pthread_exit`` -> ``std::terminate``, the main thread in
``Py_FinalizeEx``). Rare: 1 rank exit in 320 on the 2-core VM under CPU hogs, where the
worker waited for the CPU. Made certain by an async work whose peer comes while the last
exit handler holds the GIL (``tests/jobs/lifecycle_lent.py``). ``finalize()`` is not
exposed: destroying the group joins the worker threads before the teardown.

So every tensor tether hands a backend is noted here, with its C++ reference count before
the call (``counted``, then ``lend``): its own collectives' and
those of the user's raw ``dist.*`` calls it wraps (``rawcalls.py``). At exit, before
Python's teardown (``ending._at_exit``), the rank waits (``settle``) until each tensor is
gone or back to that count, so its work was dropped, by whichever thread, while the GIL
could still be had; then, if one is still alive, it releases the GIL ``GRACE`` longer
for the decref that follows the count. The wait is bounded (``SETTLE``): a work whose
peer never comes (an async work nobody waited for) is waited for no longer, and a
warning says so. A tensor the program gave more C++ references after the call (autograd
saving it for a backward never run) looks held too: DDP's parameters, which its
constructor broadcasts through a raw call and its reducer then keeps, cost every DDP job
2 s and a false warning at exit (seen on gloo and on NCCL). So a call whose work is known
done (a blocking raw call that returned, a tether collective whose wait returned) is
waited for only until ``SETTLE`` seconds after it was done: a worker drops a finished
work within its loop's next few microseconds, and references still there after that are
the program's. A work that may still be in flight (an async raw work, a call that
raised) is waited for by its count alone, and only such a work is the warning's subject.
An async raw work is kept (a strong reference) until it is seen complete, at the next
call or at the exit: a complete work is done, and its tensors held after it are the
program's. ``Join`` (``torch.distributed.algorithms``) issues an async all-reduce in each
DDP forward that the reducer waits for in C++ and then keeps: it cost every rank of a
``Join`` job 2 s and a false warning at exit. Kept, the work is dropped on the main thread,
the GIL held, or by a worker within its loop once it completed (``GRACE``).
A process that tether ends after a failure (its excepthook runs the exit functions, then
``os._exit``) has no teardown ahead, and does not wait: a survivor's work left pending on
the dead peer cost each survivor the whole ``SETTLE`` and a warning there (under torchrun).
Not covered: the works of ``isend``/``irecv`` and of DDP's reducer, which tether does not
issue or wrap.

Cost: a reference-count read before the call and a weak reference after it was issued
(about 0.13 us a tensor, measured with ``timeit``), kept for the last ``KEPT`` calls: a
work is held past its wait only by the worker that ran it (gloo has 2 a group).
"""

from __future__ import annotations

import collections
import time
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

import torch

KEPT = 16  # calls whose tensors are watched: a work outlives its wait on its worker thread only
SETTLE = 2.0  # seconds an exit waits for the backend's threads to give the tensors back
GRACE = 0.02  # seconds of GIL hand-offs an exit gives a worker that let go of a tensor still alive

Loan = tuple["weakref.ref[torch.Tensor]", int]
Counted = list[tuple[torch.Tensor, int]]


class Call:
    """The tensors one call lent, and when its work was known done (None: maybe in flight)."""

    __slots__ = ("done_at", "loans", "settle", "work")

    def __init__(self, loans: tuple[Loan, ...], done_at: float | None, work: Any = None) -> None:
        self.loans = loans
        self.done_at = done_at
        self.work = work  # an async work, until it is seen complete
        self.settle = SETTLE  # seconds after done_at when its worker surely dropped it

    def settled(self, now: float) -> bool:
        """Done ``settle`` seconds ago: the backend's threads dropped its work long since."""
        return self.done_at is not None and now - self.done_at >= self.settle

    def completed(self, settle: float) -> bool:
        """Whether its async work is seen complete now (then it is done, and let go)."""
        if self.work is None or not self.work.is_completed():
            return False
        self.work, self.done_at, self.settle = None, time.monotonic(), settle
        return True


_calls: collections.deque[Call] = collections.deque(maxlen=KEPT)
_async: list[Call] = []  # the calls among them whose async work was not yet seen complete


def _count(tensor: torch.Tensor) -> int:
    """The C++ reference count of ``tensor``'s TensorImpl (its Python object's own included)."""
    return int(tensor._use_count())  # type: ignore[attr-defined]  # torch's, not in its stubs


def counted(tensors: Iterable[Any]) -> Counted:
    """The tensors among ``tensors``, each with its count now, before a call lends them."""
    return [(t, _count(t)) for t in tensors if isinstance(t, torch.Tensor)]


def counted_args(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Counted:
    """``counted`` for a raw call's arguments: its tensors, also those in a list or tuple."""
    found: Counted = []
    for arg in (*args, *kwargs.values()):
        found.extend(counted(arg if isinstance(arg, list | tuple) else (arg,)))
    return found


def lend(found: Counted, done: bool = False, work: Any = None) -> Call | None:
    """Note ``found``'s tensors, handed to a backend by a call (a call that raised leaves
    them at their counts: never waited for); ``done``: its work is finished (else tell
    ``returned`` once it is, or pass its async ``work``, which is looked at later)."""
    if _async:
        _async[:] = [c for c in _async if not c.completed(SETTLE) and c in _calls]
    if not found:
        return None
    call = Call(tuple((weakref.ref(t), n) for t, n in found), time.monotonic() if done else None, work)
    _calls.append(call)
    if work is not None:
        _async.append(call)
    return call


def returned(call: Call | None) -> None:
    """``call``'s work is finished: its wait returned."""
    if call is not None:
        call.done_at = time.monotonic()


def _held(loan: Loan) -> bool | None:
    """True: the backend still holds the tensor; None: it let go, but may not have decref'd
    the Python object yet (it decrements the count first); False: the tensor is gone."""
    ref, before = loan
    tensor = ref()
    if tensor is None:
        return False
    return True if _count(tensor) > before else None


def settle(bound: float = SETTLE) -> int:
    """Wait, up to ``bound`` seconds, until the backend's threads hold none of the lent tensors.

    Returns how many they still hold (0: the exit is safe); forgets them all either way.
    A call whose work was done ``SETTLE`` seconds ago is not waited for (see above).
    Each check releases the GIL for 1 ms: a worker waiting for it to drop a tensor gets it.
    When a tensor that was let go is still alive, the GIL is released for ``GRACE`` more:
    its count fell before its worker took the GIL to decref the Python object
    (``intrusive_ptr::reset_not_null_``), and an exit that went by the count alone left
    a moment too early (1 exit in 2 of ``lifecycle_lent.py``).
    """
    deadline = time.monotonic() + bound
    calls = list(_calls)
    _calls.clear()
    _async.clear()
    while True:
        for call in calls:
            call.completed(GRACE)  # seen complete now: its worker lets go within microseconds
        now = time.monotonic()
        states = [_held(loan) for call in calls if not call.settled(now) for loan in call.loans]
        if True not in states:
            break
        if time.monotonic() >= deadline:
            return states.count(True)
        time.sleep(0.001)
    if None in states:
        time.sleep(GRACE)
    return 0
