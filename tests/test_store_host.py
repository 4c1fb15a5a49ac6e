"""A store tether hosts answers every client while a new one connects (``stores.serve``).

c10d's server looks up each new client's address (a reverse lookup) on the one thread that
answers every request, and its dual-stack socket sees a loopback client as
``::ffff:127.0.0.1``, which ``/etc/hosts`` does not name: the lookup goes to the resolver,
and while it waits, no rank's store call is answered. Under a resolver 0.5 s late, every
connection a rank opened stalled every other rank's store for 0.5 s (a job's start:
``benchmarks/slow_start.py``). A store tether hosts now listens on an IPv4 socket of its
own: the client is ``127.0.0.1``, which ``/etc/hosts`` names.

Job: ``tests/jobs/store_host.py``, under ``tests/slow_resolver.py --answer-after``.
"""

from __future__ import annotations

import sys

import pytest

import slow_resolver
from _core import lc_events
from _harness import JOBS, run

LATE_ANSWER = 0.5  # seconds the resolver takes per lookup
BOUND = 120.0  # every connection of the job's start pays the resolver too
# rank 0's slowest round trip while rank 1 connects: one lookup on the server's thread
# stalled it LATE_ANSWER (0.50 s at the commit before this test); a round trip on loopback
# takes about a millisecond, up to tens on a loaded machine
STALL_LIMIT = LATE_ANSWER / 2

pytestmark = [
    pytest.mark.timeout(BOUND + 60),
    pytest.mark.skipif(not slow_resolver.available(), reason="the slow resolver needs root, unshare and its address"),
]


@pytest.mark.parametrize("how", ["spawn", pytest.param("initialize", marks=pytest.mark.full)])
def test_a_store_tether_hosts_answers_while_a_new_client_connects_under_a_slow_resolver(how: str) -> None:
    job = [sys.executable, str(JOBS / "store_host.py"), how]
    res = run([sys.executable, slow_resolver.__file__, "--answer-after", str(LATE_ANSWER), *job], bound=BOUND)
    assert res.returncode == 0, res.output[-3000:]
    (connected,) = lc_events(res, "connected")
    # the resolver was slow for this job: each new client waited for its own lookup
    assert min(connected["took"]) >= LATE_ANSWER, connected
    (trips,) = lc_events(res, "trips")
    assert trips["n"] > 10 and trips["slowest"] < STALL_LIMIT, (trips, connected)
    assert res.leftovers == []
