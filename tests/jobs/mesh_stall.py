"""A raw wait on one of torch's own subgroups, bounded by ``sync_timeout`` (torchrun, 4 ranks).

    torchrun --nproc_per_node 4 mesh_stall.py

Every rank builds a 2-D DeviceMesh (``init_device_mesh("cpu", (2, 2))``): torch makes its
rows, {0, 1} and {2, 3}, with ``new_group``, imported by name inside DeviceMesh, with no
timeout (torch's default: 30 minutes). Rank 1 then stalls in user code while rank 0 waits
for it in a raw ``dist.all_reduce`` on their row; ranks 2 and 3 reduce on theirs, then work
in user code, in no call at all: nothing but the row's own timeout can end rank 0's wait.
With ``sync_timeout=TIMEOUT`` it must end within ``TIMEOUT`` + tether's margin.
"""

import os
import time

from lifecycle_common import emit, safe_str

TIMEOUT = 2.0


def main() -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    import tether

    tether.initialize("gloo", sync_timeout=TIMEOUT)
    rank = int(os.environ["RANK"])
    row = init_device_mesh("cpu", (2, 2)).get_group(1)
    tether.barrier()
    began = time.time()
    try:
        if rank == 1:
            emit("stall", rank=rank, time=began)
            time.sleep(60)
        dist.all_reduce(torch.ones(1), group=row)
        if rank in (2, 3):
            time.sleep(30)  # user code: this rank waits for nobody
    except BaseException as exc:
        cause = exc.__cause__
        emit(
            "raised",
            rank=rank,
            exc=type(exc).__name__,
            msg=safe_str(exc)[:400],
            cause=safe_str(cause)[:200] if cause is not None else "",
            after=time.time() - began,
        )
        raise


if __name__ == "__main__":
    main()
