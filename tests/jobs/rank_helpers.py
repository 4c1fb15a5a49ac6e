"""Ranks that start helper processes of their own; rank 1 raises.

    python rank_helpers.py spawn|torchrun

Each of 2 ranks starts a ``sleep 600`` (a logger, a ``tensorboard``), a shell that runs
one (a grandchild) and a ``sleep 600`` in a session of its own (a daemon by intent), and
emits their pids; rank 1 then raises. Before, every helper outlived the job, holding its
stdout: the test's read of it never ended. Under torchrun the job runs as torchrun's
worker script (``python -m torch.distributed.run ... rank_helpers.py torchrun``).
"""

from __future__ import annotations

import subprocess
import sys

from lifecycle_common import emit, raised

import tether


def train(local_rank: int) -> None:
    rank = tether.get_rank()
    helper = subprocess.Popen(["sleep", "600"])
    shell = subprocess.Popen(["sh", "-c", "sleep 600; echo never"])  # its sleep is the grandchild
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}  # as a daemon: not the job's output
    detached = subprocess.Popen(["sleep", "600"], start_new_session=True, **quiet)  # type: ignore[call-overload]
    emit("helpers", rank=rank, ours=[helper.pid, shell.pid], detached=detached.pid)
    try:
        tether.barrier()  # in the try: rank 1 may leave it first, and its failure reach rank 0 in it
        if rank == 1:
            raise ValueError("injected failure 0.1 on rank 1")
        tether.barrier()
    except BaseException as exc:
        raised(rank, exc)
        raise


if __name__ == "__main__":
    if sys.argv[1] == "spawn":
        tether.spawn("gloo", train, (), nproc_per_node=2)
    else:
        tether.initialize("gloo")
        train(0)
        tether.finalize()
