"""Checks shared by the core test modules: parse the RESULT lines of ``tests/jobs/core_*.py``.

Every failure test asserts the same four things (see ``assert_contained``):

1. the job ended within its bound;
2. every surviving rank raised ``PeerFailure`` naming the failing rank, its exception
   type and message (and did so within ``notice`` seconds of the failure);
3. the root cause (rank, type, message) is in the job's output;
4. no process of the job is left.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from _harness import Result

# Outer bounds. A job's own run takes 10-20 s on an idle 2-core machine (each rank imports
# torch); the bounds leave room for a loaded machine, and are far below any torch timeout
# (gloo's default is 30 min), so a rank that waited on a dead peer would blow them.
JOB_BOUND = 150.0
TEST_TIMEOUT = 240
# Seconds between the failing rank raising and every survivor raising PeerFailure.
NOTICE = 10.0


def tail(res: Result, n: int = 4000) -> str:
    return f"returncode={res.returncode} elapsed={res.elapsed:.1f}s leftovers={res.leftovers}\n" + (
        f"--- stdout (tail) ---\n{res.stdout[-n:]}\n--- stderr (tail) ---\n{res.stderr[-n:]}"
    )


def lines(res: Result, tag: str) -> list[dict[str, Any]]:
    out = []
    for line in res.stdout.splitlines():
        if line.startswith(tag + " {"):
            out.append(json.loads(line[len(tag) + 1 :]))
    return out


def results(res: Result) -> dict[int, dict[str, Any]]:
    """rank -> its RESULT line; each rank must have printed exactly one."""
    got: dict[int, dict[str, Any]] = {}
    for data in lines(res, "RESULT"):
        assert data["rank"] not in got, f"rank {data['rank']} printed two RESULT lines\n{tail(res)}"
        got[data["rank"]] = data
    return got


def assert_ended(res: Result, bound: float = JOB_BOUND) -> None:
    assert res.returncode is not None, f"the job did not end within {bound} s\n{tail(res)}"
    assert res.elapsed < bound, tail(res)


def assert_no_leftovers(res: Result) -> None:
    assert res.leftovers == [], f"processes left behind: {res.leftovers}\n{tail(res)}"


def assert_contained(
    res: Result,
    *,
    world: int,
    failing: int,
    exc_type: str,
    message: str,
    survivors: Iterable[int] | None = None,
    bound: float = JOB_BOUND,
    spawned: bool = False,
    own: str | None = None,
) -> dict[int, dict[str, Any]]:
    """The four assertions of every failure test; returns the RESULT lines by rank.

    Args:
        failing: the rank whose code raised ``exc_type(message)``.
        survivors: the ranks that must raise PeerFailure naming it (default: all others).
        spawned: the job ran under ``tether.spawn``; its launcher must print the report
            exactly once and raise JobFailed naming the root cause.
        own: what the failing rank's RESULT says it raised, when not its own exception
            (default: ``exc_type(message)``, unchanged).
    """
    # 1. bounded, and the job says it failed
    assert_ended(res, bound)
    assert res.returncode != 0, f"a failed job must not exit 0\n{tail(res)}"
    got = results(res)
    survivors = [r for r in range(world) if r != failing] if survivors is None else list(survivors)
    # 2. every survivor raised PeerFailure naming the failing rank and its original exception
    missing = [r for r in survivors if r not in got]
    assert not missing, f"ranks {missing} printed no RESULT line\n{tail(res)}"
    for r in survivors:
        d = got[r]
        assert d["exc"] in ("PeerFailure", "PeerLost") and d["peer_failure"], f"rank {r}: {d}\n{tail(res)}"
        assert d["failing_rank"] == failing, f"rank {r} names rank {d['failing_rank']}, not {failing}: {d}"
        assert d["orig_type"] == exc_type, f"rank {r}: {d}"
        assert d["orig_msg"] == message, f"rank {r}: {d}"
        assert d["msg"].startswith(f"rank {failing} failed: {exc_type}: {message}"), f"rank {r}: {d}"
    if failing in got:  # the failing rank's own exception propagated unchanged
        if own is None:
            assert got[failing]["exc"] == exc_type and got[failing]["msg"] == message, got[failing]
        else:
            assert got[failing]["exc"] == own, got[failing]
        late = {r: round(got[r]["time"] - got[failing]["time"], 3) for r in survivors}
        assert max(late.values()) < NOTICE, f"survivors noticed late (s after the failure): {late}"
    # 3. the root cause is in the output
    headline = f"rank {failing} failed: {exc_type}: {message}"
    assert headline in res.output, f"root cause {headline!r} not in the output\n{tail(res)}"
    if spawned:
        assert res.stderr.count("tether: job failed. Root cause: " + headline) == 1, tail(res)
        launchers = [d for d in lines(res, "LAUNCHER") if d["exc"] is not None]
        assert launchers and all(d["exc"] == "JobFailed" for d in launchers), tail(res)
        assert all(d["root_rank"] == failing and d["root_type"] == exc_type for d in launchers), launchers
    # 4. nothing is left
    assert_no_leftovers(res)
    return got


def lc_events(res: Any, event: str) -> list[dict[str, Any]]:
    """A lifecycle job's ``LC {json}`` lines of one event (torchrun may prefix a line with ``[rankN]:``)."""
    found = []
    for line in res.stdout.splitlines():
        at = line.find("LC {")
        if at >= 0:
            data = json.loads(line[at + 3 :])
            if data["event"] == event:
                found.append(data)
    return found
