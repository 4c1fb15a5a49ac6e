"""Launching from places users launch from (issue 7): ``file://`` stores, unpicklable functions.

    lifecycle_spawn.py file {spawn,parallel} DIR
        ``tether.spawn`` / ``tether.Parallel`` of 2 ranks with ``init_method="file://DIR/store"``:
        rank 1 raises ValueError(MESSAGE) after a barrier while rank 0 waits in the next one.
    lifecycle_spawn.py unpicklable {lambda,closure}
        ``tether.spawn(..., start_method="spawn")`` of a lambda / a closure: the launcher must
        raise one clear error before any child starts. A child that starts prints
        ``CHILD STARTED`` (the spawn start method imports this file in every child).

The launcher prints ``LC {"event": "launcher", ...}`` with what it raised (exc None: it
returned), then re-raises it (one traceback).
"""

from __future__ import annotations

import os
import sys

from lifecycle_common import emit, launcher_failed, raised

import tether

MESSAGE = "file store fault on rank 1 (f1le)"

if __name__ == "__mp_main__":  # this file, imported by a spawned child
    os.write(1, b"CHILD STARTED\n")


def file_body(local_rank: int) -> None:
    rank = tether.get_rank()
    try:
        tether.barrier()
        if rank == 1:
            raise ValueError(MESSAGE)
        tether.barrier()
    except BaseException as exc:
        raised(rank, exc)
        raise
    emit("done", rank=rank)


def make_closure() -> object:
    token = "c10sure"

    def inner(local_rank: int) -> None:
        os.write(1, f"rank {tether.get_rank()} ran the closure {token}\n".encode())

    return inner


def main() -> None:
    scenario, how = sys.argv[1], sys.argv[2]
    try:
        if scenario == "file":
            init_method = f"file://{sys.argv[3]}/store"
            if how == "spawn":
                tether.spawn("gloo", file_body, (), nproc_per_node=2, init_method=init_method)
            else:
                with tether.Parallel("gloo", nproc_per_node=2, init_method=init_method) as parallel:
                    parallel.run(file_body)
        else:
            fn = (lambda local_rank: os.write(1, b"the lambda ran\n")) if how == "lambda" else make_closure()
            tether.spawn("gloo", fn, (), nproc_per_node=2, start_method="spawn")
    except BaseException as exc:
        import pickle

        launcher_failed(exc, clear=isinstance(exc, (TypeError, ValueError, pickle.PicklingError)))
        raise
    emit("launcher", exc=None)


if __name__ == "__main__":
    main()
