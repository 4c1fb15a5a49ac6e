"""A torchrun job whose rank 0 is SIGKILLed while the others wait in a collective for it.

    torchrun --nproc_per_node N output_killed.py

Every rank trains a small DDP model under ``Parallel`` and all-reduces each step's loss
(as ``examples/train.py`` does); at step 20 rank 0 prints ``STRUCK <time>`` and kills
itself instead of all-reducing, so each survivor's gloo work is left pending on it when
the survivor learns of the death and ends. Two exit functions bracket tether's own
(``atexit`` runs the last registered first): ``EXITFUNCS <rank> <time>`` as the exit
functions start, ``EXITING <rank> <time>`` once tether's have run.
"""

import atexit
import os
import signal
import sys
import time

import torch

import tether as idist


def say(what: str, rank: object) -> None:
    sys.stdout.write(f"{what} {rank} {time.time()}\n")  # one write: the ranks share the pipe
    sys.stdout.flush()


def main(local_rank: int) -> None:
    atexit.register(say, "EXITFUNCS", idist.get_rank())  # after tether's (registered by Parallel): runs before them
    torch.manual_seed(0)
    model = idist.auto_model(torch.nn.Linear(512, 512))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = torch.full((8, 512), 0.1)
    for step in range(1000):
        loss = model(batch).square().mean()
        if step == 20 and idist.get_rank() == 0:
            time.sleep(0.5)  # every other rank is in its all_reduce by now, waiting for this one
            os.write(1, f"STRUCK {time.time()}\n".encode())
            os.kill(os.getpid(), signal.SIGKILL)
        idist.all_reduce(loss.detach().clone())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    atexit.register(say, "EXITING", os.environ["RANK"])  # before tether's: runs after them
    with idist.Parallel(backend="gloo") as parallel:
        parallel.run(main)
