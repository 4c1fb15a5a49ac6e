"""A ``tether.spawn`` job whose launcher gets a SIGTERM, started with a given start method.

    python spawn_stop.py forkserver|spawn|fork

Once both ranks passed a barrier, rank 0 sends the launcher a SIGTERM (a scheduler's
stop); the launcher forwards it to every rank, which wait in a second barrier. With
"fork" the workers inherited the launcher's own handler, which forwarded the stop again
from the worker and never raised: "job failed. Root cause: rank 1 failed: RecursionError".
"""

import os
import signal
import sys

import tether


def work(local_rank: int) -> None:
    tether.barrier()
    if tether.get_rank() == 0:
        os.kill(int(os.environ["SPAWN_STOP_LAUNCHER"]), signal.SIGTERM)
    tether.barrier()


if __name__ == "__main__":
    os.environ["SPAWN_STOP_LAUNCHER"] = str(os.getpid())
    tether.spawn("gloo", work, (), nproc_per_node=2, start_method=sys.argv[1])
