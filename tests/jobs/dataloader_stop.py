"""A stop sent to a ``tether.spawn`` job's whole process group while its DataLoaders' workers load.

    python dataloader_stop.py CKPT_DIR

2 ranks train on a DataLoader with 2 workers each (a dataset that takes 10 ms an item);
at step 20 rank 0 sends SIGTERM to the job's process group (SLURM's ``scancel``), which
ends the loaders' workers as well. torch's SIGCHLD handler then raises "DataLoader worker
(pid ...) is killed by signal: Terminated" in each rank's main thread, wherever it is:
before, inside tether's query behind the stop ("could not tell whether a peer's failure
caused this SIGTERM") and inside the emergency save ("... failed after this rank's
failure"), which then saved nothing.
"""

import os
import signal
import sys
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


def train(local_rank: int, out: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model = tether.auto_model(model)
    ckpt = tether.Checkpointer({"model": model, "optimizer": opt}, out, every=1000)
    ckpt.resume()
    for i, x in enumerate(DataLoader(Slow(), batch_size=4, num_workers=2)):
        with ckpt.step(0, i):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
        if i == 20 and tether.get_rank() == 0:
            os.killpg(os.getpgid(0), signal.SIGTERM)


if __name__ == "__main__":
    tether.spawn("gloo", train, (sys.argv[1],), nproc_per_node=2)
