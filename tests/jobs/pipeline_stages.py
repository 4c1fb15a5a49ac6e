"""A two-stage pipeline (``torch.distributed.pipelining``, GPipe) whose stage 1 stalls (torchrun, 2 ranks).

    torchrun --nproc_per_node 2 pipeline_stages.py

Each rank holds one stage, a ``Linear(8, 8)``; a step sends two microbatches' activations
forward and their gradients back with ``batch_isend_irecv``, and waits on those works
with ``wait()``, no timeout given. Two steps run on both ranks; before the third, rank 1
stalls in user code, and rank 0 waits for its gradients: gloo's point-to-point works
ignore the group's timeout, so with ``sync_timeout=TIMEOUT`` only tether's bound ends
the wait (before: still waiting 54 s later).
"""

import os
import time

import torch
import torch.distributed as dist
from lifecycle_common import emit, raised
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

import tether

TIMEOUT = 3.0


def main() -> None:
    tether.initialize("gloo", sync_timeout=TIMEOUT)
    rank = dist.get_rank()
    torch.manual_seed(0)
    stages = [torch.nn.Linear(8, 8) for _ in range(2)]
    stage = PipelineStage(stages[rank], rank, 2, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=lambda out, target: ((out - target) ** 2).mean())
    x, target = torch.full((4, 8), 0.1), torch.zeros(4, 8)
    for step in range(3):
        began = time.time()
        try:
            if step == 2 and rank == 1:
                emit("fault", rank=rank, time=began)
                time.sleep(60)
            if rank == 0:
                schedule.step(x)
            else:
                schedule.step(target=target)
        except BaseException as exc:
            raised(rank, exc, after=time.time() - began, step=step, pid=os.getpid())
            raise
        emit("step", rank=rank, step=step)


if __name__ == "__main__":
    main()
