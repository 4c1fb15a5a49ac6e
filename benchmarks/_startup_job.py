"""One job of ``startup.py``: start N ranks, each joins the group and does one barrier.

    python _startup_job.py CONTENDER N

CONTENDER is ``torch`` (``torch.multiprocessing.spawn`` + ``init_process_group``),
``ignite`` (``ignite.distributed.Parallel``), ``tether-spawn`` (``tether.spawn`` with
``start_method="spawn"``) or ``tether`` (``tether.spawn``'s default). Prints ``LAUNCH s``:
the seconds from just before the launch call to its return (every rank started, joined,
passed the barrier and exited), without this launcher's own imports.
"""

from __future__ import annotations

import os
import sys
import time


def torch_rank(local_rank: int, world: int, port: int) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=local_rank, world_size=world)
    dist.barrier()
    dist.destroy_process_group()


def idist_rank(local_rank: int, module: str) -> None:
    idist = __import__(module, fromlist=["barrier"])
    idist.barrier()


def main() -> None:
    contender, world = sys.argv[1], int(sys.argv[2])
    if contender == "torch":
        import torch.multiprocessing as mp

        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from _proc import free_port

        start = time.monotonic()
        mp.spawn(torch_rank, (world, free_port()), nprocs=world)
    elif contender == "ignite":
        import ignite.distributed as idist

        start = time.monotonic()
        with idist.Parallel(backend="gloo", nproc_per_node=world) as parallel:
            parallel.run(idist_rank, "ignite.distributed")
    else:
        import tether

        kwargs = {"start_method": "spawn"} if contender == "tether-spawn" else {}
        start = time.monotonic()
        tether.spawn("gloo", idist_rank, ("tether",), nproc_per_node=world, **kwargs)
    print(f"LAUNCH {time.monotonic() - start:.4f}", flush=True)


if __name__ == "__main__":
    main()
