"""Futures tether can fail: how a wait that is not tether's own (DDP's reducer) is woken.

DDP's reducer waits on the future its communication hook returns, in C++; nothing else
can wake it. tether's hook (``tether/ddp.py``) returns a future of its own making,
chained to the backend's, and registers it here; when a failure is delivered to this
rank, the watchdog fails every registered future with it, and the reducer's ``value()``
raises out of ``backward()`` within the notice time of any tether wait.

Facts measured on torch 2.13 (gloo) that shape it:

* ``Future.set_exception`` on the future handed to the reducer is not seen as an error
  by C++ ("Unable to cast ... to Tensor"). The hook hands over ``parent.then(value)``
  instead, and tether fails ``parent``: the callback's ``value()`` raises, and C++ marks
  the child failed with that error.
* A future completed twice raises "can only be marked completed once". The backend's
  completion and tether's failure can race, so every completion goes through ``settle``,
  under one lock, first one wins.
* A collective the backend finished before the failure arrived is not failed: a future
  registered with ``rescue`` is settled from the backend when ``rescue`` finds it done
  (seen in CI: a survivor whose all-reduce had completed raised out of ``backward()``
  anyway, and saved the step before the one its peers had finished).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch


class Failables:
    """The futures this rank's watchdog fails when a failure is delivered."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # future -> (deadline, on_expiry)
        self._pending: dict[torch.futures.Future[Any], tuple[float | None, Callable[[], None] | None]] = {}
        self._rescues: dict[torch.futures.Future[Any], Callable[[], bool]] = {}
        self._failure: BaseException | None = None

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
            failure = self._failure
            if failure is None:
                self._pending[fut] = (deadline, on_expiry)
                if rescue is not None:
                    self._rescues[fut] = rescue
        if failure is not None:
            self.settle(fut, error=failure)

    def expire_due(self, now: float) -> None:
        """Run the ``on_expiry`` of every pending future whose deadline has passed (once each)."""
        with self._lock:
            due = [(f, cb) for f, (d, cb) in self._pending.items() if d is not None and d <= now and cb is not None]
            for fut, _ in due:
                self._pending[fut] = (None, None)
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
                fut.set_result(result)

    def fail_all(self, error: BaseException) -> None:
        """Fail every pending future, and every future added from now on, with ``error``."""
        with self._lock:
            self._failure = error
            pending, self._pending = list(self._pending), {}
            rescues, self._rescues = self._rescues, {}
        for fut in pending:
            rescue = rescues.get(fut)
            if rescue is None or not rescue():
                self.settle(fut, error=error)

    def __len__(self) -> int:
        with self._lock:
            return len(self._pending)
