"""auto_model / auto_optim / auto_dataloader in a real job: ``tether.spawn`` of 3 ranks.

Each rank prints one ``AUTO {json}`` line with what it observed; ``tests/test_auto.py``
checks them.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from torch.utils.data import DistributedSampler, RandomSampler

import tether as idist

NPROC = 3


def emit(data: dict[str, Any]) -> None:
    os.write(1, f"AUTO {json.dumps(data, sort_keys=True)}\n".encode())


def body(local_rank: int) -> None:
    rank, world = idist.get_rank(), idist.get_world_size()
    out: dict[str, Any] = {"rank": rank}

    torch.manual_seed(rank)  # different initial weights: DDP must broadcast rank 0's
    model = idist.auto_model(torch.nn.Linear(4, 1))
    out["model"] = type(model).__name__
    first = torch.cat([p.detach().flatten() for p in model.parameters()])
    out["same_init"] = all(torch.equal(first, t) for t in idist.all_gather(first).view(world, -1))
    try:
        idist.auto_model(torch.nn.BatchNorm1d(4), sync_bn=True)
    except ValueError as exc:
        out["sync_bn_cpu"] = str(exc)
    optimizer = idist.auto_optim(torch.optim.SGD(model.parameters(), lr=0.1))
    out["optim_same"] = optimizer.param_groups[0]["params"][0] is next(model.parameters())

    data = torch.arange(30, dtype=torch.float32).view(30, 1).repeat(1, 4)
    dataset = torch.utils.data.TensorDataset(data, torch.ones(30, 1))
    loader = idist.auto_dataloader(dataset, batch_size=30, num_workers=4, shuffle=False)
    out["batch_size"], out["num_workers"] = loader.batch_size, loader.num_workers
    out["sampler"] = type(loader.sampler).__name__
    out["pin_memory"] = loader.pin_memory
    loader.num_workers = 0  # iterate in-process: the split is what is checked
    mine = [int(x) for x, _ in loader for x in x[:, 0].tolist()]
    out["indices"] = mine

    for x, y in loader:  # one epoch of DDP: gradients are averaged, weights stay equal
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    after = torch.cat([p.detach().flatten() for p in model.parameters()])
    out["same_after_step"] = all(torch.allclose(after, t) for t in idist.all_gather(after).view(world, -1))

    proxy = idist.auto_dataloader(list(range(10)), batch_size=3, sampler=RandomSampler(range(10)))
    out["proxy_sampler"] = type(proxy.sampler).__name__
    proxy.sampler.set_epoch(1)
    state = torch.get_rng_state()  # (iterating a DataLoader draws its base seed from it: the sampler alone)
    out["proxy_sampled"] = list(proxy.sampler)
    out["rng_untouched"] = torch.equal(state, torch.get_rng_state())
    out["proxy"] = [i for batch in proxy for i in batch.tolist()]

    given = DistributedSampler(list(range(6)), num_replicas=world, rank=rank, shuffle=False)
    out["given_kept"] = idist.auto_dataloader(list(range(6)), sampler=given).sampler is given
    emit(out)
    idist.barrier()


if __name__ == "__main__":
    idist.spawn("gloo", body, (), nproc_per_node=NPROC)
