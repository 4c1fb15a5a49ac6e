"""FSDP (``fully_shard``) training that a failure interrupts and ``tether.spawn`` restarts (issue 12).

    python sharded_resume.py OUT [--fail-step K | --stop-step K] [--tp]

2 ranks on gloo, 2 epochs of shuffled data (DistributedSampler, seed 0); every rank
holds a shard of the model and the optimizer. ``tether.Checkpointer`` saves every 4 steps
through DCP. In the first attempt only, rank 1 raises at step K: rank 0 writes no
emergency checkpoint (the lost shard is rank 1's) and says so, and the restarted job
resumes from the last periodic one. With ``--stop-step K`` rank 0 sends the launcher a
SIGTERM at step K instead (a preemption): the job stops, no rank saves an emergency
checkpoint and each says why, and the next run resumes from the last periodic one. Rank 0
saves the full final weights to ``OUT/final.pt``. With ``--tp`` the model is split by
tensor parallelism instead (``parallelize_module``: the first layer by columns, the second
by rows, on a 1-D mesh), and both ranks train on the same batches, as tensor-parallel
ranks do.
"""

import argparse
import os
import signal
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import tether

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--fail-step", type=int, default=-1)
parser.add_argument("--stop-step", type=int, default=-1)
parser.add_argument("--tp", action="store_true", help="tensor parallelism instead of fully_shard")


def train(local_rank: int, args: argparse.Namespace) -> None:
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    rank, world = tether.get_rank(), tether.get_world_size()
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(64, 8, generator=gen)
    y = x @ torch.randn(8, 1, generator=gen) + 0.1
    data = TensorDataset(x, y)
    replicas, replica = (1, 0) if args.tp else (world, rank)  # tensor-parallel ranks share their batches
    sampler = DistributedSampler(data, num_replicas=replicas, rank=replica, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=4, sampler=sampler)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 1))
    if args.tp:
        mesh = init_device_mesh("cpu", (world,))
        parallelize_module(model, mesh, {"0": ColwiseParallel(), "1": RowwiseParallel()})
    else:
        fully_shard(model)
    lr = 0.01 if args.tp else 0.05  # twice the steps of one batch each (no data split): 0.05 diverged
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    ckpt = tether.Checkpointer({"model": model, "optimizer": opt}, Path(args.out, "ckpt"), every=4)
    start = ckpt.resume()
    for epoch in range(start.epoch, 2):
        sampler.set_epoch(epoch)
        for i, (xb, yb) in enumerate(loader):
            if start.skips(epoch, i):
                continue
            with ckpt.step(epoch, i):
                if attempt == 0 and ckpt.position.step == args.fail_step and rank == 1:
                    raise RuntimeError(f"rank 1 failed at step {args.fail_step}")
                if ckpt.position.step == args.stop_step and rank == 0:
                    os.kill(int(os.environ["SHARDED_LAUNCHER_PID"]), signal.SIGTERM)
                loss = torch.nn.functional.mse_loss(model(xb), yb)
                loss.backward()
                opt.step()
                opt.zero_grad()
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        torch.save(full, Path(args.out, "final.pt"))


if __name__ == "__main__":
    args = parser.parse_args()
    os.environ["SHARDED_LAUNCHER_PID"] = str(os.getpid())  # the workers' parent is a forkserver
    tether.spawn("gloo", train, (args,), nproc_per_node=2, max_restarts=1 if args.fail_step >= 0 else 0)
