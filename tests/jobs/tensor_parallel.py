"""A tensor-parallel step whose waits are torch's functional collectives (torchrun, 2 ranks).

    torchrun --nproc_per_node 2 tensor_parallel.py raise|stall

DTensor is imported before tether starts (``tether/_core/funcol.py`` wraps the module's
``wait_tensor`` then, not on its import). A ``Linear(4, 6)`` is split by columns
(``ColwiseParallel``, its output gathered to every rank): each forward all-gathers the
output shards and waits in ``funcol.wait_tensor``, in C++. Step 1 runs on every rank and
its output is checked against the unsharded layer. Before step 2 rank 1 raises (or
stalls, past ``sync_timeout``) in user code; rank 0 waits for its shard.
"""

import os
import sys
import time

import torch
import torch.distributed as dist
from lifecycle_common import emit, raised
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

import tether

TIMEOUT = 3.0


def main() -> None:
    mode = sys.argv[1]
    tether.initialize("gloo", sync_timeout=TIMEOUT)
    rank = dist.get_rank()
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 6)
    full = torch.nn.Linear(4, 6)
    full.load_state_dict(layer.state_dict())
    mesh = init_device_mesh("cpu", (2,))
    parallelize_module(layer, mesh, ColwiseParallel(output_layouts=torch.distributed.tensor.Replicate()))
    x = torch.full((3, 4), 0.1)
    out = layer(x)
    out = out.full_tensor() if hasattr(out, "full_tensor") else out
    emit("step", rank=rank, exact=torch.equal(out, full(x)), shape=list(out.shape))
    began = time.time()
    forward = False
    try:
        # both ranks are past step 1: a failure posted while a rank still read step 1's
        # gathered output would meet that wait (funcol's wait raises a known failure at once,
        # seen under a --full run's load: rank 0 never reported step 1). Inside the try: rank
        # 1 may leave the barrier first, and a failure can reach rank 0 still in it (seen in
        # CI: rank 0 stopped, nothing reported); ``forward`` tells the test where it was
        tether.barrier()
        if rank == 1:
            if mode == "raise":
                time.sleep(0.5)  # rank 0 is in the forward's wait by then
            emit("fault", rank=rank, time=time.time())
            if mode == "raise":
                raise ValueError("shard 0.1 lost on rank 1")
            time.sleep(60)
        forward = True
        layer(x)  # waits for rank 1's output shard
    except BaseException as exc:
        raised(rank, exc, after=time.time() - began, pid=os.getpid(), forward=forward)
        raise


if __name__ == "__main__":
    main()
