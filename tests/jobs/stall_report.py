"""A stall without a timeout: rank 0 waits in barrier while rank 1 sleeps in user code.

With ``warn_after=1`` rank 0 must log one stall report naming rank 1 and its Python
stack, then finish normally once rank 1 arrives.
"""

from __future__ import annotations

import os
import time

import tether


def slow_preprocessing() -> None:
    time.sleep(3.0)


def main(local_rank: int) -> None:
    if tether.get_rank() == 1:
        slow_preprocessing()
    tether.barrier()
    os.write(1, f"RESULT rank={tether.get_rank()} passed the barrier\n".encode())


if __name__ == "__main__":
    tether.spawn("gloo", main, (), nproc_per_node=2, warn_after=1.0)
