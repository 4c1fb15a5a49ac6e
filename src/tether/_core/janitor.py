"""Deleting spent store keys off the main thread.

A store gate leaves two keys behind (``waits.gate``), deleted once every member is past
it so that a job's store does not grow with every sync. A deletion is a store round
trip (``delete_key`` waits for its answer, unlike ``set``), and the rank that completes a
gate made two of them before it returned. The janitor makes them on a thread of its own,
in the order they were handed over; the main thread only puts the keys on a queue.

It shares the keeper's store connection (``watchdog.py``) instead of opening one: every
connection a rank holds counts against the store's host, and each costs a start-up
round of its own. On torch 2.13 that includes reverse DNS lookups of the peer's address
(``::ffff:127.0.0.1`` on loopback, which ``/etc/hosts`` does not answer), on the client
and on the server; on this VM the resolver drops some queries, and about one connection
in 25 waited out its 5 s timeout (seen with ``strace``; a 4-rank ``tether.spawn`` job whose body
opened one more connection per rank took 5 s longer). A c10d client runs one operation
at a time (a mutex), so the keeper waits at most for one deletion.

Idle cost: a thread blocked on a Python queue. A deletion that fails (the store's host
gone or retiring) ends the thread and drops the rest: the keys belong to an incarnation
that is ending, and its prefix is never reused.
"""

from __future__ import annotations

import logging
import queue
import threading

from torch._C._distributed_c10d import Store

log = logging.getLogger("tether")


class Janitor:
    """Deletes the keys handed to ``discard``, on its own thread, with a client it is given."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[str, ...] | None] = queue.SimpleQueue()
        self._client: Store | None = None
        self.thread = threading.Thread(target=self._run, name="tether-janitor", daemon=True)

    def start(self, client: Store) -> None:
        """Start deleting, on ``client`` (shared: a c10d client runs one operation at a time)."""
        self._client = client
        self.thread.start()

    def discard(self, *keys: str) -> None:
        """Delete ``keys`` soon; returns at once. Keys already handed over are deleted first."""
        self._queue.put(keys)

    def stop(self) -> None:
        """The thread ends once the keys handed over before this call are deleted."""
        self._queue.put(None)

    def _run(self) -> None:
        assert self._client is not None
        try:
            while (keys := self._queue.get()) is not None:
                for key in keys:
                    self._client.delete_key(key)
        except Exception as exc:  # the store is going: nothing left to tidy
            log.debug("tether janitor: stopped deleting spent keys (%s)", exc)
        finally:
            self._client = None  # the keeper's: not kept alive by a stopped watchdog
