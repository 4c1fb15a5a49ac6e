"""Train a small classifier with DDP on synthetic data, and watch tether's promise hold.

Run it on 4 processes of this machine::

    python examples/train.py --nproc 4
    python -m torch.distributed.run --nproc_per_node 4 examples/train.py

Then break one rank and see every other rank stop at once, naming it::

    python examples/train.py --nproc 4 --fail-kind raise --fail-rank 2 --fail-at train
    python examples/train.py --nproc 4 --fail-kind kill  --fail-rank 0 --fail-at prepare
    python examples/train.py --nproc 4 --fail-kind stall --fail-rank 3 --fail-at train --sync-timeout 10
    python examples/train.py --nproc 4 --fail-kind exit  --fail-rank 0 --fail-at checkpoint

Lose no progress: with ``--resume DIR`` a survivor saves an emergency checkpoint when a
peer fails, and a restarted job continues from it (the fault strikes the first attempt
only)::

    python -m torch.distributed.run --nproc_per_node 4 --max-restarts 2 examples/train.py \
        --resume /tmp/tether-ckpt --fail-kind raise --fail-rank 2 --fail-at train
    python examples/train.py --nproc 4 --max-restarts 2 \
        --resume /tmp/tether-ckpt --fail-kind kill --fail-rank 2 --fail-at train

What it shows, in order: rank 0 prepares and caches the data set while the others wait
(``one_rank_first``), the model, optimizer and loaders adapt to the job (``auto_*``),
the loss is averaged every step and the validation accuracy every epoch
(``all_reduce``, ``all_gather``), and one rank saves the checkpoint while the others
wait for it (``one_rank_only(with_barrier=True)``). Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

import tether

FEATURES, CLASSES, SAMPLES = 32, 4, 8192


@dataclass(frozen=True)
class Config:
    epochs: int
    batch_size: int  # global: auto_dataloader gives each rank its share
    lr: float
    data_dir: str
    out_dir: str
    fail_kind: str | None
    fail_rank: int
    fail_at: str
    resume: str | None = None  # checkpoint directory: periodic + emergency saves, resume on start


def inject(config: Config, where: str) -> None:
    """Fail here if this rank was told to (``--fail-kind/--fail-rank/--fail-at``)."""
    if config.fail_kind is None or config.fail_at != where or tether.get_rank() != config.fail_rank:
        return
    if config.resume is not None and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return  # a restarted attempt: let it finish
    print(f"[rank {config.fail_rank}] injecting '{config.fail_kind}' at {where}", flush=True)
    if config.fail_kind == "raise":
        raise RuntimeError(f"injected failure at {where}")
    if config.fail_kind == "exit":
        os._exit(13)  # no exception, no clean-up: like a crash in C code (13: no code of ExitCode's table)
    if config.fail_kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)  # like the OOM killer
    while True:  # "stall": alive, heart beating, never arriving (a dead NFS mount, an endless loop)
        time.sleep(1.0)


def prepare_data(config: Config) -> torch.utils.data.TensorDataset:
    """Rank 0 makes the data set and caches it; the others load the cache after it."""
    path = Path(config.data_dir, "synthetic-v1.pt")
    with tether.one_rank_first():
        inject(config, "prepare")
        if not path.exists():  # the first rank builds it; the others (and later runs) find it
            gen = torch.Generator().manual_seed(0)
            teacher = torch.randn(FEATURES, CLASSES, generator=gen)
            x = torch.randn(SAMPLES, FEATURES, generator=gen)
            y = (x @ teacher + 0.5 * torch.randn(SAMPLES, CLASSES, generator=gen)).argmax(dim=1)
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(f".{os.getpid()}.tmp")
            torch.save({"x": x, "y": y}, partial)
            os.replace(partial, path)  # atomic: a reader never sees half a file
        data = torch.load(path)
    return torch.utils.data.TensorDataset(data["x"], data["y"])


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, CLASSES))


def evaluate(model: nn.Module, loader: torch.utils.data.DataLoader) -> float:
    """Accuracy over the whole validation set: each rank counts its share, all_gather sums."""
    model.eval()
    counts = torch.zeros(2)
    with torch.no_grad():
        for x, y in loader:
            counts += torch.tensor([(model(x).argmax(dim=1) == y).sum().item(), len(y)])
    model.train()
    per_rank = tether.all_gather(counts).view(-1, 2)  # rank r's [correct, seen] in row r
    correct, seen = per_rank.sum(dim=0).tolist()
    return correct / seen


def training(local_rank: int, config: Config) -> None:
    torch.set_num_threads(1)  # one thread per rank: several ranks share this machine's cores
    rank, world = tether.get_rank(), tether.get_world_size()
    if rank == 0:
        print(f"tether: {world} ranks on {tether.get_nnodes()} node(s), backend {tether.backend()}", flush=True)
    dataset = prepare_data(config)
    train_set, val_set = torch.utils.data.random_split(dataset, [0.8, 0.2], torch.Generator().manual_seed(1))
    train_loader = tether.auto_dataloader(train_set, batch_size=config.batch_size, shuffle=True, drop_last=True)
    val_loader = tether.auto_dataloader(val_set, batch_size=1024, shuffle=False)

    torch.manual_seed(0)
    model = tether.auto_model(make_model())
    optimizer = tether.auto_optim(torch.optim.Adam(model.parameters(), lr=config.lr))
    loss_fn = nn.CrossEntropyLoss()

    # --resume: save every 20 steps and when a peer fails; continue from the newest save
    ckpt = (
        tether.Checkpointer({"model": model, "optimizer": optimizer}, config.resume, every=20)
        if config.resume
        else None
    )
    resumed = ckpt.resume() if ckpt is not None else tether.Position(epoch=1)
    start = time.monotonic()
    steps = len(train_loader)
    for epoch in range(max(1, resumed.epoch), config.epochs + 1):
        train_loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
        for step, (x, y) in enumerate(train_loader, 1):
            if resumed.skips(epoch, step):
                continue  # trained before the restart
            with ckpt.step(epoch, step) if ckpt is not None else contextlib.nullcontext():
                if epoch == 1 and step == 5:
                    inject(config, "train")
                optimizer.zero_grad()
                loss = loss_fn(model(x), y)
                # the averaged loss feeds the progress line (a tether collective); DDP's
                # gradient all-reduce in backward() goes through tether's hook (auto_model)
                mean_loss = tether.all_reduce(loss.detach().clone()) / world
                loss.backward()
                optimizer.step()
            if rank == 0 and (step % 10 == 0 or step == steps):
                print(f"epoch {epoch}/{config.epochs}  step {step:3d}/{steps}  loss {mean_loss.item():.4f}", flush=True)
        accuracy = evaluate(model, val_loader)
        if rank == 0:
            print(f"epoch {epoch}/{config.epochs}  val accuracy {accuracy:.1%}  ({time.monotonic() - start:.1f} s)")

    if rank != 0:
        inject(config, "checkpoint")  # rank 0 injects inside save(), which only it runs
    save(model, optimizer, config)
    if rank == 0:
        print(f"checkpoint saved to {Path(config.out_dir, 'model.pt')}", flush=True)


@tether.one_rank_only(rank=0, with_barrier=True)
def save(model: nn.Module, optimizer: torch.optim.Optimizer, config: Config) -> None:
    inject(config, "checkpoint")
    module = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    path = Path(config.out_dir, "model.pt")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    torch.save({"model": module.state_dict(), "optimizer": optimizer.state_dict()}, partial)
    os.replace(partial, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=4, help="processes to spawn (ignored under torchrun)")
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=256, help="global batch size")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--data-dir", default=os.path.join(tempfile.gettempdir(), "tether-example-data"))
    parser.add_argument("--out-dir", default=os.path.join(tempfile.gettempdir(), "tether-example-out"))
    parser.add_argument("--fail-kind", choices=["raise", "exit", "kill", "stall"], default=None)
    parser.add_argument("--fail-rank", type=int, default=0)
    parser.add_argument("--fail-at", choices=["prepare", "train", "checkpoint"], default="train")
    parser.add_argument(
        "--sync-timeout", type=float, default=20.0, help="seconds any wait may last: tether's, DDP's, raw dist calls'"
    )
    parser.add_argument("--resume", default=None, help="checkpoint directory: emergency saves, resume on restart")
    parser.add_argument(
        "--max-restarts", type=int, default=0, help="start every worker again after a failure (torchrun: its own flag)"
    )
    args = parser.parse_args()
    config = Config(
        args.epochs,
        args.batch_size,
        args.lr,
        args.data_dir,
        args.out_dir,
        args.fail_kind,
        args.fail_rank,
        args.fail_at,
        args.resume,
    )
    # tether's options: a rank silent 3 s is lost; a sync waiting sync_timeout s times out;
    # a rank that does not take a failure within 5 s (stuck outside tether) is ended.
    options = {"heartbeat": 1.0, "lost_after": 3.0, "grace": 5.0, "sync_timeout": args.sync_timeout}
    under_launcher = "RANK" in os.environ  # torchrun started this process as one rank
    nproc = None if under_launcher else args.nproc
    if not under_launcher:
        options["max_restarts"] = args.max_restarts
    try:
        with tether.Parallel(args.backend, nproc_per_node=nproc, **options) as parallel:
            parallel.run(training, config)
    except tether.JobFailed:
        return 1  # tether.spawn printed the root-cause report already
    return 0


if __name__ == "__main__":
    sys.exit(main())
