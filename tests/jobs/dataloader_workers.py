"""A ``tether.spawn`` job whose ranks read through DataLoader worker processes; rank 1 fails.

    python dataloader_workers.py raise|kill OUT_DIR

Each of 2 ranks iterates a ``DataLoader(num_workers=2)`` and all-reduces every batch; at
batch 20 rank 1 raises ``ValueError`` or SIGKILLs itself. Before, a rank's workers came
from a multiprocessing forkserver of the rank's own (the start method the rank inherited
from tether's forkserver), which the workers kept alive while they waited for it to die:
every rank tether ended left that server and its 2 workers running, forever. Each rank
emits its workers' pids, its start method and what it raised, and writes the pids to
OUT_DIR; the launcher, once ``spawn`` raised, emits which of them still run 1 s later
("left"): a rank that tether ends takes its workers with it. A worker tells whose signal
handlers and excepthooks it has (Python's, not the rank's tether ones) and its rank.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch
from lifecycle_common import emit, raised
from torch.utils.data import DataLoader, TensorDataset

import tether


def worker_init(worker_id: int) -> None:
    """In a DataLoader worker, forked from the rank: whose hooks, and whose rank, it has."""
    if worker_id == 0:
        handlers = [signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)]
        hooks = [*handlers, sys.excepthook, threading.excepthook]
        # (sys.excepthook is torch's: init_process_group installs one, as in a torchrun rank)
        emit("worker hooks", rank=tether.get_rank(), modules=[getattr(h, "__module__", "") for h in hooks])


def work(local_rank: int, how: str, out: str) -> None:
    rank = tether.get_rank()
    loader = DataLoader(
        TensorDataset(torch.arange(4000.0)),
        batch_size=10,
        num_workers=2,
        persistent_workers=True,
        worker_init_fn=worker_init,
    )
    try:
        for i, (x,) in enumerate(loader):
            if i == 0:
                assert loader._iterator is not None
                pids = [w.pid for w in loader._iterator._workers]  # type: ignore[attr-defined]
                emit("workers", rank=rank, pids=pids, start_method=multiprocessing.get_start_method())
                Path(out, f"workers-{rank}").write_text(" ".join(map(str, pids)))
            if i == 20 and rank == 1:
                if how == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                raise ValueError("injected failure 0.1 on rank 1")
            tether.all_reduce(float(x.sum()))
    except BaseException as exc:
        raised(rank, exc)
        raise


def running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


if __name__ == "__main__":
    try:
        tether.spawn("gloo", work, sys.argv[1:3], nproc_per_node=2)
    finally:
        pids = {int(p): f.name for f in Path(sys.argv[2]).glob("workers-*") for p in f.read_text().split()}
        deadline = time.monotonic() + 1.0
        while any(map(running, pids)) and time.monotonic() < deadline:
            time.sleep(0.02)
        emit("left", workers=sorted({name for pid, name in pids.items() if running(pid)}))
