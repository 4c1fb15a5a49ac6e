"""A stall without a timeout: rank 0 waits while rank 1 sleeps in user code.

    python stall_report.py [raw]

With ``warn_after=1`` rank 0 must log one stall report naming rank 1 and its Python
stack, then finish normally once rank 1 arrives. Rank 0 waits in tether's ``barrier``;
with ``raw``, in waits outside tether: a raw ``dist.all_reduce``, then ``store.get`` of a
key rank 1 sets on torch's default store (one report each).
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

import tether

RAW = sys.argv[1:] == ["raw"]


def slow_preprocessing() -> None:
    time.sleep(3.0)


def main(local_rank: int) -> None:
    if RAW:
        raw_waits()
        return
    if tether.get_rank() == 1:
        slow_preprocessing()
    tether.barrier()
    os.write(1, f"RESULT rank={tether.get_rank()} passed the barrier\n".encode())


def raw_waits() -> None:
    store = dist.distributed_c10d._get_default_store()
    if tether.get_rank() == 1:
        slow_preprocessing()
    dist.all_reduce(torch.ones(1))
    if tether.get_rank() == 1:
        slow_preprocessing()
        store.set("ready", "1")
    else:
        store.get("ready")
    os.write(1, f"RESULT rank={tether.get_rank()} passed the raw waits\n".encode())


if __name__ == "__main__":
    tether.spawn("gloo", main, (), nproc_per_node=2, warn_after=1.0)
