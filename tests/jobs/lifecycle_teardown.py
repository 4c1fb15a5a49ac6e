"""Watchdog threads at Python's teardown: ``lifecycle_teardown.py [slow|late]``.

Two fresh rank processes ``tether.initialize("gloo", init_method="tcp://...")``, reduce and
``finalize``, with one of two fault injections:

* ``slow`` (the default), a watchdog thread slow to stop is waited for before Python's
  teardown. Once stopped, each rank's listener thread stays in a torch call (a store wait
  that a timer ends), as one left waiting for the CPU on a loaded machine does, past
  ``stop``'s 1 s join: rank 0's for 1.2 s, so that it comes out during the teardown, rank
  1's for 4 s, past the rest of ``finalize`` and the exit even on a loaded machine. Each
  rank also keeps 20,000 torch stores alive until Python's teardown, as a DDP model keeps
  its process group: their destructors let go of the GIL there, the window in which a
  daemon thread coming out of a torch call aborts the process ("terminate called without
  an active exception", seen in CI). Before the fix rank 0 aborted that way (9 of 9 runs,
  an idle machine) and rank 1's listener was still running at the teardown.
* ``late``, watchdog threads that get the CPU only after ``finalize``. Each rank's listener
  and keeper begin their work 5 s late, as threads kept from the CPU on a loaded machine do
  (CI, 2 cores, three jobs at a time): by then ``finalize`` has returned and rank 0, the
  store's host, has closed the store. Before the fix each thread opened its store
  connection as it began, and c10d's connect retries until the connection's timeout (a
  year, tether's): CI saw rank 0's keeper still connecting when the exit had waited 10 s
  for it (2026-12-07), and the exit's warning that Python's teardown may abort the
  process. With this job, at 57ebead, both threads of both ranks were.

Each rank prints ``TEARDOWN <rank> <tether threads still running>`` right before Python's
teardown (``lifecycle_common.TEARDOWN_REPORT``) and ``RETURNED <rank>`` once ``finalize``
returned; the parent prints ``EXIT <rank> <code>`` and ``STDERR <rank>: <line>`` for each
rank.
"""

from __future__ import annotations

import sys

from lifecycle_common import TEARDOWN_REPORT, run_pair

START = """
import datetime, os, sys, threading, time

import torch.distributed as dist
import tether
from tether._core import watchdog

rank = int(sys.argv[2])
"""

SLOW = """
HOLD = 1.2 if rank == 0 else 4.0
side = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=30))
setter = dist.TCPStore("127.0.0.1", side.port, 1, False, timeout=datetime.timedelta(seconds=30))  # its own connection
listen = watchdog.Watchdog._listen

def slow_listen(self, client):
    listen(self, client)
    # the stopped listener, still in a torch call until a timer sets the key it waits for;
    # not a wait that times out: c10d's timeout warning looks up the socket's host name,
    # and a resolver that does not answer (CI, once) held the thread 10 s more
    timer = threading.Timer(HOLD, setter.set, ("released", "1"))
    timer.start()
    side.wait(["released"], datetime.timedelta(seconds=30))
    # the timer is a daemon thread (as the listener that made it) in a torch call of its
    # own: on a loaded machine it came out of ``set`` after the teardown began, and aborted
    # rank 1 the way this test guards against (seen once in a fresh clone, 2026-12-06)
    timer.join()

watchdog.Watchdog._listen = slow_listen
tether.initialize("gloo", init_method=sys.argv[1], rank=rank, world_size=2)
assert tether.all_reduce(rank + 1) == 3
kept = [dist.HashStore() for _ in range(20000)]  # freed in the teardown
"""

LATE = """
def late(body):
    def run(*args):
        time.sleep(5.0)  # the thread's first turn on the CPU
        body(*args)
    return run

watchdog.Watchdog._listen = late(watchdog.Watchdog._listen)
watchdog.Watchdog._keep = late(watchdog.Watchdog._keep)
tether.initialize("gloo", init_method=sys.argv[1], rank=rank, world_size=2)
assert tether.all_reduce(rank + 1) == 3
"""

END = """
tether.finalize()
os.write(1, b"RETURNED %d\\n" % rank)
"""


def main(mode: str) -> None:
    run_pair(TEARDOWN_REPORT + START + {"slow": SLOW, "late": LATE}[mode] + END)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "slow")
