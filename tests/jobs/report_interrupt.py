"""Ctrl-C to a ``Parallel`` launcher (issue 11): both ranks wait (rank 1 in user code, rank 0
in a barrier); the test sends SIGINT to this process once both printed READY."""

import os
import time

import tether as idist


def fn(local_rank: int) -> None:
    os.write(1, f"READY {idist.get_rank()}\n".encode())
    if idist.get_rank() == 1:
        time.sleep(60)
    idist.barrier()


if __name__ == "__main__":
    with idist.Parallel(backend="gloo", nproc_per_node=2) as parallel:
        parallel.run(fn)
