"""One job of ``slow_save.py``: 2 ranks (``tether.spawn``), a ``Checkpointer`` saving every 5 steps.

    python _first_save_job.py DIR

20 steps of a small model (``Linear(64, 64)``, SGD), each followed by a barrier so that
a rank held in its step holds the other too; the first periodic save comes at step 5,
split across the two ranks (every later one at 10, 15, 20). Rank 0 prints ``LC
{"event": "steps", "seconds": [...]}``: each step's time, the barrier's included.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

import tether

STEPS, EVERY = 20, 5


def rank(local_rank: int, dirname: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    saver = tether.Checkpointer({"model": model, "opt": opt}, dirname, every=EVERY)
    saver.resume()
    x = torch.randn(32, 64)
    took = []
    for it in range(1, STEPS + 1):
        began = time.monotonic()
        with saver.step(0, it):
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        tether.barrier()
        took.append(time.monotonic() - began)
    saver.wait()
    if tether.get_rank() == 0:
        os.write(1, ("LC " + json.dumps({"event": "steps", "seconds": took}) + "\n").encode())


if __name__ == "__main__":
    tether.spawn("gloo", rank, (sys.argv[1],), nproc_per_node=2)
