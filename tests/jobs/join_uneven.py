"""Uneven data the way the migration guide advises: DDP under ``torch.distributed.algorithms.Join``.

    python join_uneven.py

``tether.spawn``, 2 ranks, a DDP model from ``auto_model``: rank 0 trains 5 steps, rank 1
trains 8, inside ``Join([model])``, which makes rank 0 shadow rank 1's last 3 all-reduces.
Each rank then reports its weights (``LC weights``); both must be equal and the job must
end cleanly. ``Join`` issues an async all-reduce in each forward that DDP's reducer waits
for in C++ and keeps: the exit took it for a work still in flight (``_core/lent.py``).
"""

import torch
from lifecycle_common import emit
from torch.distributed.algorithms.join import Join

import tether


def fn(local_rank: int) -> None:
    rank = tether.get_rank()
    torch.manual_seed(0)  # the same initial weights and data on every rank
    model = tether.auto_model(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = 5 if rank == 0 else 8
    with Join([model]):
        for _ in range(steps):
            loss = model(torch.randn(8, 4) * (rank + 1)).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    emit("weights", rank=rank, steps=steps, weights=model.module.weight.detach().flatten().tolist())


if __name__ == "__main__":
    tether.spawn("gloo", fn, (), nproc_per_node=2)
