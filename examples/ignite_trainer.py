"""An ignite training loop (Engine, metrics, ProgressBar, Checkpoint) under tether, with faults.

Needs ``pytorch-ignite`` (the test extra installs it). Run it on 2 processes::

    python examples/ignite_trainer.py --nproc 2
    python -m torch.distributed.run --nproc_per_node 2 examples/ignite_trainer.py

Break one rank in mid-epoch, in training or in evaluation, and see every other rank
stop with tether's error::

    python examples/ignite_trainer.py --fail-kind raise --fail-rank 1 --fail-at train
    python examples/ignite_trainer.py --fail-kind stall --fail-rank 1 --fail-at eval --sync-timeout 10
    python examples/ignite_trainer.py --fail-kind kill  --fail-rank 0 --fail-at train

Lose no progress: with ``--resume DIR`` a ``tether.Checkpointer`` is attached to the
trainer (its iterations are the Checkpointer's steps); a survivor saves an emergency
checkpoint when a peer fails, and the restarted job resumes the engine where it stopped,
skipping the batches trained before, beside ignite's own ``Checkpoint`` handler::

    python examples/ignite_trainer.py --max-restarts 1 --resume /tmp/tether-ignite-ckpt \
        --fail-kind kill --fail-rank 1 --fail-at train

ignite's own code (the ``Accuracy``/``Loss`` reductions, ``Checkpoint``, ``ProgressBar``,
the ``Engine``) calls ``ignite.distributed``; tether points those calls at its own
functions when it starts (``tether/bridge.py``), so a metric's all-reduce waits through
tether too: a raise gives ``PeerFailure``, a stall ``SyncTimeout`` after
``--sync-timeout`` seconds. The model is trained through ``auto_model``'s DDP, whose
gradient all-reduce tether guards (``tether/ddp.py``).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time

import torch
from ignite.contrib.handlers import ProgressBar
from ignite.engine import Engine, Events, create_supervised_evaluator, create_supervised_trainer
from ignite.handlers import Checkpoint, DiskSaver
from ignite.metrics import Accuracy, Loss
from torch import nn

import tether

FEATURES, CLASSES, SAMPLES = 16, 3, 2048


def inject(args: argparse.Namespace, where: str, engine: Engine) -> None:
    """Fail here, at the epoch's third iteration, if this rank was told to."""
    if args.fail_kind is None or args.fail_at != where or tether.get_rank() != args.fail_rank:
        return
    if args.resume is not None and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return  # a restarted attempt: let it finish
    if engine.state.epoch != 1 or engine.state.iteration % engine.state.epoch_length != 3:
        return
    print(f"[rank {args.fail_rank}] injecting '{args.fail_kind}' in {where}", flush=True)
    if args.fail_kind == "raise":
        raise RuntimeError(f"injected failure in {where}")
    if args.fail_kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    while True:  # "stall": alive, never arriving at the next reduction
        time.sleep(1.0)


def data(rank_seed: int) -> torch.utils.data.TensorDataset:
    gen = torch.Generator().manual_seed(rank_seed)
    teacher = torch.randn(FEATURES, CLASSES, generator=torch.Generator().manual_seed(0))
    x = torch.randn(SAMPLES, FEATURES, generator=gen)
    return torch.utils.data.TensorDataset(x, (x @ teacher).argmax(dim=1))


def training(local_rank: int, args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    model = tether.auto_model(nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, CLASSES)))
    optimizer = tether.auto_optim(torch.optim.SGD(model.parameters(), lr=0.1))
    train = tether.auto_dataloader(data(0), batch_size=64, shuffle=True)
    val = tether.auto_dataloader(data(1), batch_size=64)
    loss = nn.CrossEntropyLoss()
    trainer = create_supervised_trainer(model, optimizer, loss)
    evaluator = create_supervised_evaluator(model, metrics={"accuracy": Accuracy(), "loss": Loss(loss)})
    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: inject(args, "train", e))
    evaluator.add_event_handler(Events.ITERATION_COMPLETED, lambda e: inject(args, "eval", e))

    @trainer.on(Events.EPOCH_COMPLETED)
    def validate(engine: Engine) -> None:
        state = evaluator.run(val)  # the metrics' all-reduce: tether's, through ignite.distributed
        tether.rank_print(f"epoch {engine.state.epoch}: {state.metrics}")

    if args.resume is not None:
        # a save every 10 steps and when a peer fails; the first run() resumes from the newest
        tether.Checkpointer({"model": model, "optimizer": optimizer}, args.resume, every=10).attach(trainer)

    to_save = {"model": model, "optimizer": optimizer, "trainer": trainer}
    trainer.add_event_handler(Events.EPOCH_COMPLETED, Checkpoint(to_save, DiskSaver(args.out_dir, require_empty=False)))
    if tether.get_rank() == 0 and args.progress:
        ProgressBar(persist=False).attach(trainer)
    trainer.run(train, max_epochs=args.epochs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2, help="processes to spawn (ignored under torchrun)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out-dir", default=os.path.join(tempfile.gettempdir(), "tether-ignite-example"))
    parser.add_argument("--fail-kind", choices=["raise", "kill", "stall"], default=None)
    parser.add_argument("--fail-rank", type=int, default=1)
    parser.add_argument("--fail-at", choices=["train", "eval"], default="train")
    parser.add_argument(
        "--sync-timeout", type=float, default=20.0, help="seconds any wait may last (tether's, ignite's, DDP's)"
    )
    parser.add_argument("--progress", action="store_true", help="show ignite's ProgressBar on rank 0")
    parser.add_argument("--resume", default=None, help="checkpoint directory: emergency saves, resume on restart")
    parser.add_argument(
        "--max-restarts", type=int, default=0, help="start every worker again after a failure (torchrun: its own flag)"
    )
    args = parser.parse_args()
    options: dict[str, float] = {"lost_after": 3.0, "grace": 5.0, "sync_timeout": args.sync_timeout}
    nproc = None if "RANK" in os.environ else args.nproc
    if nproc is not None:
        options["max_restarts"] = args.max_restarts
    try:
        with tether.Parallel("gloo", nproc_per_node=nproc, **options) as parallel:
            parallel.run(training, args)
    except tether.JobFailed:
        return 1  # the launcher printed the root-cause report
    return 0


if __name__ == "__main__":
    sys.exit(main())
