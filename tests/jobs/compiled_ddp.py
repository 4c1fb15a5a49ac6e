"""A DDP model under ``torch.compile`` (backend ``aot_eager``) in a job tether watches.

    python -m torch.distributed.run --nproc-per-node 2 compiled_ddp.py

Each rank trains a plain ``DistributedDataParallel`` (no tether hook) for 5 compiled steps
and emits its first weight; the test reads the job's output for dynamo's warnings. Before,
dynamo traced tether's wrapper of DDP's forward and warned "Dynamo does not know how to
trace the builtin `_thread.get_ident`" on every rank.
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
tether.finalize()
