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

from ._core.record import FailureRecord, describe_exit
from .errors import ExitCode, JobFailed

RULE = "=" * 72


@dataclass(frozen=True)
class RankOutcome:
    """How one rank ended, for the report's per-rank lines."""

    rank: int
    exit_code: int | None
    line: str = ""  # overrides the line built from the exit code


def render_report(records: Sequence[FailureRecord], outcomes: Mapping[int, RankOutcome] = {}) -> str:
    """The job's one root-cause report (empty when nothing failed)."""
    if not records:
        return ""
    root = records[0]
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
    if len(records) > 1:
        lines += ["", "Consequences, in order:"]
        lines += [f"  #{r.seq} {r.headline}" for r in records[1:]]
    if outcomes:
        lines += ["", "Ranks:"]
        for rank in sorted(outcomes):
            o = outcomes[rank]
            lines.append(f"  rank {rank}: {o.line or describe_exit(o.exit_code)}")
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
