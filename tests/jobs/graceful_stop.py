"""A preemption the user's code takes gracefully: every rank stops after the same step, and exits 0.

    python graceful_stop.py

``tether.spawn`` (``max_restarts=1``), 2 ranks, DDP. Each rank's SIGTERM handler sets a
flag; after each step the ranks all-reduce their flags and stop together. After step 20
rank 0 SIGTERMs the launcher, which forwards it to every rank. Each rank reports
``LC stopped`` with its last step.
"""

import os
import signal
import time

import torch
from lifecycle_common import emit

import tether


def fn(local_rank: int) -> None:
    asked: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: asked.append(signum))
    rank = tether.get_rank()
    model = tether.auto_model(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(10_000):
        loss = model(torch.randn(8, 4)).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step == 20 and rank == 0:
            os.kill(int(os.environ["GRACEFUL_STOP_LAUNCHER"]), signal.SIGTERM)
        if tether.all_reduce(float(len(asked))) > 0:  # one rank asked: all stop after this step
            emit("stopped", rank=rank, step=step)
            return
        time.sleep(0.002)


if __name__ == "__main__":
    os.environ["GRACEFUL_STOP_LAUNCHER"] = str(os.getpid())
    tether.spawn("gloo", fn, (), nproc_per_node=2, max_restarts=1)
    emit("launcher returned")
