"""A torchrun job whose rank 1 fails while rank 0 is still in ``initialize``.

    STOP_AT=stopped|raised torchrun --nproc_per_node 2 output_stop_in_start.py

Rank 1 raises as its own creation of the group ends, inside ``initialize``: no rank leaves
``initialize`` before every rank's group is made (``runtime._all_made``). Rank 0 is still
in it (seen in CI, when rank 1 could leave first and fail in its code: gloo's mesh was
complete on rank 1 first, and rank 0's creation of the group then failed with "Connection
closed by peer"). Here rank 0's creation of the group lasts 3 s on purpose, then fails
with the backend's error, so that it is there every time:

``stopped``: torchrun's SIGTERM, sent once rank 1 ended, lands in the creation (before:
  the default handler killed rank 0 without a word, "exitcode: -15").
``raised``: rank 1's exit is held (an exit function of the job's), so that no SIGTERM
  comes first (before: Python's own traceback of the PeerFailure, exit code 1).
"""

import atexit
import os
import time
from typing import Any

import torch.distributed as dist

import tether as idist
from tether.backends import NativeBackend

rank = int(os.environ["RANK"])
where = os.environ["STOP_AT"]
if rank == 0:
    create_group = NativeBackend.create_group

    def slow_creation(self: NativeBackend, *args: Any, **kwargs: Any) -> None:
        create_group(self, *args, **kwargs)
        time.sleep(3.0)  # rank 1 fails meanwhile
        raise dist.DistBackendError("Connection closed by peer [127.0.0.1]:1 (as gloo's, 0.1)")

    NativeBackend.create_group = slow_creation  # type: ignore[method-assign]
else:
    create_group = NativeBackend.create_group

    def failing_creation(self: NativeBackend, *args: Any, **kwargs: Any) -> None:
        create_group(self, *args, **kwargs)
        raise RuntimeError("download failed 0.1 on rank 1")

    NativeBackend.create_group = failing_creation  # type: ignore[method-assign]
    if where == "raised":
        atexit.register(time.sleep, 10.0)  # torchrun's SIGTERM would come 10 s after rank 1's failure
idist.initialize("gloo")
try:
    idist.barrier()
finally:
    idist.finalize()
