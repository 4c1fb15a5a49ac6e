"""A DataLoader worker that ends with a non-daemon thread of its own running: not its rank's end.

    python dataloader_thread.py

``tether.spawn``, 2 ranks, two epochs of a ``DataLoader(num_workers=1)`` whose
``worker_init_fn`` starts a non-daemon thread; a barrier ends each epoch, rank 1 coming
1.5 s late. A forked worker inherits the rank's hook for the end of the main thread
(``_core/ending.py``): it once marked the rank finished as the worker ended, and rank 0
raised ``PeerFinished`` in the next barrier. Each rank reports ``LC done``.
"""

import threading
import time

import torch
from lifecycle_common import emit
from torch.utils.data import DataLoader, Dataset

import tether


class Numbers(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((2,), float(i))


def start_a_logger(worker_id: int) -> None:
    threading.Thread(target=time.sleep, args=(0.3,), name="worker-logger").start()  # not a daemon


def fn(local_rank: int) -> None:
    rank = tether.get_rank()
    total = 0.0
    for _ in range(2):
        for batch in DataLoader(Numbers(), batch_size=4, num_workers=1, worker_init_fn=start_a_logger):
            total += float(tether.all_reduce(batch.sum()))
        if rank == 1:
            time.sleep(1.5)  # rank 0 waits in the barrier, where it checks which ranks finished
        tether.barrier()
    emit("done", rank=rank, total=total)


if __name__ == "__main__":
    tether.spawn("gloo", fn, (), nproc_per_node=2)
