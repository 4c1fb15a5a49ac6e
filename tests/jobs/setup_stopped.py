"""A stop while rank 0 waits in ``initialize`` for a straggler that never comes.

    torchrun --nproc_per_node 2 setup_stopped.py SIGINT|SIGTERM

Rank 1 is a straggler (its imports, a dataset's download: here a 60 s sleep) and never
reaches ``initialize``; rank 0 waits for it inside the group's creation, a wait in C++.
2 s into that wait rank 0 sends the stop: ``SIGINT`` to the job's whole process group (a
Ctrl-C in the terminal), ``SIGTERM`` to torchrun (a preemption; torchrun stops its
workers with SIGTERM). Python runs a handler only when that wait ends, and the wait
would end at the store's timeout (5 minutes): torchrun killed rank 0 after its own 30 s.
"""

import os
import signal
import sys
import threading
import time
from typing import Any

from lifecycle_common import emit

rank = int(os.environ["RANK"])
how = sys.argv[1]
if rank == 1:
    time.sleep(60.0)

import tether  # noqa: E402  (rank 1 never gets here)
from tether.backends import NativeBackend  # noqa: E402

create_group = NativeBackend.create_group


def stop_soon(self: NativeBackend, *args: Any, **kwargs: Any) -> None:
    def send() -> None:
        emit("stop sent", rank=rank, time=time.time())
        if how == "SIGINT":
            os.killpg(os.getpgid(0), signal.SIGINT)
        else:
            os.kill(os.getppid(), signal.SIGTERM)

    threading.Timer(2.0, send).start()
    create_group(self, *args, **kwargs)


NativeBackend.create_group = stop_soon  # type: ignore[method-assign]
tether.initialize("gloo")
emit("initialized", rank=rank)  # never: rank 1 does not come
