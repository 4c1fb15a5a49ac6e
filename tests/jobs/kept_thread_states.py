"""Every gloo thread keeps its Python thread state once it ran a callback of tether's.

    python kept_thread_states.py

``tether.spawn``, 2 ranks on gloo. Each rank counts the thread states with no Python frame
(a state made for a thread of torch's, as pybind11 makes one to run a callback: Python's
own threads have frames), then:

1. two DDP steps, before any collective of tether's: the one bucket settles in a callback
   on one of gloo's threads. In each step one rank is 0.1 s late to its backward, the
   other's callback waits for it: a rank that arrives last may find its bucket's work done
   before the callback is attached, and run it on its own thread (a fresh clone's run,
   2026-12-06, when the job made one step). The delay comes after the forward: step 1's
   forward broadcasts DDP's rebuilt bucket order, which brings the ranks level again (a
   fresh clone's run, 2026-12-06, with the delay before it: rank 0 kept no state);
2. 21 ``all_reduce`` (rank 1 0.3 s late to the first, so that rank 0's wait outlasts its
   first 5 ms and wakes on the completion callback): ``Keeper`` hands each a callback
   until every gloo thread of the rank has kept its state.

Each rank reports the count after each (``LC states``), the number of gloo's threads and
the results. Before ``_core/threadstates.py`` each count stayed where it started:
pybind11 deleted the state as the callback ended, and made it again on the next entry,
taking CPython's runtime lock without the GIL (a fork then could hang its child).
"""

import ctypes
import os
import time
from pathlib import Path

import torch
from lifecycle_common import emit
from torch.nn.parallel import DistributedDataParallel

import tether

_api = ctypes.pythonapi
_api.PyInterpreterState_Main.restype = ctypes.c_void_p
_api.PyInterpreterState_ThreadHead.argtypes = [ctypes.c_void_p]
_api.PyInterpreterState_ThreadHead.restype = ctypes.c_void_p
_api.PyThreadState_Next.argtypes = [ctypes.c_void_p]
_api.PyThreadState_Next.restype = ctypes.c_void_p
_api.PyThreadState_GetFrame.argtypes = [ctypes.c_void_p]
_api.PyThreadState_GetFrame.restype = ctypes.c_void_p
_api.Py_DecRef.argtypes = [ctypes.c_void_p]


def frameless_states() -> int:
    """Thread states of this interpreter that run no Python now (C API, public since 3.9):
    the fewest of 5 counts 20 ms apart, as a thread of Python's also has none for a moment,
    as it starts (a fresh clone's run once counted one such at the start)."""
    counts = []
    for _ in range(5):
        counts.append(_count_frameless())
        time.sleep(0.02)
    return min(counts)


def _count_frameless() -> int:
    count = 0
    state = _api.PyInterpreterState_ThreadHead(_api.PyInterpreterState_Main())
    while state:
        frame = _api.PyThreadState_GetFrame(state)  # a new reference, or NULL
        if frame:
            _api.Py_DecRef(frame)
        else:
            count += 1
        state = _api.PyThreadState_Next(state)
    return count


def gloo_threads() -> int:
    names = (Path(f"/proc/self/task/{t}/comm").read_text().strip() for t in os.listdir("/proc/self/task"))
    return sum(name == "pt_gloo_runloop" for name in names)


def fn(local_rank: int) -> None:
    rank = tether.get_rank()
    emit("states", rank=rank, at="start", frameless=frameless_states(), gloo_threads=gloo_threads())
    torch.manual_seed(0)
    model = tether.auto_model(torch.nn.Linear(4, 1))  # DDP, its one bucket settled by tether's hook
    assert isinstance(model, DistributedDataParallel)
    for step in range(2):
        model.zero_grad()
        loss = model(torch.full((2, 4), 0.1 * (rank + 1))).sum()
        if rank == step:  # after the forward: step 1's syncs the ranks (DDP's bucket rebuild)
            time.sleep(0.1)
        loss.backward()
    time.sleep(0.2)  # gloo's thread has long left the callback: a state it did not keep is gone
    grad = float(model.module.weight.grad[0, 0])
    emit("states", rank=rank, at="ddp", frameless=frameless_states(), grad=grad)
    if rank == 1:
        time.sleep(0.3)
    total = float(tether.all_reduce(torch.tensor(0.1 * (rank + 1))))
    for _ in range(20):
        tether.all_reduce(1)
    time.sleep(0.2)
    emit("states", rank=rank, at="keeper", frameless=frameless_states(), total=total, gloo_threads=gloo_threads())


if __name__ == "__main__":
    tether.spawn("gloo", fn, (), nproc_per_node=2)
