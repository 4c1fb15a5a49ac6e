"""Watchdog threads that get the CPU only after ``finalize``: ``lifecycle_late_threads.py``.

Two fresh rank processes ``tether.initialize("gloo", init_method="tcp://...")``, reduce
and ``finalize``. Fault injection: each rank's listener and keeper begin their work 5 s
late, as threads kept from the CPU on a loaded machine do (CI, 2 cores, three jobs at a
time): by then ``finalize`` has returned and rank 0, the store's host, has closed the
store. Before the fix each thread opened its store connection as it began, and c10d's
connect retries until the connection's timeout (a year, tether's): CI saw rank 0's keeper
still connecting when the exit had waited 10 s for it (2026-12-07), and the exit's warning
that Python's teardown may abort the process. With this job, at 57ebead, both threads of
both ranks were.

Each rank prints ``TEARDOWN <rank> <tether threads still running>`` right before Python's
teardown (``lifecycle_common.TEARDOWN_REPORT``); the parent prints ``EXIT <rank> <code>``
and ``STDERR <rank>: <line>`` for each rank.
"""

from __future__ import annotations

from lifecycle_common import TEARDOWN_REPORT, run_pair

RANK = (
    TEARDOWN_REPORT
    + """
import os, sys, time

import tether
from tether._core import watchdog

rank = int(sys.argv[2])
LATE = 5.0

def late(body):
    def run(*args):
        time.sleep(LATE)  # the thread's first turn on the CPU
        body(*args)
    return run

watchdog.Watchdog._listen = late(watchdog.Watchdog._listen)
watchdog.Watchdog._keep = late(watchdog.Watchdog._keep)
tether.initialize("gloo", init_method=sys.argv[1], rank=rank, world_size=2)
assert tether.all_reduce(rank + 1) == 3
tether.finalize()
os.write(1, b"RETURNED %d\\n" % rank)
"""
)


def main() -> None:
    run_pair(RANK)


if __name__ == "__main__":
    main()
