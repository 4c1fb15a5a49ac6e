"""Failures outside tether calls: uncaught exceptions (any thread), SIGTERM and SIGINT.

``install`` chains onto whatever hooks and handlers are there and ``uninstall`` puts them
back; a handler the user installed for SIGTERM/SIGINT is left alone. Each hook only
posts the failure (``on_failure``) and then behaves as before: the previous excepthook
runs, SIGINT still raises ``KeyboardInterrupt``, SIGTERM raises ``SystemExit(143)`` -- or,
when ``on_failure`` returns an exception, that one: a SIGTERM that a launcher sends because
another rank failed is raised as that rank's failure (see ``launch.report_failure``).
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

from ..errors import ExitCode, TetherError


class SignalStop(SystemExit):
    """SIGTERM arrived; the process stops with exit code 128 + signal."""

    def __str__(self) -> str:
        return f"stopped by {signal.Signals(int(str(self.code)) - 128).name}"


def exit_code_for(exc: BaseException) -> int:
    """The exit status of a process that ends on ``exc`` (see ``errors.ExitCode``)."""
    if isinstance(exc, TetherError):
        return int(exc.exit_code)
    if isinstance(exc, SystemExit):
        return exc.code if isinstance(exc.code, int) and exc.code else int(ExitCode.RAISED)
    if isinstance(exc, KeyboardInterrupt):
        return 128 + signal.SIGINT
    return int(ExitCode.RAISED)


class Hooks:
    def __init__(self, on_failure: Callable[[BaseException], BaseException | None]) -> None:
        self._on_failure = on_failure
        self._saved: dict[str, Any] = {}

    def install(self) -> None:
        self._saved["excepthook"] = sys.excepthook
        self._saved["threading"] = threading.excepthook
        sys.excepthook = self._excepthook
        threading.excepthook = self._thread_excepthook
        if threading.current_thread() is threading.main_thread():
            for sig, default in ((signal.SIGTERM, signal.SIG_DFL), (signal.SIGINT, signal.default_int_handler)):
                if signal.getsignal(sig) is default:
                    self._saved[sig.name] = signal.signal(sig, self._on_signal)

    def uninstall(self, keep_exit: bool = False) -> None:
        """Put the previous hooks back; with ``keep_exit`` (after a failure) keep the excepthook.

        That hook's post is a no-op once the context is gone, but it still ends the process
        at once when the failure reaches the top level (see ``_excepthook``).
        """
        if sys.excepthook == self._excepthook and not keep_exit:
            sys.excepthook = self._saved["excepthook"]
        if threading.excepthook == self._thread_excepthook:
            threading.excepthook = self._saved["threading"]
        for sig in (signal.SIGTERM, signal.SIGINT):
            if sig.name in self._saved and threading.current_thread() is threading.main_thread():
                signal.signal(sig, self._saved[sig.name])
        kept = self._saved.get("excepthook") if keep_exit else None
        self._saved.clear()
        if kept is not None:
            self._saved["excepthook"] = kept

    def _excepthook(self, kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        """Post, print as before, then end the process now with the code of ``ExitCode``.

        Python would next wait for non-daemon threads (forever, if one is stuck on the dead
        job) and tear torch down, where abandoned gloo work can abort the process (SIGABRT,
        "gloo::IoException"). A rank that failed has nothing left to do: atexit handlers
        run, and the process exits with a code that says why.
        """
        self._post(exc)
        self._previous_excepthook(kind, exc, tb)
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code_for(exc))

    def _previous_excepthook(self, kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        hook = self._saved.get("excepthook", sys.__excepthook__)
        hook(kind, exc, tb)

    def _thread_excepthook(self, args: threading.ExceptHookArgs) -> None:
        if args.exc_value is not None and not isinstance(args.exc_value, SystemExit):
            self._post(args.exc_value)
        self._saved["threading"](args)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        exc: BaseException = KeyboardInterrupt() if signum == signal.SIGINT else SignalStop(128 + signum)
        if not exc.args:
            exc.args = (f"stopped by {name}",)
        raise self._post(exc) or exc

    def _post(self, exc: BaseException) -> BaseException | None:
        try:
            return self._on_failure(exc)
        except Exception as err:  # a hook must never raise
            print(f"tether: could not post a failure: {err!r}", file=sys.stderr)
            return None
