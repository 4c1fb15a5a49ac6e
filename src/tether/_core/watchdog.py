"""The per-process watchdog: it learns of failures at once and wakes the main thread.

Three daemon threads, each with its own store connection:

* **listener** blocks in ``queue_pop`` on this rank's inbox. On ``"fail"`` it reads the
  root cause, turns it into the exception this rank will raise, and *delivers* it: it
  wakes whatever tether wait the main thread is in (a ``threading.Event`` for a
  collective, an abort value written to the key of a store wait). On ``"ask:<qid>"`` it
  answers with the main thread's current tether call and Python stack. On ``"stop"`` it
  returns. Idle cost: one blocked connection, no CPU, no store operations.
* **heartbeat** adds 1 to ``hb/<rank>`` every ``interval`` seconds and reads its ring
  neighbour's counter; a neighbour silent for ``lost_after`` seconds (and not finalized)
  is posted as lost. Idle cost: 2 store operations per ``interval`` (default 2 s: 1 op/s).
* **ladder** (only after a failure) escalates when the main thread does not take the
  failure: if no tether call has raised it within ``grace / 2`` the process group is
  aborted where the backend can (NCCL); if none has within ``grace`` the root cause is
  printed and the process exits with the code of ``errors.ExitCode``.

No loop dies of an error in one iteration: errors are logged and the loop goes on,
except the store's connection closing, which means the store's host is gone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch.distributed as dist
from torch._C._distributed_c10d import Store

from ..errors import PeerLost, TetherError
from .channel import LEFT, Channel
from .record import KIND_LOST, FailureRecord, error_from_record

log = logging.getLogger("tether")

RULE = "=" * 72
ABORT = "abort"  # written to the key of a store wait to wake the main thread


@dataclass(frozen=True)
class WatchdogConfig:
    """Timings of the watchdog, in seconds.

    Args:
        heartbeat: interval between heartbeats.
        lost_after: a rank silent this long is declared lost (frozen or dead).
        grace: how long a failure may go untaken by the main thread before the process
            is ended. ``None`` never ends it.
        store_host: the rank hosting the store (-1: a launcher), named when it is lost.
    """

    heartbeat: float = 2.0
    lost_after: float = 6.0
    grace: float | None = 5.0
    store_host: int = -1


class Watchdog:
    """Watches the channel for one rank. The clock is injectable for tests."""

    def __init__(
        self,
        channel: Channel,
        config: WatchdogConfig,
        abort: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
        exit: Callable[[int], None] = os._exit,
    ) -> None:
        self.channel = channel
        self.config = config
        self._abort = abort
        self._clock = clock
        self._exit = exit
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._taken = threading.Event()  # the main thread raised the failure
        self.failure: TetherError | None = None
        self.noticed_at: float | None = None
        self._event: threading.Event | None = None
        self._key: str | None = None
        self.current_call = ""  # what the main thread is doing, for whereabouts
        self._main = threading.main_thread()
        self._threads = [
            threading.Thread(target=self._listen, name="tether-listener", daemon=True),
            threading.Thread(target=self._beat, name="tether-heartbeat", daemon=True),
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        """Stop the listener and the heartbeat (the ladder, once armed, stays)."""
        self._stop.set()
        with contextlib.suppress(Exception):  # the store is gone: the threads end on their own errors
            self.channel.notify([self.channel.rank], "stop")
        for t in self._threads:
            t.join(timeout=1.0)

    # --- the main thread's side -----------------------------------------------------

    def begin_wait(self, event: threading.Event | None = None, key: str | None = None) -> None:
        """Register the main thread's wait; raises at once if a failure is known."""
        with self._lock:
            if self.failure is not None:
                self._raise()
            self._event, self._key = event, key

    def end_wait(self) -> None:
        with self._lock:
            self._event = self._key = None

    def check(self) -> None:
        """Raise the known failure, if any (every tether call starts with this)."""
        if self.failure is not None:
            self._raise()

    def _raise(self) -> None:
        self._taken.set()
        assert self.failure is not None
        raise self.failure

    def taken(self, error: TetherError) -> TetherError:
        """Note that the main thread is about to raise ``error`` (the ladder stands down)."""
        self._taken.set()
        return error

    def wait_for_failure(self, within: float) -> TetherError | None:
        """Give the listener ``within`` seconds to deliver a failure; return it if it did."""
        deadline = self._clock() + within
        while self.failure is None and self._clock() < deadline:
            time.sleep(0.005)
        return self.failure

    # --- delivering a failure -----------------------------------------------------

    def deliver(self, error: TetherError, client: Store | None) -> None:
        """Make ``error`` this rank's failure and wake the main thread (first one wins)."""
        with self._lock:
            if self.failure is not None:
                return
            self.failure = error
            self.noticed_at = self._clock()
            event, key = self._event, self._key
        if event is not None:
            event.set()
        if key is not None and client is not None:
            try:
                client.compare_set(key, "", ABORT)
            except Exception:
                log.exception("tether: could not wake the main thread's store wait")
        threading.Thread(target=self._ladder, name="tether-ladder", daemon=True).start()

    def _on_fail(self, client: Store) -> None:
        root = self.channel.root_cause(client)
        if root is None or (root.rank == self.channel.rank and root.reporter == self.channel.rank):
            return  # nothing readable yet, or this rank's own failure
        self.deliver(error_from_record(root), client)

    def _store_lost(self, exc: BaseException) -> None:
        host = self.config.store_host
        who = f"rank {host} (store host)" if host >= 0 else "the launcher hosting the store"
        record = FailureRecord(
            rank=host,
            kind=KIND_LOST,
            exc_type="StoreLost",
            message=f"{who} lost: the store closed its connection ({exc})",
            reporter=self.channel.rank,
        )
        self.deliver(PeerLost(record), None)

    # --- threads --------------------------------------------------------------------

    def _listen(self) -> None:
        client = self.channel.listener_client()
        inbox = self.channel.key("inbox", self.channel.rank)
        while not self._stop.is_set():
            try:
                message = client.queue_pop(inbox).decode()
                if message == "stop":
                    return
                if message == "fail":
                    self._on_fail(client)
                elif message.startswith("ask:"):
                    self.channel.answer(client, int(message[4:]), self.whereabouts())
            except dist.DistNetworkError as exc:
                if not self._stop.is_set():
                    self._store_lost(exc)
                return
            except Exception:
                if self._stop.is_set():
                    return
                log.exception("tether listener: error handling a message; going on")
                self._stop.wait(0.1)

    def _beat(self) -> None:
        if self.config.heartbeat <= 0:
            return
        client = self.channel.listener_client()
        me = self.channel.key("hb", self.channel.rank)
        size = self.channel.world_size
        neighbour = (self.channel.rank + 1) % size
        theirs = self.channel.key("hb", neighbour)
        seen, since = -1, self._clock()
        while not self._stop.wait(self.config.heartbeat):
            try:
                client.add(me, 1)
                if size == 1 or self.failure is not None:
                    continue
                value = int(client.add(theirs, 0))
                now = self._clock()
                if value >= LEFT:
                    continue
                if value != seen:
                    seen, since = value, now
                elif now - since > self.config.lost_after:
                    self._post_lost(neighbour, now - since, client)
                    since = now
            except dist.DistNetworkError as exc:
                if not self._stop.is_set():
                    self._store_lost(exc)
                return
            except Exception:
                log.exception("tether heartbeat: error in one beat; going on")

    def _post_lost(self, rank: int, silent: float, client: Store) -> None:
        record = FailureRecord(
            rank=rank,
            kind=KIND_LOST,
            exc_type="Lost",
            message=f"no heartbeat for {silent:.1f} s: the process is frozen or dead",
            time=time.time(),
            reporter=self.channel.rank,
        )
        posted = self.channel.post(record)
        # the client wakes this rank's own store wait: the post notifies only the other ranks
        self.deliver(error_from_record(self.channel.root_cause() or posted), client)

    def _ladder(self) -> None:
        grace = self.config.grace
        if grace is None:
            return
        if self._taken.wait(grace / 2):
            return
        try:
            self._abort()
        except Exception:
            log.exception("tether: aborting the process group failed")
        if self._taken.wait(grace / 2):
            return
        assert self.failure is not None
        sys.stderr.write(render_notice(self.channel.rank, self.failure, self.whereabouts(), grace))
        sys.stderr.flush()
        self._exit(int(self.failure.exit_code))

    def whereabouts(self) -> str:
        """The main thread's current tether call and its innermost Python frames."""
        frame = sys._current_frames().get(self._main.ident or -1)
        stack = "".join(traceback.format_stack(frame, limit=6)) if frame is not None else ""
        return f"in {self.current_call or 'user code'}\n{stack}".rstrip()


def render_notice(rank: int, failure: TetherError, whereabouts: str, grace: float) -> str:
    """What the watchdog prints before ending a rank whose main thread never took the failure."""
    return (
        f"{RULE}\ntether: rank {rank}: {failure}\n"
        f"  the main thread did not return to tether within {grace:g} s; it was {whereabouts}\n"
        f"  ending this process with exit code {int(failure.exit_code)}\n{RULE}\n"
    )
