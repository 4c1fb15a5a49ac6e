"""A wait on a store tether did not make (``tether/_core/storewaits.py``): ``store_waits.py HOW STORE OP``.

``tether.spawn``, 2 ranks. After a barrier, rank 0 waits on STORE (``default``: torch's
default store, ``own``: a ``TCPStore`` that rank 0 hosts, ``job``: a ``TCPStore`` client
of ``MASTER_ADDR:MASTER_PORT``, the launcher's store) with OP (``get``, ``multi_get``,
or ``wait`` and then ``get``) for the key ``k``, which rank 1 sets 0.5 s later to ``v 0.1``, unless HOW
strikes it first: ``raise`` (ValueError), ``kill`` (SIGKILL to itself), ``return`` (it
returns from the function) or ``stall`` (it sleeps for a minute; the job's
``sync_timeout`` is 3 s). ``set`` strikes nothing.

Rank 0 reports ``waits`` (when its wait began) and ``got`` (the value) or ``raised``;
rank 1 reports ``strike`` before it strikes; the launcher reports ``launcher``.
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
import time

import torch.distributed as dist
from lifecycle_common import emit, free_port, launcher_failed, raised

import tether

HOW, STORE, OP = sys.argv[1:4]
SYNC_TIMEOUT = 3.0


def fn(local_rank: int, port: int) -> None:
    rank = tether.get_rank()
    if STORE == "default":
        store = dist.distributed_c10d._get_default_store()
    elif STORE == "job":  # a client of the job's store server, as a script under torchrun may make
        port = int(os.environ["MASTER_PORT"])
        store = dist.TCPStore(os.environ["MASTER_ADDR"], port, 2, False, timeout=datetime.timedelta(seconds=120))
    else:
        store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=datetime.timedelta(seconds=120))
    tether.barrier()
    if rank == 1:
        time.sleep(0.5)
        emit("strike", rank=rank, how=HOW, time=time.time())
        if HOW == "raise":
            raise ValueError("bad 0.1 on rank 1")
        if HOW == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if HOW == "stall":
            time.sleep(60.0)
        if HOW != "return":
            store.set("k", "v 0.1")
            tether.barrier()  # rank 0's store must outlive rank 0's read
        return
    emit("waits", rank=rank, time=time.time())
    try:
        if OP == "wait":
            store.wait(["k"])
        got = store.multi_get(["k"])[0] if OP == "multi_get" else store.get("k")
    except BaseException as exc:
        # when the failure was posted: a late notice says whether the post or the wake was late
        # (a --full run saw PeerLost 4.5 s after the kill, once; not seen in 90 runs by hand)
        record = getattr(exc, "record", None)
        raised(rank, exc, posted=record.time if record is not None else None)
        raise
    emit("got", rank=rank, value=got.decode())
    tether.barrier()


if __name__ == "__main__":
    options = {"sync_timeout": SYNC_TIMEOUT} if HOW == "stall" else {}
    try:
        tether.spawn("gloo", fn, (free_port(),), nproc_per_node=2, **options)
    except tether.JobFailed as exc:
        launcher_failed(exc)
        raise
    emit("launcher", exit_codes={"0": 0, "1": 0})
