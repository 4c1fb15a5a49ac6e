"""A DDP model under ``torch.compile`` (backend ``aot_eager``) in a job tether watches.

    python -m torch.distributed.run --nproc-per-node 2 compiled_ddp.py

Each rank trains a plain ``DistributedDataParallel`` (no tether hook) for 5 compiled steps
and emits its first weight; the test reads the job's output for dynamo's warnings. Before,
dynamo traced tether's wrapper of DDP's forward and warned "Dynamo does not know how to
trace the builtin `_thread.get_ident`" on every rank. Then it compiles, with
``fullgraph=True`` (a graph break raises), a function that all-reduces through torch's
functional collectives and waits (``AsyncCollectiveTensor.wait()``: dynamo puts the
module's ``wait_tensor``, tether's wrapper, in the graph) and emits the result.
"""

from __future__ import annotations

import torch
from lifecycle_common import emit
from torch.nn.parallel import DistributedDataParallel

import tether

tether.initialize("gloo")
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
compiled = torch.compile(model, backend="aot_eager")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.full((8, 16), 0.1)
for _ in range(5):
    opt.zero_grad()
    compiled(x).sum().backward()
    opt.step()
emit("trained", rank=tether.get_rank(), weight=model.module[0].weight[0, 0].item())

import torch.distributed._functional_collectives as funcol  # noqa: E402 (after the start: wrapped on import)


def reduced(t: torch.Tensor) -> torch.Tensor:
    return funcol.all_reduce(t * 0.1, "sum", torch.distributed.group.WORLD).wait() + 1


compiled_reduce = torch.compile(reduced, backend="aot_eager", fullgraph=True)
emit("funcol", rank=tether.get_rank(), value=compiled_reduce(x[0, :2]).tolist())
tether.finalize()
