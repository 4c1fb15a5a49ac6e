"""Watchdog threads that get the CPU only after ``finalize``: ``lifecycle_late_threads.py``.

Two fresh rank processes ``tether.initialize("gloo", init_method="tcp://...")``, reduce and
``finalize``. Fault injection: each rank's listener and keeper begin their work 5 s late,
as threads kept from the CPU on a loaded machine do (CI, 2 cores, three jobs at a time):
by then ``finalize`` has returned and rank 0, the store's host, has closed the store.
Before the fix each thread opened its store connection as it began, and c10d's connect
retries until the store's timeout: CI saw rank 0's keeper still connecting when the exit
had waited 10 s for it (2026-12-07), and the exit's warning that Python's teardown may
abort the process. With this job, at 57ebead, both threads of both ranks were.

Each rank prints ``TEARDOWN <rank> <tether threads still running>`` from an ``atexit``
function registered before tether's (so it runs after it, right before the teardown); the
parent prints ``EXIT <rank> <code>`` and ``STDERR <rank>: <line>`` for each rank.
"""

from __future__ import annotations

from lifecycle_common import run_pair

RANK = """
import atexit, os, sys, threading, time

def at_teardown():
    running = sorted(t.name for t in threading.enumerate() if t.name.startswith("tether-"))
    os.write(1, f"TEARDOWN {sys.argv[2]} {running}\\n".encode())

atexit.register(at_teardown)

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


def main() -> None:
    run_pair(RANK)


if __name__ == "__main__":
    main()
