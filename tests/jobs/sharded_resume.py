"""FSDP (``fully_shard``) training that a failure interrupts and ``tether.spawn`` restarts (issue 12).

    python sharded_resume.py OUT [--fail-step K | --stop-step K]

2 ranks on gloo, 2 epochs of shuffled data (DistributedSampler, seed 0); every rank
holds a shard of the model and the optimizer. ``tether.Checkpointer`` saves every 4 steps
through DCP. In the first attempt only, rank 1 raises at step K: rank 0 writes no
emergency checkpoint (the lost shard is rank 1's) and says so, and the restarted job
resumes from the last periodic one. With ``--stop-step K`` rank 0 sends the launcher a
SIGTERM at step K instead (a preemption): the job stops, no rank saves an emergency
checkpoint and each says why, and the next run resumes from the last periodic one. Rank 0
saves the full final weights to ``OUT/final.pt``.
"""

import argparse
import os
import signal
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import tether

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--fail-step", type=int, default=-1)
parser.add_argument("--stop-step", type=int, default=-1)


def train(local_rank: int, args: argparse.Namespace) -> None:
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    rank, world = tether.get_rank(), tether.get_world_size()
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(64, 8, generator=gen)
    y = x @ torch.randn(8, 1, generator=gen) + 0.1
    data = TensorDataset(x, y)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=4, sampler=sampler)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 1))
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
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
