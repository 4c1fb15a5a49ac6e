"""A ``tether.spawn`` job whose launcher gets a SIGTERM, started with a given start method.

    python spawn_stop.py forkserver|spawn|fork [finalize]

Once both ranks passed a barrier, rank 0 sends the launcher a SIGTERM (a scheduler's
stop); the launcher forwards it to every rank, which wait in a second barrier. With
"fork" the workers inherited the launcher's own handler, which forwarded the stop again
from the worker and never raised: "job failed. Root cause: rank 1 failed: RecursionError".

With ``finalize`` both ranks return, and rank 1 sends the SIGTERM from its clean
``finalize()`` (where it records its leave), and waits there for the launcher's forward:
the rank exited 143 without a record of its own, and the launcher told the stop as a
failure, "job failed. Root cause: rank 1 failed: SystemExit: process exited with code 143"
(seen under load, when the second barrier completed before the forward came).
"""

import os
import signal
import sys
import time
from typing import Any

import tether
from tether._core.channel import Channel


def stop_in_the_leave(leave: Any) -> Any:
    def leaving(self: Channel, *args: Any, **kwargs: Any) -> Any:
        os.kill(int(os.environ["SPAWN_STOP_LAUNCHER"]), signal.SIGTERM)
        time.sleep(5.0)  # the launcher's forward lands here
        return leave(self, *args, **kwargs)

    return leaving


def work(local_rank: int, where: str) -> None:
    tether.barrier()
    if where == "finalize":
        if tether.get_rank() == 1:
            Channel.leave = stop_in_the_leave(Channel.leave)  # type: ignore[method-assign]
        return
    if tether.get_rank() == 0:
        os.kill(int(os.environ["SPAWN_STOP_LAUNCHER"]), signal.SIGTERM)
    tether.barrier()


if __name__ == "__main__":
    os.environ["SPAWN_STOP_LAUNCHER"] = str(os.getpid())
    where = sys.argv[2] if len(sys.argv) > 2 else "barrier"
    tether.spawn("gloo", work, (where,), nproc_per_node=2, start_method=sys.argv[1])
