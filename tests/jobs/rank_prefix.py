"""One process that makes and ends three one-rank groups, makes a fourth, then raises.

    rank_prefix.py tether    three ``tether.initialize`` / ``tether.finalize`` rounds
    rank_prefix.py user      one tether round, then two of ``dist.init_process_group`` /
                             ``dist.destroy_process_group``
    rank_prefix.py torch-first  one round of ``dist.init_process_group`` /
                             ``dist.destroy_process_group`` before tether was called, then two
                             tether rounds
    rank_prefix.py failed    three tether rounds; the fourth group is a ``dist.init_process_group``
                             that raises (an unknown backend), and the job goes on without it

Each ``init_process_group`` of torch wraps ``sys.excepthook`` in one that starts every line
with "[rank0]: "; the uncaught ``ValueError`` shows how many prefixes its traceback got.
"""

from __future__ import annotations

import sys

import torch.distributed as dist
from lifecycle_common import free_port

import tether


def by_hand(kind: str, k: int) -> bool:
    return (kind == "user" and k > 0) or (kind == "torch-first" and k == 0)


def group(kind: str, k: int) -> None:
    method = f"tcp://127.0.0.1:{free_port()}"
    if by_hand(kind, k):
        dist.init_process_group("gloo", init_method=method, rank=0, world_size=1)
    else:
        tether.initialize("gloo", init_method=method, rank=0, world_size=1)


def end(kind: str, k: int) -> None:
    if by_hand(kind, k):
        dist.destroy_process_group()
    else:
        tether.finalize()


if __name__ == "__main__":
    kind = sys.argv[1]
    for k in range(3):
        group(kind, k)
        end(kind, k)
    if kind == "failed":
        try:
            dist.init_process_group(
                "no-such-backend", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
            )
        except Exception as error:  # torch 2.13: AssertionError, "Unknown backend type"
            print(f"init_process_group raised: {error}")
    else:
        group(kind, 3)
    raise ValueError("the job's own error after 3 groups: 0.1")
