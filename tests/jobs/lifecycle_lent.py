"""A collective's tensors still with gloo's worker at exit (``_core/lent.py``): ``lifecycle_lent.py ROUNDS [never]``.

Each round starts 2 fresh rank processes (``tcp://``, no ``finalize``). Rank 1 issues a
raw ``dist.all_reduce(..., async_op=True)`` that it never waits for and returns. Its last
exit handler is ``sum(range(...))``: C code that holds the GIL for about 2 s. Rank 0
joins the all-reduce 1 s after rank 1 issued it, by then inside that handler. So rank 1's
gloo worker finishes the work, and needs the GIL to drop its tensor, while the main
thread holds the GIL into Python's teardown: without tether's wait the worker is ended by
``pthread_exit`` and the process aborts ("terminate called without an active exception",
exit status -6), 3 times in 3 on 5000ea6's ``src``.

``lifecycle_lent.py ROUNDS never``: rank 0 never joins (it exits 5 s later), and there is
no such handler: rank 1's exit waits for the work up to ``lent.SETTLE`` and warns.

``lifecycle_lent.py ROUNDS ddp``: both ranks build a ``DistributedDataParallel`` (its
constructor broadcasts the parameters through a raw call, and its reducer keeps them),
train one step, and return 2.5 s later: the exit must not wait for those finished calls
(it waited 2 s and warned, on e820c40's ``src``).

Prints ``EXIT <round> <rank> <code>``, ``STDERR <round> <rank>: <line>``
(``lifecycle_common.run_pair``), ``RETURNED <rank> <time>`` and, from an exit handler
that runs after tether's, ``AFTER-TETHER <rank> <time>``.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from lifecycle_common import run_pair

RANK = """
import atexit, os, sys, time
from pathlib import Path
never = @NEVER@
if not never:
    atexit.register(sum, range(150_000_000))  # the last exit handler: C code holding the GIL for seconds
atexit.register(lambda: os.write(1, b"AFTER-TETHER %s %.3f\\n" % (sys.argv[2].encode(), time.time())))
import torch, torch.distributed as dist
import tether

marker = Path(@MARKER@)
rank = int(sys.argv[2])
tether.initialize("gloo", init_method=sys.argv[1], rank=rank, world_size=2)
tether.barrier()
if rank == 1:
    dist.all_reduce(torch.full((4,), 0.1), async_op=True)  # never waited for
    marker.touch()
else:
    while not marker.exists():
        time.sleep(0.005)
    if never:
        time.sleep(5.0)  # and never joins: rank 1 has exited by then
    else:
        time.sleep(1.0)  # rank 1 is in its last exit handler by now, or (fixed) in tether's wait
        t = torch.full((4,), 0.1)
        dist.all_reduce(t)
        assert abs(t[0].item() - 0.2) < 1e-6, t
os.write(1, b"RETURNED %d %.3f\\n" % (rank, time.time()))
"""


DDP_RANK = """
import atexit, os, sys, time
atexit.register(lambda: os.write(1, b"AFTER-TETHER %s %.3f\\n" % (sys.argv[2].encode(), time.time())))
import torch
from torch.nn.parallel import DistributedDataParallel
import tether

rank = int(sys.argv[2])
tether.initialize("gloo", init_method=sys.argv[1], rank=rank, world_size=2)
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)))
model(torch.full((4, 8), 0.1)).sum().backward()
time.sleep(2.5 + 0.3 * rank)  # the constructor's calls finished more than lent.SETTLE ago; rank 1 prints last
os.write(1, b"RETURNED %d %.3f\\n" % (rank, time.time()))
"""


def main() -> None:
    mode = sys.argv[2:3]
    for k in range(int(sys.argv[1])):
        with tempfile.TemporaryDirectory() as tmp:
            if mode == ["ddp"]:
                run_pair(DDP_RANK, label=f"{k} ")
                continue
            program = RANK.replace("@MARKER@", repr(str(Path(tmp) / "issued")))
            run_pair(program.replace("@NEVER@", repr(mode == ["never"])), label=f"{k} ")


if __name__ == "__main__":
    main()
