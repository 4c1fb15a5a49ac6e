"""Deterministic DDP training that a failure interrupts and torchrun restarts (issue 12).

    torchrun --max-restarts 1 ... resume_job.py OUT [--fail-step K --fail-rank R] [--every N]
    python resume_job.py OUT --spawn [...]     (tether.spawn(..., max_restarts=1), 2 ranks)

2 epochs of a shuffled data set (DistributedSampler, seed 0) through a DDP model from
``auto_model``; ``tether.Checkpointer`` saves every ``--every`` steps (default: none,
emergency only) into ``OUT/ckpt``. In the first attempt only (torchrun's restart count
0), rank R raises at step K before its forward, while the others wait in backward().
Every rank appends one line per completed step to ``OUT/trained.<rank>``: attempt,
epoch, iteration, step, and the sample indices it trained. Rank 0 saves the final
weights to ``OUT/final.pt``.
"""

import argparse
import json
import os
import signal
import threading
from pathlib import Path

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import tether

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--fail-step", type=int, default=-1)
parser.add_argument("--fail-rank", type=int, default=1)
parser.add_argument("--every", type=int, default=None)
parser.add_argument("--spawn", action="store_true")
parser.add_argument("--kill-in-save", choices=["periodic", "emergency"], default=None)


def kill_in_save(kind: str, step: int) -> None:
    """Fault injection: SIGKILL rank 0 in the middle of writing a checkpoint (first attempt only).

    Wraps the Checkpointer's writer: ``state.pt`` is written, the manifest not yet.
    """
    from tether import checkpoint

    original = checkpoint.torch.save

    def save(obj: object, f: object, *a: object, **kw: object) -> None:
        original(obj, f, *a, **kw)  # type: ignore[arg-type]
        position = obj.get("position") if isinstance(obj, dict) else None
        if position is None or tether.get_rank() != 0:
            return  # not a checkpoint (the final weights), or not the rank to kill
        periodic = threading.current_thread().name == "tether-checkpoint"
        if (kind == "periodic" and periodic and position["step"] == step) or (kind == "emergency" and not periodic):
            os.kill(os.getpid(), signal.SIGKILL)

    checkpoint.torch.save = save  # type: ignore[assignment]


def train(local_rank: int, args: argparse.Namespace) -> None:
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if args.kill_in_save and attempt == 0:
        kill_in_save(args.kill_in_save, args.fail_step)
    rank, world = tether.get_rank(), tether.get_world_size()
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(64, 8, generator=gen)
    y = x @ torch.randn(8, 1, generator=gen) + 0.1
    data = TensorDataset(torch.arange(64), x, y)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=4, sampler=sampler)

    torch.manual_seed(0)
    model = tether.auto_model(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.1), torch.nn.Linear(16, 1))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ckpt = tether.Checkpointer({"model": model, "optimizer": opt}, Path(args.out, "ckpt"), every=args.every)
    start = ckpt.resume()
    with open(Path(args.out, f"trained.{rank}"), "a") as log:
        for epoch in range(start.epoch, 2):
            sampler.set_epoch(epoch)
            for i, (idx, xb, yb) in enumerate(loader):
                if start.skips(epoch, i):
                    continue
                with ckpt.step(epoch, i):
                    if attempt == 0 and ckpt.position.step == args.fail_step and rank == args.fail_rank:
                        raise RuntimeError(f"injected failure at step {args.fail_step} on rank {rank}")
                    loss = (model(xb) - yb).pow(2).mean()
                    loss.backward()
                    opt.step()
                    opt.zero_grad()
                    # logged inside the step: a rank killed by its own periodic save (which
                    # starts when the step ends) has logged what it trained
                    step = ckpt.position.step + 1
                    line = {"attempt": attempt, "epoch": epoch, "it": i, "step": step, "idx": idx.tolist()}
                    log.write(json.dumps(line) + "\n")
                    log.flush()
    ckpt.wait()
    if rank == 0:
        torch.save(model.module.state_dict(), Path(args.out, "final.pt"))


if __name__ == "__main__":
    args = parser.parse_args()
    if args.spawn:
        tether.spawn("gloo", train, (args,), nproc_per_node=2, max_restarts=1)
    else:
        tether.initialize("gloo")
        train(tether.get_local_rank(), args)
        tether.finalize()
