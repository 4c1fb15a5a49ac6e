"""Gradients as views of tether's all-reduce result (``tether/_grad_views.py``), beside plain DDP.

    python grad_views.py [NPROC]      (tether.spawn, 2 ranks by default)

Each rank builds, from the same weights, a plain DDP (torch's built-in all-reduce, the
reference) and four guarded ones (``tether.register_comm_hook``): zeroed with
``set_to_none=True``, zeroed with ``set_to_none=False``, one with
``find_unused_parameters=True`` and one with ``gradient_as_bucket_view=True`` (no views
of tether's: the latter's are DDP's own). Every step feeds all five the same batch
(each rank its own), and the rank reports, per step:

* ``exact``: every guarded gradient and weight bitwise equal to plain DDP's;
* ``views``: per guarded model, which gradients are views of a buffer of tether's;
* ``buffer``: the data pointer of the set_to_none=True model's buffer (reused or not);
* ``same_tensor``: whether the set_to_none=False model kept each ``.grad`` tensor;
* ``kept_intact``: the large gradient, kept (not cloned) after ``zero_grad()`` at step
  1, still holds step 1's values after the later steps.
"""

from __future__ import annotations

import copy
import sys

import torch
import torch.nn as nn
from lifecycle_common import emit
from torch.nn.parallel import DistributedDataParallel

import tether

STEPS = 4


def net() -> nn.Module:
    torch.manual_seed(0)
    # one bucket; the middle weight (256 KiB) becomes a view, the smaller ones are copied back
    return nn.Sequential(nn.Linear(16, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 3))


LARGE = 2  # the middle weight, in parameters() order


def in_tethers_buffer(model: DistributedDataParallel) -> list[bool]:
    """Per parameter, whether its gradient is a view of a buffer of tether's hook on ``model``."""
    buffers = model._comm_hooks[0][0]._views  # (hook, state): tether's _TetherHook
    mine = [] if buffers is None else [slot.buffer for slot in buffers._slots.values()]
    return [any(p.grad is not None and p.grad._base is b for b in mine) for p in model.parameters()]


def train(local_rank: int) -> None:
    rank = tether.get_rank()
    base = net()
    plain = DistributedDataParallel(copy.deepcopy(base))
    guarded = {
        "none": DistributedDataParallel(copy.deepcopy(base)),
        "zeros": DistributedDataParallel(copy.deepcopy(base)),
        "unused": DistributedDataParallel(copy.deepcopy(base), find_unused_parameters=True),
        "bucket_view": DistributedDataParallel(copy.deepcopy(base), gradient_as_bucket_view=True),
    }
    for model in guarded.values():
        tether.register_comm_hook(model)
    models = {"plain": plain, **guarded}
    opts = {name: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for name, m in models.items()}
    gen = torch.Generator().manual_seed(100 + rank)
    kept: tuple[torch.Tensor, torch.Tensor] | None = None
    previous: list[torch.Tensor] | None = None
    for step in range(STEPS):
        x = torch.randn(8, 16, generator=gen)
        y = torch.randn(8, 3, generator=gen)
        for model in models.values():
            torch.nn.functional.mse_loss(model(x), y).backward()
        reference = [p.grad for p in plain.parameters()]
        exact = {
            name: all(torch.equal(a, b) for a, b in zip(reference, (p.grad for p in m.parameters()), strict=True))
            for name, m in guarded.items()
        }
        views = {name: in_tethers_buffer(m) for name, m in guarded.items()}
        large = list(guarded["none"].parameters())[LARGE].grad
        buffer = large._base.data_ptr() if large is not None and large._base is not None else None
        del large  # a gradient kept past the next backward would (rightly) stop the buffer's reuse
        grads_zeros = [p.grad for p in guarded["zeros"].parameters()]
        same_tensor = previous is not None and all(a is b for a, b in zip(previous, grads_zeros, strict=True))
        previous = grads_zeros
        if step == 1:
            grad = list(guarded["none"].parameters())[LARGE].grad
            assert grad is not None
            kept = (grad, grad.clone())
        for name, opt in opts.items():
            opt.step()
            opt.zero_grad(set_to_none=name != "zeros")
        exact = {
            name: exact[name]
            and all(torch.equal(a, b) for a, b in zip(plain.parameters(), m.parameters(), strict=True))
            for name, m in guarded.items()
        }
        intact = None if kept is None else torch.equal(*kept)
        emit(
            "step",
            rank=rank,
            step=step,
            exact=exact,
            views=views,
            buffer=buffer,
            same_tensor=same_tensor,
            kept_intact=intact,
        )


if __name__ == "__main__":
    tether.spawn("gloo", train, (), nproc_per_node=int(sys.argv[1]) if len(sys.argv) > 1 else 2)
