"""Rank 1's group creation ends 2 s after rank 0's (2 ranks, ``torch.multiprocessing``).

    python lifecycle_slow_made.py PORT [fail]

Rank 1's ``dist.init_process_group`` is wrapped to sleep ``SLOW`` seconds after torch's
returned: the tail of gloo's handshake, which on a loaded machine outlasted rank 0's whole
job (rank 0 returned from ``initialize``, had nothing to do, finished, and closed its side
of the connection rank 1 was still making). Each rank prints ``made`` (rank 1, as its group
creation ends) or ``initialized`` (both, as ``initialize`` returns) with ``time.time()``.
With ``fail`` rank 1 raises at that point instead, and rank 0 prints what it ``raised``.
"""

import sys
import time

from lifecycle_common import emit, safe_str

SLOW = 2.0


def rank_main(rank: int, port: int, fail: bool) -> None:
    import torch.distributed as dist

    import tether

    if rank == 1:
        original = dist.init_process_group

        def slow(*args: object, **kwargs: object) -> None:
            original(*args, **kwargs)  # type: ignore[arg-type]
            time.sleep(SLOW)
            if fail:
                raise RuntimeError("injected failure as rank 1's group is made")
            emit("made", rank=rank, at=time.time())

        dist.init_process_group = slow  # type: ignore[assignment]
    try:
        tether.initialize("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    except BaseException as exc:
        emit("raised", rank=rank, exc=type(exc).__name__, msg=safe_str(exc)[:300])
        raise
    emit("initialized", rank=rank, at=time.time())
    tether.finalize()


def main() -> None:
    import torch.multiprocessing as mp

    mp.spawn(rank_main, args=(int(sys.argv[1]), sys.argv[2:] == ["fail"]), nprocs=2)


if __name__ == "__main__":
    main()
