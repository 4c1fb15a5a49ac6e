"""The root-cause report: one template, the first failure first, every rank after it.

Records come from the channel in store order (``seq``), so "first" is exact, not a
one-second timestamp. A rank that died without a record is described from its exit
status (``-9`` -> "killed by SIGKILL").
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._core.record import KIND_EXCEPTION, FailureRecord, describe_exit
from .errors import ExitCode, JobFailed

RULE = "=" * 72


@dataclass(frozen=True)
class RankOutcome:
    """How one rank ended, for the report's per-rank lines."""

    rank: int
    exit_code: int | None
    line: str = ""  # overrides the line built from the exit code


def raised_everywhere(records: Sequence[FailureRecord], world_size: int | None) -> bool:
    """True when every rank of the job raised the same error and nothing else failed.

    The usual case is a bad argument (``tether._checks`` raises it identically on every
    rank, before any collective): no rank is the culprit, so the report names none.
    """
    if world_size is None or len(records) != world_size or world_size < 2:
        return False
    first = records[0]
    return len({r.rank for r in records}) == world_size and all(
        r.kind == KIND_EXCEPTION and r.reporter == r.rank and (r.exc_type, r.message) == (first.exc_type, first.message)
        for r in records
    )


def cause_line(records: Sequence[FailureRecord], world_size: int | None = None) -> str:
    """``rank 1 failed: ValueError: ...``, or ``every rank raised ValueError: ...``."""
    first = records[0]
    if raised_everywhere(records, world_size):
        return f"every rank raised {first.error}"
    return first.headline


def render_report(
    records: Sequence[FailureRecord],
    outcomes: Mapping[int, RankOutcome] = {},
    world_size: int | None = None,
    notes: Sequence[str] = (),
) -> str:
    """The job's one root-cause report (empty when nothing failed).

    ``world_size``, when known, lets the report tell a failure of every rank alike (one
    error, no culprit) from a root cause and its consequences. ``notes`` end it (the
    emergency checkpoint's line).
    """
    if not records:
        return ""
    root = records[0]
    everywhere = raised_everywhere(records, world_size)
    if everywhere:
        lines = [RULE, f"tether: job failed. Every rank raised {root.error}"]
        lines.append(f"  (the same error on all {world_size} ranks; the traceback is rank {root.rank}'s)")
    else:
        lines = [RULE, f"tether: job failed. Root cause: {root.headline}"]
    origin = "  on " + (f"host {root.host}" if root.host else "an unknown host")
    if root.pid:
        origin += f", pid {root.pid}"
    if root.where:
        origin += f", in {root.where}"
    if root.frame:
        origin += f", at {root.frame}"
    lines.append(origin)
    if root.reporter != root.rank:
        lines.append(f"  (noticed and posted by {'the launcher' if root.reporter < 0 else f'rank {root.reporter}'})")
    if root.traceback:
        lines += ["", root.traceback.rstrip()]
    if len(records) > 1 and not everywhere:
        lines += ["", "Consequences, in order:"]
        lines += [f"  #{r.seq} {r.headline}" for r in records[1:]]
    if outcomes:
        lines += ["", "Ranks:"]
        for rank in sorted(outcomes):
            o = outcomes[rank]
            lines.append(f"  rank {rank}: {o.line or describe_exit(o.exit_code)}")
    if notes:
        lines += ["", *notes]
    lines.append(RULE)
    return "\n".join(lines) + "\n"


def end_quietly_if_uncaught(error: JobFailed) -> None:
    """If ``error`` reaches the top level uncaught, end with one line and ``LAUNCH_FAILED`` (7).

    The report is already printed: a traceback through tether's launcher would only repeat
    the root cause. The exception stays catchable and its text the same; only the last
    resort changes (the excepthook, which Python calls for an uncaught exception).
    """
    previous = sys.excepthook

    def excepthook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
        if exc is not error:
            previous(kind, exc, tb)
            return
        sys.stderr.write(f"tether.JobFailed: {exc} (exit code {int(ExitCode.LAUNCH_FAILED)})\n")
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(ExitCode.LAUNCH_FAILED))

    sys.excepthook = excepthook
