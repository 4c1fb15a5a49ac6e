"""The store's host that leaves first stays until every rank has left (``ending._outlive_job``).

A plain ``env://`` job's rank 0 hosts the store. Leaving without ``finalize`` (its script
ends, or ``os._exit(0)``) it took the store with it: a peer still at work was ended with
``StoreLost`` and exit 6 (``os._exit(0)``), or logged C++ warnings and "finalize could not
record a clean exit" (a plain return), before this test. Now the host stays until the others
left, and a peer that waits for it learns that it finished. A rank that never registered
(an adopted group where it never called tether) is not waited for.

Job: ``tests/jobs/host_leaves_first.py``.
"""

from __future__ import annotations

import pytest

from _core import lc_events as events
from _harness import Result, python

BOUND = 60.0
NOTICE_S = 3.0  # 0.5 s before the first check of finished ranks + a keeper period, with slack
WORK = 6.0  # seconds rank 1 works on: past ending.NOTE_AFTER, so the host says why it stays

pytestmark = pytest.mark.timeout(BOUND + 60)

# what a peer that lost the store prints
HARM = ("StoreLost", "TCPStore.cpp", "could not record", "Traceback", "lost")


def ended(res: Result) -> dict[int, dict[str, float]]:
    return {e["rank"]: e for e in events(res, "ended")}


# one way of leaving per test in the default run (os._exit and the exit functions are two
# call sites), the other under --full
@pytest.mark.parametrize("how", ["os-exit0", pytest.param("return", marks=pytest.mark.full)])
def test_a_store_host_that_leaves_first_keeps_the_store_until_its_peer_finalized(how: str) -> None:
    res = python("host_leaves_first.py", how, "finalize", bound=BOUND, env={"HOST_FIRST_WORK": str(WORK)})
    assert res.returncode == 0, res.output[-3000:]
    (worked,) = events(res, "worked")
    assert worked["seconds"] >= WORK, worked
    assert len(events(res, "finalized")) == 1, res.output[-3000:]  # rank 1's finalize returned
    ends = ended(res)
    assert (ends[0]["code"], ends[1]["code"]) == (0, 0), ends
    # the host's process ended only once its peer had left, in its finalize
    assert ends[0]["time"] >= worked["time"], (ends, worked)
    assert not [s for s in res.stderr.splitlines() if any(h in s for h in HARM)], res.stderr[-3000:]
    # and says why its process lives on, once
    note = "tether: rank 0 hosts the job's store and stays until every rank has finished"
    assert res.stderr.count(note) == 1 and "still working: rank(s) 1" in res.stderr, res.stderr[-3000:]
    assert res.leftovers == []


@pytest.mark.parametrize(
    ("how", "story"),
    [("return", "exited without finalize()"), pytest.param("os-exit0", "called os._exit(0)", marks=pytest.mark.full)],
)
def test_a_peer_that_waits_for_a_store_host_that_left_first_raises_peer_finished(how: str, story: str) -> None:
    res = python("host_leaves_first.py", how, "barrier", bound=BOUND)
    assert res.returncode == 1, res.output[-3000:]
    assert res.elapsed < BOUND
    (waits,) = events(res, "waits")
    (e,) = events(res, "raised")
    assert (e["rank"], e["exc"], e["failing"]) == (1, "PeerFinished", 0), e
    message = f"rank 0 failed: Finished: it {story} while rank 1 waits in barrier #2"
    assert e["msg"] == message, e
    assert float(e["time"]) - float(waits["time"]) < NOTICE_S, (e, waits)
    assert message in res.stderr, res.stderr[-3000:]
    assert "StoreLost" not in res.output, res.output[-3000:]
    ends = ended(res)
    assert ends[0]["code"] == 0 and ends[1]["code"] not in (0, None), ends
    assert res.leftovers == []


@pytest.mark.parametrize("after", ["exit", "finalize"])
def test_a_store_host_does_not_wait_for_a_rank_that_never_called_tether(after: str) -> None:
    # its finalize waited for good before this test (rank 0 killed at the bound)
    res = python("host_leaves_first.py", "adopted", after, bound=BOUND)
    assert res.returncode == 0, res.output[-3000:]
    (adopted,) = events(res, "adopted")
    assert adopted["world"] == 2, adopted
    ends = ended(res)
    # rank 1 sleeps 3 s (the job's default) from rank 0's adoption and never leaves in
    # tether's sense: rank 0 went before it
    assert ends[0]["code"] == 0 and ends[0]["time"] < ends[1]["time"], ends
    assert res.leftovers == []
