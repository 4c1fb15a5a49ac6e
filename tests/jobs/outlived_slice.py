"""A collective that skips gloo's 5 ms timed wait still ends on a peer's failure (``tether.spawn``, 2 ranks).

    python outlived_slice.py

``waits.run_work`` waits 5 ms in gloo's C++ first; a collective whose last run with the
same signature outlived that slice skips it and waits on the event at once. Rank 1 comes
0.2 s late to an all_reduce of 0.1 (rank 0's slice expires: the signature is
remembered), then on time until a run ends within 5 ms (forgotten), then late again
(remembered). Each time rank 0 reports what its context remembers. Then rank 1 raises
0.3 s after rank 0 entered the same all_reduce, which skipped the slice: rank 0 must
raise ``PeerFailure`` naming it, as from any other wait.
"""

import time

import torch
from lifecycle_common import emit, raised

import tether

LATE = 0.2
WATCHED = "all_reduce(SUM, float32[4])"  # the flag's all_reduce, under load, may outlive the slice too
ON_TIME_TRIES = 10  # a run on time may still outlive 5 ms on a loaded machine


def fn(local_rank: int) -> None:
    from tether._core.runtime import current  # the test reads what the context remembers, on purpose

    rank = tether.get_rank()
    t = torch.full((4,), 0.1)

    def run(late: bool) -> list[str]:
        tether.barrier()
        if late and rank == 1:
            time.sleep(LATE)
        tether.all_reduce(t)
        return remembered()

    def remembered() -> list[str]:
        return [signature for _, signature in current().outlived if signature == WATCHED]

    emit("round", rank=rank, late=True, outlived=run(late=True))
    tries = 0
    while True:  # every rank runs as many as rank 0 needs
        tries += 1
        kept = run(late=False)
        flag = torch.tensor([float(bool(kept) and tries < ON_TIME_TRIES)])
        tether.all_reduce(flag, op="MAX")  # another signature (not WATCHED): rank 0 decides for all
        if not flag.item():
            break
    emit("round", rank=rank, late=False, outlived=kept, tries=tries)
    emit("round", rank=rank, late=True, outlived=run(late=True))
    tether.barrier()
    began = time.time()
    try:
        if rank == 1:
            time.sleep(0.3)  # rank 0 is in the all_reduce by then
            emit("fault", rank=rank, time=time.time())
            raise ValueError("rank 1 failed 0.1 into a long all_reduce")
        tether.all_reduce(t)
    except BaseException as exc:
        raised(rank, exc, after=time.time() - began, outlived=remembered())
        raise


if __name__ == "__main__":
    tether.spawn("gloo", fn, (), nproc_per_node=2)
