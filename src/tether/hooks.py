"""Failures outside tether calls: uncaught exceptions (any thread), SIGTERM and SIGINT.

``install`` chains onto whatever hooks and handlers are there and ``uninstall`` puts them
back; a handler the user installed for SIGTERM/SIGINT is left alone. Each hook only
posts the failure (``on_failure``) and then behaves as before: the previous excepthook
runs, SIGINT still raises ``KeyboardInterrupt``, SIGTERM raises ``SystemExit(143)`` -- or,
when ``on_failure`` returns an exception, that one: a SIGTERM that a launcher sends because
another rank failed is raised as that rank's failure (see ``launch.report_failure``).
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any


class SignalStop(SystemExit):
    """SIGTERM arrived; the process stops with exit code 128 + signal."""

    def __str__(self) -> str:
        return f"stopped by {signal.Signals(int(str(self.code)) - 128).name}"


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

    def uninstall(self) -> None:
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._saved["excepthook"]
        if threading.excepthook == self._thread_excepthook:
            threading.excepthook = self._saved["threading"]
        for sig in (signal.SIGTERM, signal.SIGINT):
            if sig.name in self._saved and threading.current_thread() is threading.main_thread():
                signal.signal(sig, self._saved[sig.name])
        self._saved.clear()

    def _excepthook(self, kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        self._post(exc)
        self._saved["excepthook"](kind, exc, tb)

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
