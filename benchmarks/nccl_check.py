"""Check tether's NCCL paths on one GPU (not run in CI: it has no GPU).

    python benchmarks/nccl_check.py

One rank under ``tether.spawn`` with the nccl backend: process-group creation bound to
the rank's device, collectives whose tensors live on CUDA, the store gates, and the
failure path (a raise inside ``one_rank_first`` followed by a bounded exit that aborts
the process group instead of destroying it). Prints one PASS/FAIL line per check and
exits non-zero on any failure.
"""

from __future__ import annotations

import sys
import time

import torch

import tether


def checks(local_rank: int) -> None:
    assert tether.backend() == "nccl", tether.backend()
    device = tether.device()
    assert device.type == "cuda", device
    t = torch.ones(4, device=device)
    out = tether.all_reduce(t)
    assert isinstance(out, torch.Tensor) and out.device.type == "cuda" and out.sum().item() == 4
    assert tether.all_reduce(3) == 3
    assert tether.broadcast(2**60 + 1) == 2**60 + 1
    assert tether.broadcast("gpu", safe_mode=True) == "gpu"
    assert tether.all_gather({"r": 0}) == [{"r": 0}]
    tether.barrier()
    with tether.one_rank_first():
        pass
    print("PASS collectives and gates on CUDA", flush=True)


def failing(local_rank: int) -> None:
    with tether.one_rank_first():
        raise ValueError("planned failure on the GPU rank")


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        sys.exit(0)
    ok = True
    tether.spawn("nccl", checks, (), nproc_per_node=1)
    start = time.monotonic()
    try:
        tether.spawn("nccl", failing, (), nproc_per_node=1)
        print("FAIL: the failing job succeeded")
        ok = False
    except tether.JobFailed as exc:
        took = time.monotonic() - start
        good = exc.record is not None and exc.record.exc_type == "ValueError" and took < 60
        print(f"{'PASS' if good else 'FAIL'} failure path: {exc} (ended in {took:.1f} s, codes {exc.exit_codes})")
        ok = ok and good
    sys.exit(0 if ok else 1)
