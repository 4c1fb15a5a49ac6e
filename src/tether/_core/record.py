"""The failure record: what one rank tells the others about a failure.

A record travels through the job's c10d store as versioned JSON (never pickle:
the store is unauthenticated, and a record must be readable by any tether
version that knows its ``version``). ``seq`` is the order the store gave it:
seq 1 is the root cause, every later record is a consequence.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import time
import traceback as _tb
from typing import Any

from ..errors import PeerFailure, PeerFinished, PeerLost, SyncMismatch, SyncTimeout, TetherError

RECORD_VERSION = 1

# What happened to the rank the record is about.
KIND_EXCEPTION = "exception"  # it raised (the record carries type, message, traceback)
KIND_EXIT = "exit"  # it called sys.exit(n != 0) or os._exit
KIND_SIGNAL = "signal"  # it was killed by a signal, seen by its launcher
KIND_LOST = "lost"  # it went silent: no heartbeat, or its process vanished
KIND_TIMEOUT = "timeout"  # a sync's timeout expired while waiting for it
KIND_MISMATCH = "mismatch"  # ranks entered different syncs
KIND_FINISHED = "finished"  # it finished cleanly while others still waited for it in a sync


@dataclasses.dataclass(frozen=True)
class FailureRecord:
    """One failure, as posted on the channel. Field names are the JSON keys."""

    rank: int
    kind: str
    exc_type: str
    message: str
    traceback: str = ""
    host: str = ""
    pid: int = 0
    time: float = 0.0
    where: str = ""  # the tether call the rank was in, or "user code"
    frame: str = ""  # the innermost user frame, "file:line in func"
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)
    seq: int = 0
    reporter: int = -1  # the rank (or -1: a launcher) that posted it
    version: int = RECORD_VERSION

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> FailureRecord:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("version") != RECORD_VERSION:
            raise ValueError(f"not a tether failure record of version {RECORD_VERSION}: {text!r:.200}")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def with_seq(self, seq: int) -> FailureRecord:
        return dataclasses.replace(self, seq=seq)

    @property
    def headline(self) -> str:
        """``rank R failed: ExcType: message`` — the first line of every report.

        A launcher's loss (rank -1: the launcher that hosts the store, no rank of the job)
        is ``ExcType: message``, whose message names it.
        """
        if self.rank < 0:
            return self.error
        return f"rank {self.rank} failed: {self.error}"

    @property
    def error(self) -> str:
        """``ExcType: message`` in one line: the message's first line (``ExcType`` alone for an
        empty message, as Python prints it). A message of many lines (a DataLoader worker's
        error carries the worker's traceback) is whole in ``message`` and at the end of
        ``traceback``; the report and ``str()`` of a survivor's error show this line."""
        return _named(self.exc_type, self.message)


# Frames a user did not write: left out of a record's traceback, with a note saying how many.
_NOT_USERS = ("/tether/", "/multiprocessing/", "/contextlib.py", "/runpy.py", "/threading.py")


def _is_users(filename: str) -> bool:
    path = filename.replace(os.sep, "/")
    return not any(part in path or path.endswith(part) for part in _NOT_USERS)


def format_traceback(exc: BaseException) -> str:
    """``exc``'s traceback as the user reads it: their frames, outermost first.

    Two changes from ``traceback.format_exception``, both for the outermost exception
    only (chained ones print as Python prints them):

    * an exception caught while it is still unwinding (a failure inside a tether context
      manager, posted from its ``finally``) has not reached the user's outer frames yet;
      the frames that called the outermost traceback frame are still live, and are
      prepended, so the traceback starts at the user's ``main()``, not at tether's
      ``yield``;
    * frames of tether, contextlib and multiprocessing are left out, with a note saying
      how many (the innermost frame is kept whatever it is: that is where it was raised).
    """
    tb = exc.__traceback__
    pairs: list[tuple[Any, int]] = list(_tb.walk_tb(tb))
    inner = {id(frame) for frame, _ in pairs}
    if tb is not None and tb.tb_frame.f_back is not None:
        outer = [(f, n) for f, n in _tb.walk_stack(tb.tb_frame.f_back) if id(f) not in inner]
        pairs = outer[::-1] + pairs
    kept = _users_frames(pairs, keep_innermost=True)
    report = _tb.TracebackException(type(exc), exc, tb)
    report.stack = _tb.StackSummary.extract(iter(kept))
    text = "".join(report.format())
    hidden = len(pairs) - len(kept)
    header = "Traceback (most recent call last):\n"
    # the outermost exception's header: the last before its own lines, which may hold
    # that header too (a DataLoader worker's error: "Original Traceback (most recent...")
    stack_end = len(text) - len("".join(report.format_exception_only()))
    if hidden and header in text[:stack_end]:
        at = text.rindex(header, 0, stack_end) + len(header)
        text = text[:at] + _hidden_note(hidden) + text[at:]
    return text


def format_stack(frame: Any, in_tether: bool, limit: int = 6) -> str:
    """Where a live thread is, from ``frame`` out, as the user reads it: their innermost
    ``limit`` frames, outermost first, for a rank's whereabouts.

    Frames of tether, contextlib and multiprocessing are left out as in ``format_traceback``,
    with a note. The innermost frame is kept whatever it is (``threading.py``'s ``wait``
    says what a rank in user code waits for), unless the thread is in a tether call
    (``in_tether``), which its whereabouts already name: then the user's call to it is
    the innermost frame shown. Before, the innermost six frames, whoever's, were shown: a
    ``tether.spawn`` worker stalled in its function showed five frames of multiprocessing
    and tether, and one of its own.
    """
    pairs: list[tuple[Any, int]] = list(_tb.walk_stack(frame))[::-1]
    users = _users_frames(pairs, keep_innermost=not in_tether)
    hidden = len(pairs) - len(users)  # (outer frames of the user's past ``limit`` go unmentioned)
    text = "".join(_tb.StackSummary.extract(iter(users[-limit:])).format())
    return (_hidden_note(hidden) if hidden else "") + text


def _users_frames(pairs: list[tuple[Any, int]], keep_innermost: bool) -> list[tuple[Any, int]]:
    """Of (frame, line) pairs, outermost first, the user's: see ``format_traceback``."""
    boot = [i for i, (f, _) in enumerate(pairs) if "/multiprocessing/" in f.f_code.co_filename.replace(os.sep, "/")]
    start = boot[-1] + 1 if boot else 0  # frames outside multiprocessing's are its bootstrap (`python -c`)
    last = len(pairs) - 1 if keep_innermost else -1
    return [p for i, p in enumerate(pairs) if (i >= start and _is_users(p[0].f_code.co_filename)) or i == last]


def _hidden_note(hidden: int) -> str:
    return f"  [{hidden} frame(s) of tether, contextlib or multiprocessing not shown]\n"


def _user_frame(tb: Any) -> str:
    """The innermost frame of ``tb`` that is neither tether's nor torch's."""
    found = ""
    for frame in _tb.extract_tb(tb):
        path = frame.filename.replace(os.sep, "/")
        # contextlib: a check in one_rank_first's __enter__ must point at the user's `with`
        if "/tether/" in path or "/torch/" in path or "/multiprocessing/" in path or path.endswith("/contextlib.py"):
            continue
        found = f"{frame.filename}:{frame.lineno} in {frame.name}"
    return found


MAX_MESSAGE = 16 * 1024  # characters of a message that travel; the rest is cut, with a note
MAX_TRACEBACK = 64 * 1024


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"... [{len(text) - limit} more characters not sent]"


def _render(render: Any, what: str) -> str:
    """``render()``, or a placeholder when it raises: a failure must never be lost to its own text."""
    try:
        return str(render())
    except Exception as err:  # whatever a broken __str__ raises
        return f"<{what} could not be rendered: {type(err).__name__}>"


def first_line(exc: BaseException) -> str:
    """``ExcType: the message's first line``, or ``ExcType`` alone, whatever ``__str__`` does."""
    return _named(type(exc).__name__, _render(lambda: exc, "message"))


def _named(exc_type: str, message: str) -> str:
    """``ExcType: the message's first non-blank line``, or ``ExcType`` for a blank message."""
    first = next((line for line in message.splitlines() if line.strip()), "")
    return f"{exc_type}: {first}" if first else exc_type


def record_from_exception(rank: int, exc: BaseException, where: str) -> FailureRecord:
    """Describe ``exc``, raised on this process as ``rank``, as a record.

    Any exception can be described: one whose ``__str__`` or ``__repr__`` raises gets a
    placeholder for that part, a message longer than ``MAX_MESSAGE`` is cut with a note.
    """
    if isinstance(exc, SystemExit) and type(exc).__name__ == "SystemExit":
        # sys.exit(2) exits 2; sys.exit("text") prints the text and exits 1, as here
        code = exc.code
        kind, message = (
            KIND_EXIT,
            f"exit code {code}" if code is None or isinstance(code, int) else _render(lambda: code, "exit code"),
        )
    else:
        kind, message = KIND_EXCEPTION, _render(lambda: exc, "message")
    tb = _render(lambda: format_traceback(exc), "traceback")
    return FailureRecord(
        rank=rank,
        kind=kind,
        exc_type=type(exc).__name__,
        message=_clip(message, MAX_MESSAGE),
        traceback=_clip(tb, MAX_TRACEBACK),
        host=socket.gethostname(),
        pid=os.getpid(),
        time=time.time(),
        where=where,
        frame=_render(lambda: _user_frame(exc.__traceback__), "frame"),
        reporter=rank,
    )


def lost_record(
    rank: int,
    message: str,
    reporter: int,
    *,
    kind: str = KIND_LOST,
    exc_type: str = "Lost",
    pid: int = 0,
    host: str = "",
) -> FailureRecord:
    """The record of a rank that left none of its own: killed, frozen, gone with its host.

    ``reporter`` is whoever noticed: a rank, or -1 for a launcher. This is the one place
    such a record is built.
    """
    return FailureRecord(
        rank=rank,
        kind=kind,
        exc_type=exc_type,
        message=message,
        pid=pid,
        host=host,
        time=time.time(),
        reporter=reporter,
    )


def error_from_record(record: FailureRecord) -> TetherError:
    """The exception a surviving rank raises for ``record``."""
    if record.kind == KIND_TIMEOUT:
        d = record.detail
        where = {int(k): v for k, v in d.get("whereabouts", {}).items()}
        call, timeout = d.get("call", "sync"), float(d.get("timeout", 0))
        return SyncTimeout(call, timeout, d.get("missing", []), where, record, d.get("waiting", []), d.get("late", []))
    if record.kind == KIND_MISMATCH:
        return SyncMismatch({int(k): v for k, v in record.detail.get("calls", {}).items()}, record)
    if record.kind in (KIND_LOST, KIND_SIGNAL):
        return PeerLost(record)
    if record.kind == KIND_FINISHED:
        return PeerFinished(record)
    if record.kind == KIND_EXIT and record.reporter != record.rank:
        return PeerLost(record)  # an exit seen only from outside (os._exit): it left no record
    return PeerFailure(record)


def describe_exit(code: int | None) -> str:
    """``-9`` -> ``killed by SIGKILL``; ``3`` -> ``exited with code 3``."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"
