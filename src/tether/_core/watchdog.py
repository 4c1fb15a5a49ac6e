"""The per-process watchdog: it learns of failures at once and wakes the main thread.

Three daemon threads (four on a rank that does not host the store), two store
connections (three with the store watch's ping), plus one more thread once a failure is
known:

* **listener** blocks in ``queue_pop`` on this rank's inbox (no timeout: a timed-out c10d
  wait logs a warning). On ``"fail"`` it reads the root cause, turns it into the exception
  this rank will raise, and *delivers* it: it wakes whatever tether wait the main thread
  is in (a ``threading.Event`` for a collective, an abort value written to the key of a
  store wait). On ``"ask:<qid>"`` it answers with the main thread's current tether call
  and Python stack; on ``"retire"`` (the store's host is retiring its group) it stops
  without taking the coming connection loss for a failure; on ``"stop"`` it returns.
  Idle cost: one blocked connection, no CPU, no store operations. On a store without
  queues it polls the failure counter every ``period`` instead (one warning says so).
* **keeper** wakes every 0.5 s while it judges liveness (1 s otherwise) and when a signal arrives (it reads the
  interpreter's wakeup fd, which the C-level signal handler writes without the GIL): it
  wakes a main thread blocked in a store wait so that the Python handler can run
  (SIGINT/SIGTERM are honoured within one store round trip), expires and reports stalls
  of store waits at their deadlines, and judges liveness (``liveness.py``): the other
  ranks of this host from /proc, other nodes from their heartbeats. Idle cost: a few
  /proc reads per period; store operations only with more than one node (2 per node per
  ``heartbeat``).
* **janitor** (``janitor.py``, on the keeper's connection) deletes the keys of spent store
  gates, handed to it by the main thread, so that a sync does not wait for those round
  trips. Idle cost: a thread blocked on a Python queue.
* **store watch** (on every rank that does not host the store) never makes a store
  operation: a store host that is stopped blocks every one, the keeper's with them. On a
  rank that shares a host with a rank hosting the store (rank 0 under plain ``env://``)
  it reads that rank's process state from /proc every 0.5 s (``StoreHostWatch``); on
  every such rank it asks the store's server to answer, a PING on a socket of its own
  (``StoreAnswerWatch``), and a store silent too long is lost (``liveness.py``). Idle
  cost: one /proc read and one ping round trip per period.
* **ladder** (only after a failure) escalates when the main thread does not take the
  failure: after ``grace / 2`` it aborts the process group on a thread of its own (NCCL's
  abort can hang: it never holds the exit), after ``grace`` it prints the root cause and
  exits with ``ExitCode.WATCHDOG`` (6). The last rung needs no GIL: when the ladder is
  armed, ``faulthandler`` is set to dump every thread's stack at ``grace + 0.5`` s and
  SIGALRM (left at its default action) to end the process at ``grace + 1`` s, so a main
  thread that holds the GIL forever is still ended (exit status 142, "killed by SIGALRM").
  ``disarm`` (a tether call raised the failure, or ``finalize``) cancels all three.

No loop dies of an error in one iteration: errors are logged and the loop goes on, except
the store's connection closing, which means the store's host is gone -- unless this rank
was told the group is retiring, or its own group is already gone.

**Stopping.** ``stop`` joins the threads for up to 1 s. On a loaded machine a thread can
still be waiting for the CPU inside a store call then (CI, 2 cores: the listener, woken by
its ``"stop"``, not yet scheduled). Such a thread of a watchdog that saw no failure is kept
in ``_lingering``, and ``join_lingering`` (at exit, before Python's teardown) waits for it:
a daemon thread that comes out of a torch call while the interpreter is being torn down
is ended with ``pthread_exit`` as it takes the GIL back, which aborts the process through
pybind11's GIL guard ("terminate called without an active exception", SIGABRT). The
window opens whenever the main thread lets go of the GIL during teardown, as torch's
destructors of process groups and stores do (a DDP model keeps its group until then).
Seen once in CI, on the happy path of a resumed job; a watchdog that saw a failure is
not waited for (its threads may be stuck on the dead job, and an owned process ends
without teardown).
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch.distributed as dist
from torch._C._distributed_c10d import Store

from ..errors import ExitCode, PeerLost, SyncTimeout, TetherError
from .channel import ROOT_WAIT, Channel
from .futures import FINISHED_KEY, Failables
from .hooks import end_process, ends_a_wait
from .janitor import Janitor
from .liveness import NodeWatch, PeerJudge, StoreAnswerWatch, StoreHostWatch
from .nccl import abort_in_background
from .record import FailureRecord, error_from_record, first_line, format_stack, lost_record

log = logging.getLogger("tether")

RULE = "=" * 72
ABORT = "abort"  # written to the key of a store wait to wake the main thread
# written there instead for a stop whose handler may return (the user's): the waiters
# poll past it until the last member writes "ok" over it (``waits.wait_key``); "abort"
# would end every member's wait
SIGNALLED = "signalled"
_STOPS = (signal.SIGINT, signal.SIGTERM)  # the signals a store wait is woken for
EXPIRED = "expired"  # written by the keeper when a store wait reaches its timeout
PERIOD = 0.2  # a polled channel's period, and the listener's pause after an error
JUDGE_PERIOD = 0.5  # the keeper's period while it judges the host's other ranks
IDLE_PERIOD = 1.0  # ... and while it only waits for signals and its wait's deadlines
STOP_JOIN = 1.0  # seconds ``stop`` waits for each thread
UNHEEDED_STOP = 1.0  # seconds a stop may wait for the main thread in ``stops_end_process`` before it ends it

# threads of watchdogs stopped without a failure that had not ended within STOP_JOIN
_lingering: list[threading.Thread] = []


@dataclass(frozen=True)
class WatchdogConfig:
    """Timings of the watchdog, in seconds.

    Args:
        heartbeat: interval between node heartbeats (used with more than one node).
        lost_after: a process stopped this long, or a node silent this long, is lost.
        grace: how long a failure may go untaken by the main thread before the process
            is ended. ``None`` never ends it (interactive interpreters).
        store_host: the rank hosting the store (-1: a launcher), named when it is lost.
    """

    heartbeat: float = 2.0
    lost_after: float = 6.0
    grace: float | None = 5.0
    store_host: int = -1


@dataclass
class _Wait:
    """The main thread's current wait, as the watchdog's threads see it."""

    event: threading.Event | None = None
    key: str | None = None
    deadline: float | None = None  # monotonic: write EXPIRED to ``key`` then
    stall_at: float | None = None  # monotonic: call ``on_stall`` then (once)
    on_stall: Callable[[], None] | None = None
    check_at: float | None = None  # monotonic: call ``check`` then, and every period after
    check: Callable[[Store], None] | None = None  # a finished peer? (``verdicts.left_behind``)
    # wakes a wait on a store of the user's (``storewaits.py``), given ABORT or EXPIRED; only
    # for a known failure or the deadline: a stop's handler may return, and the wait go on
    wake: Callable[[str], None] | None = None


class Watchdog:
    """Watches the channel for one rank. The clock and the exit are injectable for tests."""

    def __init__(
        self,
        channel: Channel,
        config: WatchdogConfig,
        *,
        judge: PeerJudge | None = None,
        nodes: NodeWatch | None = None,
        store_watch: StoreHostWatch | None = None,
        store_answers: StoreAnswerWatch | None = None,
        abort: Callable[[], None] = lambda: None,
        group_gone: Callable[[], bool] = lambda: False,
        clock: Callable[[], float] = time.monotonic,
        exit: Callable[[int], None] = end_process,
        on_blamed: Callable[[FailureRecord], None] = lambda record: None,
    ) -> None:
        self.channel = channel
        self._on_blamed = on_blamed
        self.config = config
        self.judge = judge
        self.nodes = nodes
        self.store_watch = store_watch
        self.store_answers = store_answers
        self._abort = abort
        self._group_gone = group_gone
        self._clock = clock
        self._exit = exit
        self._lock = threading.RLock()  # _raise disarms while begin_wait holds it
        self._stop = threading.Event()
        self._retiring = threading.Event()
        self._taken = threading.Event()  # the main thread raised the failure, or finalize disarmed
        self._armed = False
        self.failure: TetherError | None = None
        self.store_closed = threading.Event()  # a thread's connection found the store gone
        self.failables = Failables()  # futures a failure fails (DDP's guard: tether/ddp.py)
        self._wait = _Wait()
        self._stops_end = False  # see ``stops_end_process``
        self._stop_due: tuple[float, int] | None = None  # (when, signal) the keeper ends an unheeded stop
        self._call = ("", 0.0)  # what the main thread is doing, for whereabouts, and since when
        # in a raw collective: its group's ranks, worked out when asked, and the exception
        # the main thread was handling as it entered (``rawcalls._outside``, ``crossed.py``)
        self.raw_members: Callable[[], Sequence[int] | None] | None = None
        self.raw_handling: BaseException | None = None
        self._main = threading.main_thread()
        self._sig_r, self.signal_fd = os.pipe()  # the write end goes to signal.set_wakeup_fd
        os.set_blocking(self._sig_r, False)
        os.set_blocking(self.signal_fd, False)
        # a signal wakes the keeper at once; a deadline is seen within one period of its wait's start
        self._period = JUDGE_PERIOD if judge is not None or nodes is not None else IDLE_PERIOD
        self.janitor = Janitor()  # deletes spent keys (store gates') off the main thread
        self._threads: list[threading.Thread] = []  # made by ``start``

    def start(self) -> None:
        """Open the threads' store connections, on the calling thread, then start the threads.

        A connection is opened here, while the store is known to answer, not by the thread
        that uses it: a thread kept from the CPU (CI, 2 cores, three jobs at a time) began
        its connect after ``finalize`` had closed the store's host, and c10d's connect
        retries until the timeout of the connection it clones (``channel.FOREVER``), past
        the exit's wait for stopped threads ("Stopping" above): the warning, and the abort
        it warns of. Here it costs the caller two connects, 0.35 ms each on loopback
        (median of 200).
        """
        listening, keeping = self.channel.client(), self.channel.client()
        self._threads = [
            threading.Thread(target=self._listen, args=(listening,), name="tether-listener", daemon=True),
            threading.Thread(target=self._keep, args=(keeping,), name="tether-keeper", daemon=True),
            self.janitor.thread,
        ]
        if self.store_watch is not None or self.store_answers is not None:
            self._threads.append(threading.Thread(target=self._watch_store_host, name="tether-storewatch", daemon=True))
        self.janitor.start(keeping)  # it shares the keeper's connection (janitor.py)
        for t in self._threads:
            if t is not self.janitor.thread:
                t.start()

    def stop(self, announce: bool = False) -> None:
        """Stop the threads and disarm the ladder; ``announce`` tells every rank this group retires.

        Bounded: about ``STOP_JOIN`` at worst (threads are joined with a timeout; one
        still running is left to ``join_lingering``). A second call does nothing. The
        signal pipe stays open until ``close``.
        """
        if self._stop.is_set():
            return
        self.disarm()
        self._retiring.set()
        with contextlib.suppress(Exception):  # the store may be gone: the threads end on their errors
            others = [r for r in range(self.channel.world_size) if r != self.channel.rank] if announce else []
            self.channel.notify(others, "retire")
            self.channel.notify([self.channel.rank], "stop")
        self.janitor.stop()
        if self.nodes is not None:
            self.nodes.close()
        self._stop.set()
        with contextlib.suppress(OSError):
            os.write(self.signal_fd, b"\0")  # wakes the keeper's select
        threads = [t for t in self._threads if t is not threading.current_thread()]
        for t in threads:
            if t.is_alive():
                t.join(timeout=STOP_JOIN)
        _lingering[:] = [t for t in _lingering if t.is_alive()]  # (a long-lived process: rounds of initialize)
        if self.failure is None:
            _lingering.extend(t for t in threads if t.is_alive())

    def close(self) -> None:
        """Close the keeper's signal pipe, once ``stop`` ran and the hooks no longer point the
        interpreter's wakeup fd at it (``Hooks.uninstall``).

        Closed in ``stop``, before the hooks came off, a signal in between (a launcher's
        SIGTERM, a preemption notice's SIGUSR1) had its number written to a closed fd, or
        into whatever file had just taken that fd's number (``jobs/signal_in_retire.py``).
        """
        for fd in (self._sig_r, self.signal_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        if self.store_answers is not None:  # its copy of the store connection, if no leave took it
            self.store_answers.drop_copy()

    # --- the main thread's side -----------------------------------------------------

    def begin_wait(
        self,
        event: threading.Event | None = None,
        key: str | None = None,
        deadline: float | None = None,
        stall_at: float | None = None,
        on_stall: Callable[[], None] | None = None,
        check_at: float | None = None,
        check: Callable[[Store], None] | None = None,
        wake: Callable[[str], None] | None = None,
    ) -> None:
        """Register the main thread's wait; raises at once if a failure is known."""
        with self._lock:
            if self.failure is not None:
                self._raise()
            self._wait = _Wait(event, key, deadline, stall_at, on_stall, check_at, check, wake)
        if deadline is not None and (key is not None or wake is not None):
            with contextlib.suppress(OSError):
                os.write(self.signal_fd, b"\0")  # the keeper sleeps up to a period: let it see the deadline

    def end_wait(self) -> None:
        with self._lock:
            self._wait = _Wait()

    @contextlib.contextmanager
    def stops_end_process(self) -> Iterator[None]:
        """In this block, a stop (SIGTERM, SIGINT) that tether's handler would take and that the
        main thread has not taken within ``UNHEEDED_STOP`` ends the process from the keeper.

        For the group's creation, in an owned process: a wait in C++ that no handler runs
        in and no wake reaches, on peers that may never come (a straggler stopped before it
        reached ``initialize``), until the store's timeout. A peer's failure behind the stop
        (a launcher stops every rank once one ended) goes to the ladder, which tells it;
        without one the process ends with ``128 + signal``, as the signal's default action
        ended it before tether's handler was installed before the creation (``Hooks.install_signals``).
        """
        self._stops_end = True
        try:
            yield
        finally:
            self._stops_end = False
            self._stop_due = None

    def _end_unheeded_stop(self, signum: int, client: Store) -> None:
        if self.failure is None:
            self._on_fail(client)  # a peer's posted failure: delivered, the ladder ends the wait
        if self.failure is None:
            self._exit(128 + signum)

    def check(self) -> None:
        """Raise the known failure, if any (every tether call starts with this)."""
        if self.failure is not None:
            self._raise()

    def _raise(self) -> None:
        assert self.failure is not None
        self.disarm()
        raise self.failure

    def taken(self, error: TetherError) -> TetherError:
        """Note that the main thread is about to raise ``error`` (the ladder stands down)."""
        self.disarm()
        return error

    def disarm(self) -> None:
        """Stand the ladder down, its GIL-free rungs included."""
        self._taken.set()
        with self._lock:
            armed, self._armed = self._armed, False
        if armed:
            faulthandler.cancel_dump_traceback_later()
            with contextlib.suppress(ValueError):
                signal.setitimer(signal.ITIMER_REAL, 0)

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
            if self.failure is not None or self._stop.is_set():
                return
            self.failure = error
            wait = self._wait
        self._wake(wait, ABORT, client)
        posted: FailureRecord | None = getattr(error, "record", None)
        self.failables.fail_all(error, posted.detail.get(FINISHED_KEY, 0) if posted is not None else 0)
        record = error.record if isinstance(error, SyncTimeout) else None
        if record is not None and record.rank == self.channel.rank != record.reporter:
            self._on_blamed(record)  # another rank's timeout names this one as the rank that stalled
        if self.config.grace is not None and not self._taken.is_set():
            self._arm(self.config.grace)
            threading.Thread(target=self._ladder, name="tether-ladder", daemon=True).start()

    def _wake(self, wait: _Wait, value: str, client: Store | None, event: bool = True) -> None:
        if wait.event is not None and event:
            wait.event.set()
        if wait.key is not None and client is not None:
            try:
                client.compare_set(wait.key, "", value)
            except Exception:
                log.exception("tether: could not wake the main thread's store wait")
        if wait.wake is not None and (value == EXPIRED or (value == ABORT and self.failure is not None)):
            wait.wake(value)

    def post_and_deliver(self, records: list[FailureRecord], client: Store) -> None:
        """Post ``records`` (losses found by a judge) and deliver the root cause."""
        for record in records:
            posted = self.channel.post(record)
            root = self.channel.root_cause(client) or posted
            # the client wakes this rank's own store wait: a post notifies only the others
            self.deliver(error_from_record(root), client)

    def sweep(self) -> TetherError | None:
        """Judge this host's ranks now, on the caller's thread; the failure found, if any."""
        if self.judge is not None:
            client = self.channel.connection
            self.post_and_deliver(self.judge.check(client, now=True), client)
            if self.judge.lost and self.failure is None:  # another judge won the claim: its post is coming
                self.wait_for_failure(ROOT_WAIT)
        return self.failure

    def _on_fail(self, client: Store) -> None:
        root = self.channel.root_cause(client)
        if root is None or (root.rank == self.channel.rank and root.reporter == self.channel.rank):
            return  # nothing readable yet, or this rank's own failure
        self.deliver(error_from_record(root), client)

    def store_lost(self, exc: BaseException) -> TetherError:
        """The store's host vanished: that is this rank's failure (unless one is known)."""
        frozen = self.store_watch.seen_frozen() if self.store_watch is not None else None
        if frozen is None and self.store_answers is not None:
            frozen = self.store_answers.seen_silent()  # this rank cut its connections (liveness.py)
        if frozen is not None:  # its process was seen stopped: closed by a rank that ended it (liveness.py)
            self.deliver(PeerLost(frozen), None)
            return self.failure or PeerLost(frozen)
        host = self.config.store_host
        who = f"rank {host} (store host)" if host >= 0 else "the launcher hosting the store"
        cause = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        record = lost_record(
            host, f"{who} lost: the store closed its connection ({cause})", self.channel.rank, exc_type="StoreLost"
        )
        self.deliver(PeerLost(record), None)
        return self.failure or PeerLost(record)

    @property
    def store_going(self) -> bool:
        """The store is gone (a thread's connection found it closed), or its host said it is going."""
        return self.store_closed.is_set() or self._retiring.is_set()

    def _quiet_loss(self) -> bool:
        """A lost connection that is no failure: this context is stopping, or its group is gone."""
        return self._stop.is_set() or self._retiring.is_set() or self._group_gone()

    def _ends_thread(self, exc: Exception, what: str) -> bool:
        """Whether an error in a store thread's loop ends the thread.

        A lost connection does (the store is gone: a failure, unless the loss is quiet), and
        so does any error once the loss is quiet; another is logged and the loop goes on.
        Called in the ``except`` block, so that the log shows the traceback.
        """
        if isinstance(exc, dist.DistNetworkError):
            self.store_closed.set()
            if not self._quiet_loss():
                self.store_lost(exc)
            return True
        if self._quiet_loss():
            return True
        log.exception("tether %s; going on", what)
        return False

    # --- threads --------------------------------------------------------------------

    def _listen(self, client: Store) -> None:
        inbox = self.channel.key("inbox", self.channel.rank)
        while not self._stop.is_set():
            try:
                if not self.channel.queues:
                    if self._stop.wait(PERIOD):
                        return
                    if self.channel.failure_count(client):
                        self._on_fail(client)
                    continue
                message = client.queue_pop(inbox).decode()
                if message in ("stop", "retire"):
                    self._retiring.set()
                    return
                if message == "fail":
                    self._on_fail(client)
                elif message.startswith("ask:"):
                    self.channel.answer(client, int(message[4:]), *self.timed_whereabouts(), *self._raw_detail())
            except Exception as exc:
                if self._ends_thread(exc, "listener: error handling a message"):
                    return
                self._stop.wait(0.1)

    def _keep(self, client: Store) -> None:
        next_beat = self._clock()
        while not self._stop.is_set() and not self._retiring.is_set():  # retiring: the store is going
            try:
                with self._lock:
                    wait = self._wait
                now = self._clock()
                stop_at = self._stop_due[0] if self._stop_due is not None else None
                marks = [m for m in (wait.deadline, wait.stall_at, wait.check_at, stop_at) if m is not None]
                timeout = max(0.0, min([self._period, *(m - now for m in marks)]))
                readable, _, _ = select.select([self._sig_r], [], [], timeout)
                if self._stop.is_set():
                    return
                with self._lock:
                    wait = self._wait  # the wait now: it may have begun while this thread slept
                # SIGINT/SIGTERM only: another signal's handler (a profiler's SIGPROF, an
                # alarm) runs when the wait ends, as after any blocking call
                stops = [s for s in os.read(self._sig_r, 64) if s in _STOPS] if readable else []
                if stops:
                    # a signal: let the main thread's handler run. A launcher's SIGTERM may
                    # follow a peer that left before this wait's sync (it exited non-zero
                    # after its clean leave: ``sys.exit(2)``): its story is told first
                    if wait.check is not None and self.failure is None:
                        with contextlib.suppress(Exception):  # the wake below must come
                            wait.check(client)
                    # only a store wait needs a wake: a wait on an event (a lock) runs the
                    # handler itself, and goes on when it returns
                    ends = any(ends_a_wait(s) for s in stops)
                    self._wake(wait, ABORT if ends else SIGNALLED, client, event=False)
                    if ends and self._stops_end and self._stop_due is None:
                        self._stop_due = (self._clock() + UNHEEDED_STOP, stops[0])
                now = self._clock()
                due = self._stop_due
                if due is not None and now >= due[0]:
                    self._stop_due = None
                    if self._stops_end:
                        self._end_unheeded_stop(due[1], client)
                if wait.deadline is not None and now >= wait.deadline:
                    self._wake(wait, EXPIRED, client)
                    with self._lock:
                        if self._wait is wait:
                            wait.deadline = None
                if wait.stall_at is not None and now >= wait.stall_at and wait.on_stall is not None:
                    wait.stall_at = None
                    wait.on_stall()
                if wait.check_at is not None and now >= wait.check_at and wait.check is not None:
                    wait.check_at = now + self._period
                    if self.failure is None:
                        wait.check(client)
                if self.failure is None:
                    self.failables.expire_due(now)
                if self.failure is None and self.judge is not None:
                    self.post_and_deliver(self.judge.check(client), client)
                if self.failure is None and self.nodes is not None and now >= next_beat:
                    next_beat = now + self.config.heartbeat
                    self.post_and_deliver(self.nodes.check(client), client)
            except Exception as exc:
                if self._ends_thread(exc, "keeper: error in one cycle"):
                    return
                self._stop.wait(PERIOD)

    def _watch_store_host(self) -> None:
        """The store watch's thread: no store operation, ever (``StoreHostWatch``,
        ``StoreAnswerWatch``)."""
        try:
            while not self._stop.wait(JUDGE_PERIOD) and not self._retiring.is_set():
                try:
                    record = self.store_watch.check() if self.store_watch is not None else None
                    if record is None and self.store_answers is not None:
                        record = self.store_answers.check()
                except Exception:
                    log.exception("tether store watch: error in one look; going on")
                    continue
                if record is not None:
                    # no client: waking a store wait would itself wait on the frozen store; the
                    # process was killed, or this rank's connections to it cut, which wakes such waits
                    self.deliver(PeerLost(record), None)
                    return
        finally:
            if self.store_answers is not None:
                self.store_answers.close()

    # --- the ladder -------------------------------------------------------------------

    def _arm(self, grace: float) -> None:
        """The rungs that need no GIL: a stack dump, then SIGALRM's default action."""
        with self._lock:
            self._armed = True
        faulthandler.dump_traceback_later(grace + 0.5, exit=False)
        if signal.getsignal(signal.SIGALRM) == signal.SIG_DFL:
            with contextlib.suppress(ValueError):
                signal.setitimer(signal.ITIMER_REAL, grace + 1.0)

    def _ladder(self) -> None:
        grace = self.config.grace
        assert grace is not None
        if self._taken.wait(grace / 2):
            return
        abort_in_background(self._abort, None)  # never waited on: the exit below keeps its own timer
        if self._taken.wait(grace / 2):
            return
        assert self.failure is not None
        sys.stderr.write(render_notice(self.channel.rank, self.failure, self.whereabouts(), grace))
        sys.stderr.flush()
        self._exit(int(ExitCode.WATCHDOG))

    @property
    def current_call(self) -> str:
        """What the main thread is doing, for whereabouts (``""``: user code)."""
        return self._call[0]

    @current_call.setter
    def current_call(self, call: str) -> None:
        self._call = (call, self._clock())

    @property
    def call_state(self) -> tuple[str, float]:
        """``current_call`` and when it began: what a nested call saves and restores."""
        return self._call

    @call_state.setter
    def call_state(self, state: tuple[str, float]) -> None:
        self._call = state

    def in_call_for(self) -> float | None:
        """Seconds the main thread has been in its current call; None in user code."""
        call, since = self._call
        return self._clock() - since if call else None

    def _raw_detail(self) -> tuple[Sequence[int] | None, str]:
        """The raw collective's group ranks and the exception it entered with (``crossed.py``)."""
        members, handling = self.raw_members, self.raw_handling
        try:
            ranks = members() if members is not None else None
        except Exception:  # a group torch no longer knows: the call is ending
            ranks = None
        return ranks, first_line(handling)[:300] if handling is not None else ""

    def whereabouts(self) -> str:
        """The main thread's current tether call and its innermost Python frames."""
        return self.timed_whereabouts()[0]

    def timed_whereabouts(self) -> tuple[str, float | None]:
        """``whereabouts``, and how many seconds the main thread has been in that call (None:
        in user code). A timeout's verdict tells by it which rank came last (``verdicts.expire``)."""
        call, since = self._call
        frame = sys._current_frames().get(self._main.ident or -1)
        stack = format_stack(frame, in_tether=bool(call)) if frame is not None else ""
        return f"in {call or 'user code'}\n{stack}".rstrip(), (self._clock() - since if call else None)


def render_notice(rank: int, failure: TetherError, whereabouts: str, grace: float) -> str:
    """What the watchdog prints before ending a rank whose main thread never took the failure.

    A timeout this rank caused already shows where it stalled; the same frames again
    (the usual case: still there) are left out.
    """
    text = str(failure)
    place, _, stack = whereabouts.partition("\n")
    if stack and stack in text:
        whereabouts = f"{place}, still where the error shows it"
    return (
        f"{RULE}\ntether: rank {rank}: {text}\n"
        f"  the main thread did not return to tether within {grace:g} s; it was {whereabouts}\n"
        f"  ending this process with exit code {int(ExitCode.WATCHDOG)}\n{RULE}\n"
    )


def join_lingering(within: float) -> list[str]:
    """Wait up to ``within`` seconds for the threads stopped watchdogs left running.

    Returns the names of those still running (then empty). Called at exit, before
    Python's teardown (see "Stopping" above).
    """
    deadline = time.monotonic() + within
    while _lingering:
        _lingering[0].join(timeout=max(0.0, deadline - time.monotonic()))
        if _lingering[0].is_alive():
            break
        _lingering.pop(0)
    return [t.name for t in _lingering if t.is_alive()]
