"""What ``tether.spawn`` tells its workers, as ignite's spawn does (issue 10).

fidelity_env.py
    runs with ``MASTER_PORT`` set in its environment (by the test); ``tether.spawn``
    2 workers, each printing ``ENV {json}`` with RANK, LOCAL_RANK, WORLD_SIZE,
    LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT from its ``os.environ``, and what
    ignite's getters-by-environment would read. The launcher's store must listen on
    that very ``MASTER_PORT``.
"""

from __future__ import annotations

import json
import os

import tether

NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def body(local_rank: int) -> None:
    seen = {name: os.environ.get(name) for name in NAMES}
    seen.update(rank=tether.get_rank(), local_rank=local_rank)
    os.write(1, ("ENV " + json.dumps(seen, sort_keys=True) + "\n").encode())  # one write: lines never interleave
    tether.barrier()


if __name__ == "__main__":
    tether.spawn("gloo", body, (), nproc_per_node=2)
