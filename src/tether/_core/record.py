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

from ..errors import PeerFailure, PeerLost, SyncMismatch, SyncTimeout, TetherError

RECORD_VERSION = 1

# What happened to the rank the record is about.
KIND_EXCEPTION = "exception"  # it raised (the record carries type, message, traceback)
KIND_EXIT = "exit"  # it called sys.exit(n != 0) or os._exit
KIND_SIGNAL = "signal"  # it was killed by a signal, seen by its launcher
KIND_LOST = "lost"  # it went silent: no heartbeat, or its process vanished
KIND_TIMEOUT = "timeout"  # a sync's timeout expired while waiting for it
KIND_MISMATCH = "mismatch"  # ranks entered different syncs


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
        """``rank R failed: ExcType: message`` — the first line of every report."""
        return f"rank {self.rank} failed: {self.exc_type}: {self.message}"


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


def record_from_exception(rank: int, exc: BaseException, where: str) -> FailureRecord:
    """Describe ``exc``, raised on this process as ``rank``, as a record."""
    if type(exc) is SystemExit:
        kind, message = KIND_EXIT, f"exit code {exc.code}"
    else:
        kind, message = KIND_EXCEPTION, str(exc)
    return FailureRecord(
        rank=rank,
        kind=kind,
        exc_type=type(exc).__name__,
        message=message,
        traceback="".join(_tb.format_exception(type(exc), exc, exc.__traceback__)),
        host=socket.gethostname(),
        pid=os.getpid(),
        time=time.time(),
        where=where,
        frame=_user_frame(exc.__traceback__),
        reporter=rank,
    )


def error_from_record(record: FailureRecord) -> TetherError:
    """The exception a surviving rank raises for ``record``."""
    if record.kind == KIND_TIMEOUT:
        d = record.detail
        where = {int(k): v for k, v in d.get("whereabouts", {}).items()}
        return SyncTimeout(d.get("call", "sync"), float(d.get("timeout", 0)), d.get("missing", []), where, record)
    if record.kind == KIND_MISMATCH:
        return SyncMismatch({int(k): v for k, v in record.detail.get("calls", {}).items()}, record)
    if record.kind in (KIND_LOST, KIND_SIGNAL):
        return PeerLost(record)
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
