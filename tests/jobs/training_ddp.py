"""A DDP training loop with a fault on one rank (issue 8), under any launcher.

    python training_ddp.py spawn CASE [NPROC]     (tether.spawn)
    torchrun ... training_ddp.py torchrun CASE    (tether.initialize under torchrun)

Cases (the fault is on rank 1, at step 3):

    happy           5 steps of auto_model's DDP; reports every rank's final weights
    raise           rank 1 raises in its forward; the others are in loss.backward()
    user_hook       the same, with a DDP built by the user and
                    register_comm_hook(model, hook=fp16_compress_hook)
    kill            rank 1 SIGKILLs itself in its forward
    backward_stall  rank 1 sleeps in its forward; sync_timeout=3
    ctor_stall      rank 1 sleeps before DistributedDataParallel(); sync_timeout=3:
                    the others wait in DDP's constructor, a raw collective
    join            uneven data under torch's Join: rank r trains STEPS + r steps

A rank that catches an exception reports it (``LC raised``, with ``in_backward``) and
re-raises it; rank 1 reports the moment it raises (``LC fault``).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
import time

import torch
import torch.nn as nn
from lifecycle_common import emit, raised
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.join import Join

import tether
from tether._core import context as tether_context

LAUNCHER, CASE = sys.argv[1], sys.argv[2]
STEPS = 5
FAULT_STEP = 3
TIMEOUT = 3.0


def fault(rank: int, step: int) -> None:
    if rank != 1 or step != FAULT_STEP or CASE == "happy":
        return
    if CASE in ("raise", "user_hook", "kill"):
        time.sleep(1.0)  # the others are in this step's backward by then, waiting for rank 1's gradients
    emit("fault", rank=rank, time=time.time(), case=CASE)
    if CASE in ("raise", "user_hook"):
        raise RuntimeError("forward failed 0.1 on rank 1")
    if CASE == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if CASE == "backward_stall":
        time.sleep(60)


def build(rank: int) -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    if CASE == "ctor_stall" and rank == 1:
        emit("fault", rank=rank, time=time.time(), case=CASE)
        time.sleep(60)
    if CASE == "user_hook":
        model = nn.parallel.DistributedDataParallel(net)
        tether.register_comm_hook(model, hook=default_hooks.fp16_compress_hook)
        return model
    if CASE == "ctor_stall":  # the others' wait starts here, not at rank 1's stall
        # DDP's constructor imports torch._dynamo before its first collective (torch 2.13,
        # ``get_optimize_ddp_mode``): seconds of CPU, and no wait. Imported here, the time
        # the test takes from the constructor is the wait's: alone, 5.4 s before and 4.0 s
        # after; in a fresh clone's run on a slow day, 7.25 s before (gloo's wait 4 s of it)
        importlib.import_module("torch._dynamo")
        emit("ctor", rank=rank, time=time.time())
    return tether.auto_model(net)


def train(local_rank: int) -> None:
    rank = tether.get_rank()
    in_backward = False
    try:
        model = build(rank)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(100 + rank)
        # under Join, a rank out of data shadows the others' all-reduces with
        # dist.get_rank(model.process_group): the group DDP holds must stay torch's own
        with Join([model]) if CASE == "join" else contextlib.nullcontext():
            for step in range(STEPS + rank if CASE == "join" else STEPS):
                x = torch.randn(8, 16, generator=gen)
                fault(rank, step)
                loss = model(x).pow(2).mean()
                in_backward = True
                loss.backward()
                in_backward = False
                opt.step()
                opt.zero_grad()
        weights = [round(float(v), 6) for v in torch.cat([p.detach().flatten() for p in model.parameters()])[:8]]
        # auto_model keeps DDP's built-in all-reduce: no communication hook (tether/ddp.py)
        guarded = tether_context.peek().watchdog.failables.issued  # type: ignore[union-attr]  # the guard's futures
        emit("done", rank=rank, weights=weights, hooks=len(getattr(model, "_comm_hooks", [])), guarded=guarded)
    except BaseException as exc:
        raised(rank, exc, in_backward=in_backward, cause=repr(exc.__cause__)[:300])
        raise


if __name__ == "__main__":
    options = {"sync_timeout": TIMEOUT} if "stall" in CASE else {}
    if LAUNCHER == "spawn":
        nproc = int(sys.argv[3]) if len(sys.argv) > 3 else 2
        try:
            tether.spawn("gloo", train, (), nproc_per_node=nproc, **options)
        except tether.JobFailed as exc:
            emit("launcher", exit_codes={str(k): v for k, v in exc.exit_codes.items()})
            raise
    else:
        tether.initialize("gloo", **options)
        train(0)
        tether.finalize()
