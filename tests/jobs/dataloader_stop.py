"""A stop sent to a ``tether.spawn`` job's whole process group while its DataLoaders' workers load.

    python dataloader_stop.py CKPT_DIR [between|in-step]

2 ranks train on a DataLoader with 2 workers each (a dataset that takes 10 ms an item);
at step 20 rank 0 sends SIGTERM to the job's process group (SLURM's ``scancel``), which
ends the loaders' workers as well. torch's SIGCHLD handler then raises "DataLoader worker
(pid ...) is killed by signal: Terminated" in each rank's main thread, wherever it is:
before, inside tether's query behind the stop ("could not tell whether a peer's failure
caused this SIGTERM") and inside the emergency save ("... failed after this rank's
failure"), which then saved nothing.

``between`` (the default) sends the stop between two steps; ``in-step`` from a timer
0.1 s into step 20's optimizer step, which lasts 0.4 s on every rank: tether puts the
stop off until the step is whole, and torch's error came meanwhile, inside the step, as
the rank's own failure ("Root cause: rank 1 failed: RuntimeError: DataLoader worker
...").
"""

import os
import signal
import sys
import threading
import time

import torch
from torch.utils.data import DataLoader, Dataset

import tether


class Slow(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.01)
        return torch.tensor([float(i)])


class SlowAt20(torch.optim.SGD):
    steps = 0

    def step(self, closure: None = None) -> None:  # type: ignore[override]
        self.steps += 1
        if self.steps == 21:
            time.sleep(0.4)
        super().step()


def stop_the_job() -> None:
    os.killpg(os.getpgid(0), signal.SIGTERM)


def train(local_rank: int, out: str, when: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    opt = SlowAt20(model.parameters(), lr=0.01)
    model = tether.auto_model(model)
    ckpt = tether.Checkpointer({"model": model, "optimizer": opt}, out, every=1000)
    ckpt.resume()
    for i, x in enumerate(DataLoader(Slow(), batch_size=4, num_workers=2)):
        with ckpt.step(0, i):
            model(x).sum().backward()
            if i == 20 and tether.get_rank() == 0 and when == "in-step":
                threading.Timer(0.1, stop_the_job).start()
            opt.step()
            opt.zero_grad()
        if i == 20 and tether.get_rank() == 0 and when == "between":
            stop_the_job()


if __name__ == "__main__":
    tether.spawn("gloo", train, (sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "between"), nproc_per_node=2)
