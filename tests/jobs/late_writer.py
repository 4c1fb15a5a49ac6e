"""A checkpoint writer that gets the CPU only after the store's host is gone: ``late_writer.py``.

Two fresh rank processes ``tether.initialize("gloo", init_method="tcp://...")``; rank 0
hosts the job's store. Step 0 ends with a periodic save split across both ranks, each
rank's writer thread writing its part. Fault injection: rank 1's writer begins its part
3 s late, as a thread kept from the CPU does; 1 s after the step rank 0 is killed (SIGKILL:
its store goes with it) and rank 1's ``tether.barrier()`` raises. Rank 1 catches the error
and returns; Python then joins the writer, which is not a daemon (a save must not be lost
at the exit). Before the fix the writer opened its store connection as it began, and
c10d's connect retries until the connection's timeout (a year, tether's): rank 1 never
ended.

Rank 1 prints ``RAISED <type> <message>`` and ``RETURNED``; the parent prints
``EXIT <rank> <code>`` and ``STDERR <rank>: <line>`` for each rank.
"""

from __future__ import annotations

import tempfile

from lifecycle_common import run_pair

RANK = """
import os, signal, sys, time
from pathlib import Path
import torch
import tether
from tether import checkpoint

rank = int(sys.argv[2])
if rank == 1:
    write_part = checkpoint.Checkpointer._write_part

    def late(self, save, released):
        time.sleep(3.0)  # the writer's first turn on the CPU
        write_part(self, save, released)

    checkpoint.Checkpointer._write_part = late
tether.initialize("gloo", init_method=sys.argv[1], rank=rank, world_size=2)
torch.manual_seed(0)
model = torch.nn.Linear(256, 256)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ckpt = tether.Checkpointer({"model": model, "optimizer": opt}, Path(DIRNAME), every=1, emergency=False)
model(torch.full((1, 256), 0.1)).sum().backward()
with ckpt.step(0, 0):
    opt.step()
if rank == 0:
    time.sleep(1.0)  # rank 1 past its save's start, its writer asleep
    os.kill(os.getpid(), signal.SIGKILL)
try:
    tether.barrier()
except Exception as exc:
    os.write(1, f"RAISED {type(exc).__name__} {str(exc).splitlines()[0]}\\n".encode())
os.write(1, b"RETURNED\\n")
"""


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="tether-late-writer-") as tmp:
        run_pair(RANK.replace("DIRNAME", repr(tmp)))


if __name__ == "__main__":
    main()
