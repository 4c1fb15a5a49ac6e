"""A wait on a store tether did not make is inside the promise: real jobs of ``jobs/store_waits.py``.

Rank 0 waits on torch's default store or a ``TCPStore`` of its own for a key rank 1 would
set; rank 1 raises, is killed, returns, or stalls. Before ``storewaits.py``, rank 0 sat in
the store's C++ wait: after a peer's exception until the ladder ended it (exit 6, no
exception of its own), after a stall until the store's timeout, ``sync_timeout`` or not.
"""

from __future__ import annotations

import sys

import pytest

import slow_resolver
from _core import lc_events
from _harness import JOBS, Result, python, run

BOUND = 60.0
NOTICE_S = 3.0  # a posted failure is heard within ms; a finished rank at the keeper's next check
SYNC_TIMEOUT = 3.0  # jobs/store_waits.py
RAW_MARGIN = 1.0  # a wait outside tether calls ends sync_timeout + this (tether/_core/rawcalls.py)
LATE_ANSWER = 1.5  # seconds the slow resolver takes per lookup: a new store connection, 3 s
SLOW_BOUND = 2 * BOUND  # each connection of the job's start-up pays the resolver too: jobs took 35-44 s
NOTICE_WITHOUT_CONNECTING_S = 1.0  # well under that: a wake that opened a connection came 4 s late
NOTICE_OPENED_FROM_WAIT_S = 2 * LATE_ANSWER  # a wake on the connection opening since the wait began

pytestmark = pytest.mark.timeout(BOUND + 60)


def _rank0_raised(res: Result) -> dict[str, object]:
    (e,) = lc_events(res, "raised")
    assert e["rank"] == 0, e
    return e


def _root_once(res: Result, root: str) -> None:
    lines = [line for line in res.stderr.splitlines() if "Root cause:" in line]
    assert len(lines) == 1 and root in lines[0], res.stderr[-3000:]


@pytest.mark.parametrize(
    ("how", "store", "op", "exc", "message"),
    [
        ("raise", "default", "get", "PeerFailure", "rank 1 failed: ValueError: bad 0.1 on rank 1"),
        ("raise", "job", "wait", "PeerFailure", "rank 1 failed: ValueError: bad 0.1 on rank 1"),
        ("kill", "own", "multi_get", "PeerLost", "rank 1 failed: SIGKILL: process killed by SIGKILL"),
        (
            "return",
            "own",
            "wait",
            "PeerFinished",
            "rank 1 failed: Finished: it returned from the function while rank 0 waits in store.wait(['k'])",
        ),
    ],
    ids=["raise", "raise-on-a-client-of-the-jobs-store", "kill", "return"],
)
def test_a_peers_failure_ends_a_wait_on_a_users_store_with_that_failure(
    how: str, store: str, op: str, exc: str, message: str
) -> None:
    res = python("store_waits.py", how, store, op, bound=BOUND)
    assert res.returncode == 7, res.output[-3000:]
    (strike,) = lc_events(res, "strike")
    e = _rank0_raised(res)
    assert e["exc"] == exc and str(e["msg"]).startswith(message), e
    assert e["failing"] == 1, e
    assert float(e["time"]) - float(strike["time"]) < NOTICE_S, (e, strike)
    _root_once(res, message.removeprefix("rank 1 failed: ").split(" while ")[0])
    assert lc_events(res, "got") == []
    assert res.leftovers == []


def test_a_stalled_peer_ends_a_wait_on_a_users_store_at_sync_timeout_naming_the_stalled_rank() -> None:
    res = python("store_waits.py", "stall", "default", "get", bound=BOUND)
    assert res.returncode == 7, res.output[-3000:]
    (began,) = lc_events(res, "waits")
    e = _rank0_raised(res)
    message = "store.get('k') timed out after 3 s: rank(s) [1] did not arrive"
    assert e["exc"] == "SyncTimeout" and str(e["msg"]).startswith(message), e
    waited = float(e["time"]) - float(began["time"])
    assert SYNC_TIMEOUT <= waited < SYNC_TIMEOUT + RAW_MARGIN + NOTICE_S, e
    _root_once(res, f"rank 1 failed: SyncTimeout: {message}")
    assert res.leftovers == []


@pytest.mark.parametrize(("store", "op"), [pytest.param("default", "get", marks=pytest.mark.full), ("own", "wait")])
def test_a_wait_on_a_users_store_returns_what_the_peer_set(store: str, op: str) -> None:
    res = python("store_waits.py", "set", store, op, bound=BOUND)
    assert res.returncode == 0, res.output[-3000:]
    assert [e["value"] for e in lc_events(res, "got")] == ["v 0.1"]
    assert lc_events(res, "raised") == []
    assert res.leftovers == []


@pytest.mark.skipif(not slow_resolver.available(), reason="the slow resolver needs root, unshare and its address")
@pytest.mark.timeout(SLOW_BOUND + 60)
@pytest.mark.parametrize(
    ("store", "op", "within"),
    [
        ("default", "get", NOTICE_WITHOUT_CONNECTING_S),
        pytest.param("job", "wait", NOTICE_WITHOUT_CONNECTING_S, marks=pytest.mark.full),
        pytest.param("own", "multi_get", NOTICE_OPENED_FROM_WAIT_S, marks=pytest.mark.full),
    ],
)
def test_a_slow_resolver_delays_a_wake_only_as_long_as_the_store_needs_a_new_connection(
    store: str, op: str, within: float
) -> None:
    # c10d looks up both ends' addresses for a new store connection: 3 s under this resolver.
    # Each wake came through one opened from the wait or at the failure
    # (storewaits._connect_soon): 4 s after the strike, on any store. The default store's,
    # and a TCPStore client's of the job's store server, now go through the main thread's
    # connection to the job's store (storewaits._twin); another store's waits for the one
    # opening since its wait began, 0.5 s before the strike: 2.5 s (benchmarks/slow_wakes.py,
    # results/slow-wakes-0ffc168.md, the code before, and results/slow-wakes.md)
    job = [sys.executable, str(JOBS / "store_waits.py"), "raise", store, op]
    res = run([sys.executable, slow_resolver.__file__, "--answer-after", str(LATE_ANSWER), *job], bound=SLOW_BOUND)
    assert res.returncode == 7, res.output[-3000:]
    (strike,) = lc_events(res, "strike")
    e = _rank0_raised(res)
    message = "rank 1 failed: ValueError: bad 0.1 on rank 1"
    assert e["exc"] == "PeerFailure" and str(e["msg"]).startswith(message), e
    assert float(e["time"]) - float(strike["time"]) < within, (e, strike)
    _root_once(res, "ValueError: bad 0.1 on rank 1")
    assert res.leftovers == []
