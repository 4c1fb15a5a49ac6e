"""Failures outside tether calls: uncaught exceptions (any thread), SIGTERM and SIGINT.

``install`` chains onto whatever hooks and handlers are there and ``uninstall`` puts them
back; a handler the user installed for SIGTERM/SIGINT is left alone.

* **Uncaught exceptions** are posted (``on_failure``), then the previous hook prints them.
  In a process that tether or a launcher owns (a ``tether.spawn`` worker, torchrun,
  srun) the process then ends at once with the code of ``errors.ExitCode``: Python would
  next wait for non-daemon threads (forever, if one is stuck on the dead job) and tear
  torch down, where abandoned gloo work can abort the process. Anywhere else -- ``python
  -i``, a notebook kernel, a plain script -- the interpreter goes on as it would have.
* **Signals**: the handler only records the signal and raises (``KeyboardInterrupt`` for
  SIGINT, ``Terminated`` for SIGTERM): no store I/O, no lock, nothing the interrupted code
  may hold. The interpreter's wakeup fd is pointed at the watchdog's keeper, which wakes
  a main thread blocked in a store wait so that the handler runs within a round trip.
  What the signal means (a launcher's stop because a peer died?) is worked out after the
  exception has unwound, by ``failures.report_failure``.
* **Ending.** Once an owned process's excepthook has started to end it, its exit code is
  decided: a SIGTERM or SIGINT then ends it at once *with that code* (after the failure
  is posted), not as a signal. torchrun SIGTERMs every worker 0.1 s after the first one
  exits; a victim still in the user's ``atexit`` functions (a logger's flush) would
  otherwise show as ``-15`` in torchrun's summary instead of ``PEER_FAILED``.
* **A stop behind a known failure.** torchrun SIGTERMs the survivors 0.1 s after a worker
  exits. A survivor whose main thread is then in a raw call (DDP's backward) with its
  peer's failure already known lets the call finish: the watchdog has failed every wait
  of it that the failure makes vain (or left it the backend's, for the work the failing
  peer had finished: ``futures.py``), and tether raises that failure at its next call.
  So in an owned process the handler only notes such a SIGTERM (``defer_stop``), as it
  would while the failure is posted; raised as the backward returned, it had cut the
  step before ``optimizer.step()``, and the emergency checkpoint was a step short (seen in
  a default run under load; ``tests/test_resume.py``, ``result-after-sigterm``). The
  ladder still ends the process within ``grace`` if nothing raises the failure.
* **Retiring.** ``finalize`` after a failure holds SIGTERM while it retires the context,
  and from then on a SIGTERM ends an owned process with the failure's code
  (``ending_on_stop``).
* **Children.** A process that tether ends (``end_process``) first terminates its
  daemonic ``multiprocessing`` children, a DataLoader's workers, as Python's exit would,
  and the other processes it started, as torchrun ends a worker's process group
  (``descendants.py``; a ladder rung that needs no GIL ends the rank alone).
  A process forked from a rank (those workers) drops these hooks at the fork
  (``_drop_in_forked_child``): it is not the rank.
* **Posting.** A failure posted on the main thread before it reaches the excepthook (a
  ``finally: finalize()``, ``Parallel.run``) holds SIGTERM and SIGINT while it is posted
  (``posting``): a launcher's stop that lands in the post's store round trips raised
  ``Terminated`` there, over the failure, and the rank ended with exit 143 and no error
  file -- torchrun then named it the root cause (seen in CI, 4 ranks, a mismatch). A stop
  that came meanwhile ends an owned process right after the post, with the failure's code.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType, TracebackType
from typing import Any

from ..errors import ExitCode, PeerFinished, TetherError
from . import descendants
from .beater import process_state
from .liveness import pid_namespace
from .record import first_line

_ending = threading.Event()  # an owned process's excepthook runs the exit functions, then ``os._exit``
_installed: list[Hooks] = []  # the hooks in place in this process (for a forked child to drop)
_fork_watched = False


def _drop_in_forked_child() -> None:
    """A process forked from a rank (a DataLoader's worker) is not the rank: Python's hooks.

    It inherited tether's signal handlers, excepthooks and the keeper's wakeup fd. A
    SIGTERM (``end_process`` ends such children with one) could be deferred there as in
    the rank, a Ctrl-C showed tether's handler in every worker's traceback, and an
    exception reaching a thread's hook there would be posted through a store connection
    the child shares with its parent. The context itself stays: ``get_rank()`` in a
    dataset's code answers as in the rank, as with ignite.
    """
    for hooks in _installed:
        with contextlib.suppress(Exception):
            hooks.uninstall()
    _installed.clear()


def ending_without_teardown() -> bool:
    """Whether the exit functions now running are the excepthook's, before ``os._exit``.

    No Python teardown follows them, so what an exit function guards against it (a
    backend's thread or one of tether's caught by the teardown: ``ending._at_exit``) has
    nothing to guard, and waiting for those threads only delays the end.
    """
    return _ending.is_set()


class Terminated(SystemExit):
    """SIGTERM arrived; the process stops with exit code 128 + signal."""

    def __str__(self) -> str:
        return f"stopped by {signal.Signals(int(str(self.code)) - 128).name}"


@contextlib.contextmanager
def holding(signals: list[signal.Signals]) -> Iterator[list[int]]:
    """Hold ``signals`` in this block: their handlers only note them; yields those that came
    (they are not raised again: see ``Deferred``, whose swap this is)."""
    held = Deferred(signals)
    held.start()
    came = held.came
    try:
        yield came
    finally:
        held.end(raise_again=False)


def child_deaths() -> list[signal.Signals]:
    """SIGCHLD, where a Python handler takes it: a DataLoader's (torch's), which raises a
    RuntimeError in the main thread when one of its workers dies. A stop sent to the job's
    whole process group (``scancel``, torchrun's) ends those workers too, and that error cut
    short what the rank does as it stops (the query behind the stop, the emergency save).
    A SIGTERM that tether's handlers take drops it for good (``stopping``); a failure's post
    holds it where the SIGTERM handler is the user's (``Hooks.posting``). A disposition of
    SIG_DFL or SIG_IGN is left alone (SIG_IGN makes the kernel reap the children)."""
    return [signal.SIGCHLD] if callable(signal.getsignal(signal.SIGCHLD)) else []


_stopping = False  # a SIGTERM came to this process (``stopping``)


def stopping(signum: int) -> None:
    """A SIGTERM came (each handler of tether's that takes one calls this, in the main
    thread): from here on a child's death is dropped (``child_deaths``), for good.

    Here, not in holds around what the rank does as it stops: a SIGTERM inside an
    optimizer's step waits for the end of its ``ckpt.step`` block (``Deferred``), and torch's error about the
    loaders' workers, which the same stop ended, came meanwhile, inside the step, as the
    rank's own failure (``tests/jobs/dataloader_stop.py in-step``: "saved no emergency
    checkpoint: the failure came in the middle of optimizer.step()"). Python runs pending
    handlers in signal order, SIGTERM (15) before SIGCHLD (17), and a worker's death comes
    after the stop that ended it."""
    global _stopping
    if signum != signal.SIGTERM:
        return  # Ctrl-C: a loader's workers take it as a KeyboardInterrupt and exit cleanly
    _stopping = True
    for sig in child_deaths():
        signal.signal(sig, _dropped)


def _dropped(signum: int, frame: FrameType | None) -> None:
    """A child died while this process stops: nobody will use its DataLoader again."""


class Deferred:
    """``signals`` (SIGINT and SIGTERM) put off across a span the main thread must not be
    stopped in (an optimizer's step: a stop in its middle leaves a replica that is neither
    the last step's nor this one's), then raised again as it ends. Blocking a signal in
    the main thread is not enough: the kernel hands it to another thread, and Python runs
    the handler in the main thread anyway. So each handler is swapped for one that notes
    the signal, and put back after. Only the main thread can swap handlers: elsewhere
    nothing is put off; a handler not set from Python (``getsignal`` is None) is left
    alone. A start and its end cost 12.2 us: four handler swaps
    (``benchmarks/signal_defer.py``)."""

    def __init__(self, signals: list[signal.Signals] | None = None) -> None:
        self._signals = [signal.SIGINT, signal.SIGTERM] if signals is None else signals
        self._previous: dict[signal.Signals, Any] = {}
        self.came: list[int] = []  # the signals noted since ``start``

    def start(self) -> None:
        if self._previous or threading.current_thread() is not threading.main_thread():
            return
        for sig in self._signals:
            if signal.getsignal(sig) is not None:
                self._previous[sig] = signal.signal(sig, self._note)

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self.came.append(signum)
        stopping(signum)

    def end(self, raise_again: bool = True) -> list[int]:
        """Put the handlers back; a signal that came meanwhile is raised now, once (unless
        not ``raise_again``). Returns those that came."""
        if not self._previous and not self.came:
            return []
        previous, self._previous = self._previous, {}
        for sig, handler in previous.items():
            signal.signal(sig, _dropped if sig == signal.SIGCHLD and _stopping else handler)
        came, self.came = self.came, []
        for signum in dict.fromkeys(came) if raise_again else ():
            signal.raise_signal(signum)
        return came


def ends_a_wait(signum: int) -> bool:
    """Whether ``signum``'s handler now is one that ends the main thread's wait: tether's own
    (it raises ``Terminated``/``KeyboardInterrupt``) or Python's Ctrl-C. A handler of the
    user's may return (it sets a flag: "save at the end of this step"), and then the wait
    must go on (``watchdog.SIGNALLED``). Callable from any thread."""
    try:
        handler = signal.getsignal(signum)
    except (ValueError, OSError):
        return False
    own = (Hooks._on_signal, Hooks._on_signal_while_ending, Hooks._on_signal_after_main_thread)
    return handler is signal.default_int_handler or getattr(handler, "__func__", None) in own


def end_process(code: int) -> None:
    """End this process now with ``code``: streams flushed, no teardown, no exit functions.

    Its daemonic ``multiprocessing`` children (a DataLoader's workers) are ended first, as
    Python's own exit would end them. Left alone they outlived the job: in a
    ``tether.spawn`` worker they came from a forkserver of the rank's, which they kept
    alive while they waited for it to die, forever, holding the job's stdout (``python
    train.py | tee log`` never returned; ``tests/test_dataloader_workers.py``). So are the
    other processes it started, as torchrun ends a worker's process group
    (``descendants.py``).
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    processes = sys.modules.get("multiprocessing")
    if processes is not None:
        with contextlib.suppress(Exception):
            for child in processes.active_children():
                if child.daemon:
                    child.terminate()
    with contextlib.suppress(Exception):
        descendants.terminate()
    os._exit(code)


FINISHING = 5.0  # seconds a victim waits for a peer that finished, on its host, to be gone


def after_finished_peer(shown: BaseException) -> None:
    """A victim of a peer that finished on this host (``PeerFinished``) waits until that
    peer's process is gone, at most ``FINISHING`` seconds, before it exits itself.

    The peer is in Python's teardown (its ``sys.exit(2)`` reached the top, and its code is
    not to be seen there, so tether cannot end it sooner). The victim, ended in
    milliseconds, exited first; torchrun then SIGTERMed the peer in the middle of its
    teardown, and its report gave the root cause "exitcode: -15", not its own 2
    (``tests/test_finish_early.py`` [exit2]: three suite runs of this week). The job ends
    no later: it ends with that peer's exit. Not where a non-daemon thread keeps the peer's
    process alive (its record ``lingers``: ``ending._main_thread_ended``): waiting there
    made the peer's own ladder end it (exit 6) before the launcher's SIGTERM. A stop
    meanwhile ends this rank at once (``_on_signal_while_ending``). 2 s was too short in a
    loaded fresh-clone run, for a teardown made 1.5 s longer than Python's own (the test's).
    """
    if not isinstance(shown, PeerFinished) or shown.pid <= 0 or shown.pid == os.getpid():
        return
    if shown.record.detail.get("lingers"):
        return  # a non-daemon thread keeps it alive: the launcher's stop is what ends it
    if (shown.host, shown.record.detail.get("pidns", "")) != (socket.gethostname(), pid_namespace()):
        return  # its pid names another process here, or none (a container sharing the host's name)
    deadline = time.monotonic() + FINISHING
    while process_state(shown.pid) is not None and time.monotonic() < deadline:
        time.sleep(0.01)


def exit_code_for(exc: BaseException) -> int:
    """The exit status of a process that ends on ``exc`` (see ``errors.ExitCode``)."""
    if isinstance(exc, TetherError):
        return int(exc.exit_code)
    if isinstance(exc, SystemExit):
        if exc.code is None:
            return 0
        return exc.code if isinstance(exc.code, int) else int(ExitCode.RAISED)
    if isinstance(exc, KeyboardInterrupt):
        return 128 + signal.SIGINT
    return int(ExitCode.RAISED)


def is_success(exc: BaseException) -> bool:
    """``sys.exit(0)`` / ``sys.exit()``: the function ended, successfully."""
    return type(exc) is SystemExit and exc.code in (0, None)


class Hooks:
    """The excepthooks and signal handlers of one context.

    Args:
        on_failure: posts an uncaught failure (never raises).
        owned: end the process after an uncaught failure (see the module docstring).
        signal_fd: the fd the interpreter writes when a signal arrives (the keeper's).
        error_file: torchelastic's error file of this worker (under torchrun): once the
            failure is written there, torchrun's "Root Cause" section prints its traceback,
            so this rank prints one line instead of the same traceback again.
    """

    def __init__(
        self,
        on_failure: Callable[[BaseException], object],
        owned: bool,
        signal_fd: int | None,
        rank: int = 0,
        error_file: str | None = None,
        defer_stop: Callable[[], bool] = lambda: False,
    ) -> None:
        self._on_failure = on_failure
        self._defer_stop = defer_stop
        self.rank = rank
        self._error_file = error_file
        self._owned = owned
        self._signal_fd = signal_fd
        self._saved: dict[str, Any] = {}
        self.signalled: int | None = None
        self._ending_code: int | None = None  # set once the excepthook decided the exit code
        self._stop_pending = False  # a SIGTERM/SIGINT came while the failure was being posted
        self._said = False  # how this rank ends was told (``_say``)

    def install(self) -> None:
        self.install_signals()
        self.install_excepthooks()

    def install_excepthooks(self) -> None:
        """The excepthooks. Outermost: ``init_process_group`` wraps ``sys.excepthook`` in one
        that buffers stderr until the previous hook returns, and in a process tether owns
        its hook never returns: install them after the group is made."""
        self._track()
        self._saved["excepthook"] = sys.excepthook
        self._saved["threading"] = threading.excepthook
        sys.excepthook = self._excepthook
        threading.excepthook = self._thread_excepthook

    def install_signals(self) -> None:
        """SIGTERM's and SIGINT's handlers (where they are the defaults), main thread only.

        Installed before the group is made: a launcher's SIGTERM that came while a rank was
        still in ``init_process_group`` (its peer failed just after its own) killed it by
        the signal, without a word ("exitcode: -15"; seen in CI). A handler runs only when a
        wait of C++ ends: there the ladder ends the rank after a peer's failure, as in any
        raw call, and the keeper a stop without one (``Watchdog.stops_end_process``).
        """
        self._track()
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, default in ((signal.SIGTERM, signal.SIG_DFL), (signal.SIGINT, signal.default_int_handler)):
            if signal.getsignal(sig) is default:
                self._saved[sig.name] = signal.signal(sig, self._on_signal)
        if self._signal_fd is not None:
            old = signal.set_wakeup_fd(self._signal_fd, warn_on_full_buffer=False)
            if old != -1:  # somebody else (an event loop) owns it: leave it theirs
                signal.set_wakeup_fd(old)
            else:
                self._saved["wakeup"] = True

    def _track(self) -> None:
        global _fork_watched
        if not _fork_watched and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_drop_in_forked_child)
            _fork_watched = True
        if self not in _installed:
            _installed.append(self)

    def uninstall(self, keep_exit: bool = False) -> None:
        """Put the previous hooks back; with ``keep_exit`` (after a failure) keep the excepthook.

        That hook's post is a no-op once the context is gone, but in a process tether owns
        it still ends the process at once when the failure reaches the top level.
        """
        keep_exit = keep_exit and self._owned
        if sys.excepthook == self._excepthook and not keep_exit:
            sys.excepthook = self._saved["excepthook"]
        if threading.excepthook == self._thread_excepthook:
            threading.excepthook = self._saved["threading"]
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                if sig.name in self._saved and signal.getsignal(sig) == self._on_signal:
                    signal.signal(sig, self._saved[sig.name])
            if self._saved.get("wakeup"):
                with contextlib.suppress(ValueError):
                    signal.set_wakeup_fd(-1)
        kept = self._saved.get("excepthook") if keep_exit else None
        self._saved.clear()
        if not keep_exit and self in _installed:
            _installed.remove(self)
        if kept is not None:
            self._saved["excepthook"] = kept

    @contextlib.contextmanager
    def posting(self) -> Iterator[list[int]]:
        """Hold SIGTERM and SIGINT while a failure is posted; yields the signals that came.

        Only where this object's handler is installed (in the excepthook,
        ``_on_signal_while_ending`` already defers a stop). See ``stop_after``. A
        DataLoader's dying workers are held off too (``child_deaths``), and dropped.
        """
        on_main = threading.current_thread() is threading.main_thread()
        ours = [s for s in (signal.SIGTERM, signal.SIGINT) if on_main and signal.getsignal(s) == self._on_signal]
        with holding(child_deaths() if on_main else []), holding(ours) as came:
            yield came

    def stop_after(self, signum: int, shown: BaseException) -> None:
        """A stop held while a failure was posted: an owned process ends now, quietly.

        It ends with the code of ``shown`` (the peer's failure behind the posted one, or
        that one): its error file is written and the launcher asked it to stop, so neither
        the code that was to run next nor the excepthook's line would reach anyone. A
        process tether does not own gets the stop as the handler would have raised it.
        """
        self.signalled = signum
        if not self._owned:
            self._on_signal(signum, None)
        self.end(shown)

    @contextlib.contextmanager
    def ending_on_stop(self, shown: BaseException) -> Iterator[None]:
        """For ``finalize`` after a failure: a SIGTERM in this block is held; from its end on,
        a SIGTERM ends this owned process at once with ``shown``'s code, a held one then.

        Before, a launcher's stop that landed in the retire raised ``Terminated`` there
        (which replaced the failure, cut the retire short and ended the rank through
        Python's teardown, 143), and one that came after it killed the rank by the signal
        (-15), tether's handler being gone. Only the main thread can swap handlers.
        """
        if not self._owned or threading.current_thread() is not threading.main_thread():
            yield
            return
        came: list[int] = []
        signal.signal(signal.SIGTERM, lambda signum, frame: came.append(signum))
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, lambda signum, frame: self.end(shown))  # first: no stop lost
            if came:
                self.end(shown)  # as ``stop_after`` ends a stop held during the post

    @property
    def owned(self) -> bool:
        """Whether tether ends this process after a failure (see the module docstring)."""
        return self._owned

    def end(self, shown: BaseException) -> None:
        """End the process now with the exit code of ``shown``, streams flushed, no teardown.

        A failure (not the stop itself) is said first, as the excepthook would have said
        it: a victim that a launcher's stop ended in its post or its ``finalize`` printed
        nothing, so torchrun's output lacked its line (seen in CI, two nodes).
        """
        if not isinstance(shown, Terminated):
            self._say(shown, shown)
        end_process(exit_code_for(shown))

    def _say(self, exc: BaseException, shown: BaseException) -> None:
        """Tell, once, how this rank ends: ``exc`` its own exception, ``shown`` the failure behind it.

        In an owned process a victim prints one line (the failing rank prints the one full
        traceback), an interrupted rank (Ctrl-C) one line, and a failing rank whose
        traceback torchrun's Root Cause report shows (its error file is written) one line
        too; anything else goes to the previous hook.
        """
        if self._said:
            return
        self._said = self._owned  # elsewhere the interpreter goes on, and may meet another
        if self._owned and isinstance(shown, TetherError):
            with contextlib.suppress(Exception):
                sys.stderr.write(f"[rank {self.rank}] stopped: {first_line(shown)}\n")
        elif self._owned and isinstance(exc, KeyboardInterrupt):
            # a Ctrl-C's traceback says nothing, and torchrun, interrupted too, prints no report
            with contextlib.suppress(Exception):
                sys.stderr.write(f"[rank {self.rank}] interrupted: {first_line(exc)}\n")
        elif self._owned and self._error_file is not None and os.path.exists(self._error_file):
            with contextlib.suppress(Exception):
                sys.stderr.write(
                    f"[rank {self.rank}] failed: {first_line(exc)} (its traceback is in torchrun's Root Cause report)\n"
                )
        else:
            self._saved.get("excepthook", sys.__excepthook__)(type(exc), exc, exc.__traceback__)

    def _excepthook(self, kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        ending = self._owned and threading.current_thread() is threading.main_thread()
        if ending:
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._on_signal_while_ending)
        behind = self._post(exc)
        shown = behind if isinstance(behind, TetherError) else exc
        self._say(exc, shown)  # a stop meanwhile waits for it (``_on_signal_while_ending``)
        if ending:
            self._ending_code = exit_code_for(shown)
        if not self._owned:
            return
        if not self._stop_pending:
            _ending.set()
            atexit._run_exitfuncs()
            after_finished_peer(shown)
        end_process(exit_code_for(shown))

    def end_uncaught(self, exc: BaseException) -> None:
        """End an owned process on ``exc`` now, as the excepthook ends it after an uncaught
        exception (its failure told, the exit functions run, ``os._exit``): for a
        ``SystemExit`` that reaches no hook, such as one out of ``Parallel.run``. Python's
        own teardown after it lasted ~0.3 s, and torchrun SIGTERMed the rank meanwhile
        once a faster victim had exited ("exitcode: -15"). Returns elsewhere."""
        if self._owned and threading.current_thread() is threading.main_thread():
            self._excepthook(type(exc), exc, exc.__traceback__)

    def _thread_excepthook(self, args: threading.ExceptHookArgs) -> None:
        if args.exc_value is not None and not isinstance(args.exc_value, SystemExit):
            self._post(args.exc_value)
        self._saved["threading"](args)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signalled = signum
        stopping(signum)
        if signum == signal.SIGTERM and self._owned and self._defer_stop():
            self._stop_pending = True  # the known failure ends the process (see the module docstring)
            return
        if signum == signal.SIGINT:
            raise KeyboardInterrupt("stopped by SIGINT")
        raise Terminated(128 + signum)

    def main_thread_ended(self) -> None:
        """The main thread is done and the interpreter waits for non-daemon threads: in an
        owned process a launcher's SIGTERM ends the process now, as it would without
        tether (a ``Terminated`` raised in that wait is printed as "ignored", and the wait
        goes on). Ctrl-C stays Python's: a ``KeyboardInterrupt`` there is ignored too."""
        if self._owned and signal.getsignal(signal.SIGTERM) == self._on_signal:
            signal.signal(signal.SIGTERM, self._on_signal_after_main_thread)

    def _on_signal_after_main_thread(self, signum: int, frame: FrameType | None) -> None:
        self.signalled = signum
        end_process(128 + signum)

    def _on_signal_while_ending(self, signum: int, frame: FrameType | None) -> None:
        """A launcher's stop while the excepthook ends the process: end it now, with its code."""
        self.signalled = signum
        if self._ending_code is None:  # the failure is still being posted or told: finish that first
            self._stop_pending = True
            return
        end_process(self._ending_code)

    def _post(self, exc: BaseException) -> object:
        """Post ``exc``; returns what ``on_failure`` says is behind it (a peer's failure), if anything."""
        try:
            return self._on_failure(exc)
        except Exception as err:  # a hook must never raise
            with contextlib.suppress(Exception):
                sys.stderr.write(f"tether: could not post a failure: {type(err).__name__}: {err}\n")
            return None
