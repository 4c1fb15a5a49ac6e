"""One rank of ``fork_workers.py``: DataLoader passes (2 forked workers each) between collectives.

    torchrun --nproc_per_node 2 _fork_workers_job.py ROUNDS tether|raw|raw-callback

``tether``: ``tether.all_reduce(1)`` after each pass; ``raw``: ``dist.all_reduce`` of a
1-element tensor, waited in C++; ``raw-callback``: the same, woken by a Python callback on
its future, as a wait of tether's is when the collective outlasts its first 5 ms.
"""

import functools
import sys
import threading
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset


class Noise(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.randn(8)


def reduce_raw(callback: bool) -> None:
    t = torch.tensor(1)
    work = dist.all_reduce(t, async_op=True)
    if callback:
        woken = threading.Event()
        work.get_future().add_done_callback(lambda _: woken.set())
        woken.wait()
    work.wait()
    t.item()


def reducer(how: str) -> Callable[[], object]:
    """Join the job's group; the all-reduce each round makes."""
    if how == "tether":
        import tether

        tether.initialize("gloo")
        return functools.partial(tether.all_reduce, 1)
    dist.init_process_group("gloo")
    return functools.partial(reduce_raw, how == "raw-callback")


if __name__ == "__main__":
    rounds, how = int(sys.argv[1]), sys.argv[2]
    reduce = reducer(how)
    start = time.monotonic()
    for _ in range(rounds):
        for _batch in DataLoader(Noise(), batch_size=4, num_workers=2):
            pass
        reduce()
    print(f"DONE rank {dist.get_rank()} {rounds} rounds in {time.monotonic() - start:.1f} s", flush=True)
    if how == "tether":
        import tether

        tether.finalize()
    else:
        dist.destroy_process_group()
