"""Ranks pass mismatched tensors to a collective (issue 8, item 5): 2 ranks, ``tether.spawn``.

    python mismatch_job.py KIND [--check]

KIND: ``gather_shape`` (all_gather of 2 vs 3 elements), ``gather_dtype`` (float32 vs
int64), ``broadcast_shape`` (broadcast into 2 vs 3 elements), ``reduce_shape``
(all_reduce of 2 vs 3 elements), ``reduce_kind`` (all_reduce of an int vs a float),
``cross_kind`` (broadcast on rank 0, all_reduce on rank 1).
With ``--check`` the job runs with ``check_collectives=True``. Every rank reports what it
raised or what it got (``LC raised`` / ``LC got``).
"""

import sys

import torch
from lifecycle_common import emit, raised

import tether

KIND = sys.argv[1]
CHECK = "--check" in sys.argv


def fn(local_rank: int) -> None:
    rank = tether.get_rank()
    n = 2 + rank  # rank 0: 2 elements, rank 1: 3
    try:
        if KIND == "gather_shape":
            got = tether.all_gather(torch.full((n,), 0.1))
        elif KIND == "gather_dtype":
            got = tether.all_gather(torch.full((2,), 0.1) if rank == 0 else torch.ones(2, dtype=torch.int64))
        elif KIND == "broadcast_shape":
            got = tether.broadcast(torch.full((n,), 0.1 * (rank + 1)), src=0)
        elif KIND == "cross_kind":  # different collectives, same tensor
            t = torch.full((2,), 0.1)
            got = tether.broadcast(t, src=0) if rank == 0 else tether.all_reduce(t)
        elif KIND == "reduce_shape":
            got = tether.all_reduce(torch.full((n,), 0.1))
        else:
            got = tether.all_reduce(1 if rank == 0 else 0.1)
    except BaseException as exc:
        raised(rank, exc)
        raise
    emit("got", rank=rank, value=got.tolist() if isinstance(got, torch.Tensor) else got)


if __name__ == "__main__":
    tether.spawn("gloo", fn, (), nproc_per_node=2, check_collectives=CHECK)
