"""Futures tether can fail: how a wait that is not tether's own (DDP's reducer) is woken.

DDP's reducer waits in C++ on the future of each bucket's all-reduce; nothing else can
wake it. tether's guard (``tether/ddp.py``: the reducer's process group, or a
communication hook) hands the reducer a future of its own making, chained to the
backend's, and registers it here; when a failure is delivered to this rank, the
watchdog fails every registered future with it, and the reducer's ``value()`` raises out
of ``backward()`` within the notice time of any tether wait.

Facts measured on torch 2.13 (gloo) that shape it:

* ``Future.set_exception`` on the future handed to the reducer is not an error in C++'s
  eyes: the future holds the Python exception as its value. The reducer, reading that
  value as the bucket's tensor, raises ``RuntimeError("Unable to cast <the exception's
  text> to Tensor")`` out of ``backward()``, in the main thread. That suffices:
  ``backward()`` is wrapped (``rawcalls.py``), a rank with a known failure raises
  tether's own exception chained to it, and a backend error's text is still in it. So the
  hook hands the reducer the very future tether fails: one Python callback per bucket
  (the backend's completion), as torch's own ``allreduce_hook``. It used to hand over
  ``parent.then(value)``, a second callback per bucket that made C++ see a real error.
* Nor can the hook hand over the backend's own future and save that callback: the future
  a Python hook returns must hold a Python object (a hook returning the future of
  ``dist.all_reduce(..., async_op=True)`` stops ``backward()`` with torch's
  ``result.isPyObject() INTERNAL ASSERT FAILED``, tried by hand on 2026-12-06). Every
  Python hook, torch's own ``allreduce_hook`` included, completes each bucket from Python.
* A future completed twice raises "can only be marked completed once". The backend's
  completion and tether's failure can race, so every completion goes through ``settle``,
  under one lock, first one wins.
* A collective the backend finished before the failure arrived is not failed: a future
  registered with ``rescue`` is settled from the backend when ``rescue`` finds it done
  (seen in CI: a survivor whose all-reduce had completed raised out of ``backward()``
  anyway, and saved the step before the one its peers had finished).
* Nor is one the failing peer had finished, though this rank's backend has not said so
  yet (seen in CI under load: the failure of a peer that finished step 4 and raised at
  step 5 arrived while the survivor's gloo thread had still to hand back step 4's
  all-reduce, so the survivor saved step 4 and the restart trained it twice). Every
  future is numbered as it is added, the same sequence on every rank (DDP issues the
  same all-reduces everywhere); a rank posting its own failure says how many of its
  futures had a result (``finished``, in its record: ``FINISHED_KEY``), and a survivor
  leaves those futures to its backend for up to ``LATE_S`` before it fails them: the
  peer's data was sent. A lost peer's record (no count) fails them all at once.
* The same rules hold for a future registered after the failure came: the main thread
  can lose the CPU between issuing a collective and registering its future (seen once
  under two concurrent test runs: a survivor's all-reduce of step 4, registered after
  the notice of a peer that finished step 4, was failed at once, and step 4 was saved).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

FINISHED_KEY = "futures_finished"  # a failure record's detail: how many futures had a result on its rank
LATE_S = 1.0  # how long a future the failing peer had finished may take to come from this rank's backend


class _Pending(NamedTuple):
    number: int  # in the order futures were added: the same sequence on every rank
    deadline: float | None
    on_expiry: Callable[[], None] | None


class Failables:
    """The futures this rank's watchdog fails when a failure is delivered."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[torch.futures.Future[Any], _Pending] = {}
        self._rescues: dict[torch.futures.Future[Any], Callable[[], bool]] = {}
        self._failure: BaseException | None = None
        self._finished_by_peer = 0  # from the failure's record: futures its rank had results of
        self.issued = 0  # futures added so far
        self.finished = 0  # futures settled with a result

    def add(
        self,
        fut: torch.futures.Future[Any],
        deadline: float | None = None,
        on_expiry: Callable[[], None] | None = None,
        rescue: Callable[[], bool] | None = None,
    ) -> None:
        """Watch ``fut``; it fails at once if a failure is already known.

        ``on_expiry`` runs once, on the keeper thread (``expire_due``), if ``fut`` is still
        pending at ``deadline`` (monotonic seconds): it posts the timeout that fails it.
        ``rescue``, asked before a failure fails ``fut``, settles ``fut`` from the backend and
        returns True when the backend's work is already done.
        """
        with self._lock:
            number = self.issued
            self.issued += 1  # numbered even after a failure: the sequence stays every rank's
            failure = self._failure
            if failure is None:
                self._pending[fut] = _Pending(number, deadline, on_expiry)
                if rescue is not None:
                    self._rescues[fut] = rescue
                return
        # added after the failure came (the main thread lost the CPU between issuing the
        # collective and this call): the same rules as for one pending when it came
        self._fail([(fut, number, rescue)], failure)

    def expire_due(self, now: float) -> None:
        """Run the ``on_expiry`` of every pending future whose deadline has passed (once each)."""
        with self._lock:
            due = [
                (f, p.on_expiry)
                for f, p in self._pending.items()
                if p.deadline is not None and p.deadline <= now and p.on_expiry is not None
            ]
            for fut, _ in due:
                self._pending[fut] = self._pending[fut]._replace(deadline=None, on_expiry=None)
        for _, on_expiry in due:
            on_expiry()

    def settle(self, fut: torch.futures.Future[Any], result: Any = None, error: BaseException | None = None) -> None:
        """Complete ``fut`` with ``result`` or ``error``, unless it is completed already."""
        with self._lock:
            self._pending.pop(fut, None)
            self._rescues.pop(fut, None)
            if fut.done():
                return
            if error is not None:
                fut.set_exception(error)
            else:
                self.finished += 1
                fut.set_result(result)

    def fail_all(self, error: BaseException, finished_by_peer: int = 0) -> None:
        """Fail every pending future, and every future added from now on, with ``error``.

        The first ``finished_by_peer`` futures (the failing peer had their results) are
        left to the backend for up to ``LATE_S`` seconds, then failed, on a timer thread.
        """
        with self._lock:
            self._failure = error
            self._finished_by_peer = finished_by_peer
            pending, self._pending = self._pending, {}
            rescues, self._rescues = self._rescues, {}
        self._fail([(fut, entry.number, rescues.get(fut)) for fut, entry in pending.items()], error)

    def _fail(
        self,
        futures: list[tuple[torch.futures.Future[Any], int, Callable[[], bool] | None]],
        error: BaseException,
    ) -> None:
        """Fail each ``(future, number, rescue)``: not if ``rescue`` finds its work done, and
        only after ``LATE_S`` if the failing peer had its result."""
        late = []
        for fut, number, rescue in futures:
            if rescue is not None and rescue():
                continue
            if number < self._finished_by_peer:
                late.append(fut)
            else:
                self.settle(fut, error=error)
        if late:
            timer = threading.Timer(LATE_S, self._fail_late, (late, error))
            timer.daemon = True
            timer.start()

    def _fail_late(self, late: list[torch.futures.Future[Any]], error: BaseException) -> None:
        for fut in late:
            self.settle(fut, error=error)  # a no-op for each the backend settled meanwhile

    def __len__(self) -> int:
        with self._lock:
            return len(self._pending)
