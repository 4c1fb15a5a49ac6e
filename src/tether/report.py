"""The root-cause report: one template, the first failure first, every rank after it.

Records come from the channel in store order (``seq``), so "first" is exact, not a
one-second timestamp. A rank that died without a record is described from its exit
status (``-9`` -> "killed by SIGKILL").
"""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ._record import KIND_EXIT, KIND_LOST, KIND_MISMATCH, KIND_SIGNAL, KIND_TIMEOUT, FailureRecord
from .errors import PeerFailure, PeerLost, SyncMismatch, SyncTimeout, TetherError

RULE = "=" * 72


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
    origin = f"  on host {root.host or '?'}, pid {root.pid or '?'}"
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


def render_notice(rank: int, failure: TetherError, whereabouts: str, grace: float) -> str:
    """What the watchdog prints before ending a rank whose main thread never took the failure."""
    return (
        f"{RULE}\ntether: rank {rank}: {failure}\n"
        f"  the main thread did not return to tether within {grace:g} s; it was {whereabouts}\n"
        f"  ending this process with exit code {int(failure.exit_code)}\n{RULE}\n"
    )
