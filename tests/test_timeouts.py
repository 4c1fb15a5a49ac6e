"""Who a timeout names: the rank that came late, never one that waited (issue 8, item 2)."""

from __future__ import annotations

import re

import pytest

from _core import lc_events
from _harness import python

BOUND = 60.0


@pytest.mark.timeout(BOUND + 30)
def test_a_rank_that_arrives_after_the_timeout_but_before_the_verdict_asks_is_named_as_late() -> None:
    res = python("late_arrival.py", bound=BOUND)
    assert res.returncode == 7 and res.elapsed < BOUND, res.output[-3000:]  # JobFailed, exit code 7
    raised = {e["rank"]: e for e in lc_events(res, "raised")}
    assert sorted(raised) == [0, 1], res.output[-3000:]
    for e in raised.values():  # the same verdict on both ranks: rank 1 came last
        assert e["exc"] == "SyncTimeout" and (e["missing"], e["late"], e["stalled"]) == ([], [1], [1]), e
        assert str(e["msg"]).startswith("barrier #2 timed out after 1 s: rank(s) [1] arrived only after it expired")
    root = re.findall(r"Root cause: rank (\d) failed: SyncTimeout: (.*)", res.stderr)
    assert root == [("1", "barrier #2 timed out after 1 s: rank(s) [1] arrived only after it expired")], res.stderr
    assert "  rank 1: ROOT CAUSE: SyncTimeout" in res.stderr
    assert "  rank 0: stopped: TIMEOUT (exited with code 4)" in res.stderr
    assert res.leftovers == []


@pytest.mark.timeout(BOUND + 30)
def test_a_timeout_whose_missing_rank_waits_elsewhere_names_the_rank_that_one_waits_for() -> None:
    # rank 3's barrier on [2, 3] expires first, rank 2 waiting in a barrier on [0, 2] for the
    # stalled rank 0: on c9c640d's src every rank raised "rank(s) [2] did not arrive"
    res = python("chained_timeouts.py", bound=BOUND)
    assert res.returncode == 7 and res.elapsed < BOUND, res.output[-3000:]  # JobFailed, exit code 7
    raised = {e["rank"]: e for e in lc_events(res, "raised")}
    assert sorted(raised) == [1, 2, 3], res.output[-3000:]  # rank 0 never leaves its sleep: ended
    for e in raised.values():  # one verdict everywhere: rank 0's, posted by a wait that holds it
        assert e["exc"] == "SyncTimeout" and e["stalled"] == [0], e
        assert "rank(s) [0] did not arrive" in str(e["msg"]), e
    root = re.findall(r"Root cause: rank (\d) failed: SyncTimeout: (.*)", res.stderr)
    assert len(root) == 1 and root[0][0] == "0" and "rank(s) [0] did not arrive" in root[0][1], res.stderr[-3000:]
    assert "  rank 0: ROOT CAUSE: SyncTimeout" in res.stderr, res.stderr[-3000:]
    for r in (1, 2, 3):
        assert f"  rank {r}: stopped: TIMEOUT (exited with code 4)" in res.stderr, res.stderr[-3000:]
    assert res.leftovers == []


@pytest.mark.timeout(BOUND + 30)
def test_a_timeout_asks_again_after_holding_for_other_verdicts_and_names_the_rank_that_stalled_meanwhile() -> None:
    # ranks 0 and 2 were in store waits when rank 1's barrier expired, and moved on while
    # its verdict held: rank 2 to a stall, rank 0 to a reduce waiting for it. On the src
    # before, the verdict used its first answers: "rank(s) [0, 2] did not arrive", root rank 0
    res = python("moved_on.py", bound=BOUND)
    assert res.returncode == 7 and res.elapsed < BOUND, res.output[-3000:]  # JobFailed, exit code 7
    raised = {e["rank"]: e for e in lc_events(res, "raised")}
    assert sorted(raised) == [1], res.output[-3000:]  # ranks 0 and 2 never leave C++ / their sleep: ended
    e = raised[1]
    assert e["exc"] == "SyncTimeout" and (e["stalled"], e["missing"], e["waiting"]) == ([2], [0, 2], [0]), e
    assert "rank 0: in dist.all_reduce (outside tether)" in str(e["msg"]), e
    root = re.findall(r"Root cause: rank (\d) failed: SyncTimeout: (.*)", res.stderr)
    assert len(root) == 1 and root[0][0] == "2", res.stderr[-3000:]
    assert root[0][1].startswith("barrier #2 timed out after 2 s: rank(s) [2] did not arrive"), root
    assert "  rank 2: ROOT CAUSE: SyncTimeout" in res.stderr, res.stderr[-3000:]
    assert "  rank 1: stopped: TIMEOUT (exited with code 4)" in res.stderr, res.stderr[-3000:]
    assert "  rank 0: stopped: WATCHDOG (exited with code 6)" in res.stderr, res.stderr[-3000:]
    assert res.leftovers == []
