"""A store tether hosts goes on answering while a new client connects.

    python store_host.py HOW

HOW is ``spawn`` (``tether.spawn``: its launcher hosts the job's store) or ``initialize``
(two rank processes, ``tether.initialize`` on ``env://``: rank 0 hosts it). After a
barrier, rank 1 opens ``CLIENTS`` new connections to the job's store (``TCPStore``
clients of ``MASTER_ADDR:MASTER_PORT``), one after another, while rank 0 makes round
trips on a connection it opened before; then rank 1 sets a key, rank 0 sees it and
reports its slowest round trip::

    LC {"event": "connected", "rank": 1, "took": [s, ...]}
    LC {"event": "trips", "rank": 0, "n": ..., "slowest": s}

Run it under ``tests/slow_resolver.py --answer-after S``: each new connection looks up its
peer's address at both ends, S seconds each. A server that does its lookup on the thread
that answers every client stalls rank 0's round trips for S per connection.
"""

from __future__ import annotations

import datetime
import os
import sys
import time

from lifecycle_common import emit, free_port, start, wait_all

CLIENTS = 3
BOUND = 90.0
DONE = "store-host-test/done"


def _client() -> object:
    import torch.distributed as dist

    return dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False, timeout=datetime.timedelta(seconds=60)
    )


def body(rank: int) -> None:
    import tether

    mine = _client()
    tether.barrier()
    if rank == 1:
        took = []
        for _ in range(CLIENTS):
            t0 = time.perf_counter()
            _client()
            took.append(round(time.perf_counter() - t0, 4))
        emit("connected", rank=rank, took=took)
        mine.set(DONE, "1")  # type: ignore[attr-defined]
    else:
        slowest, n = 0.0, 0
        while True:
            t0 = time.perf_counter()
            done = mine.check([DONE])  # type: ignore[attr-defined]
            slowest, n = max(slowest, time.perf_counter() - t0), n + 1
            if done:
                break
            time.sleep(0.002)
        emit("trips", rank=rank, n=n, slowest=round(slowest, 4))
    tether.barrier()


def spawned(local_rank: int) -> None:
    import tether

    body(tether.get_rank())


def main() -> None:
    how = sys.argv[1]
    if how == "rank":  # store_host.py rank RANK
        import tether

        rank = int(sys.argv[2])
        tether.initialize("gloo", init_method="env://", rank=rank, world_size=2)
        body(rank)
        tether.finalize()
        return
    if how == "spawn":
        import tether

        tether.spawn("gloo", spawned, (), nproc_per_node=2)
        return
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    procs = {str(rank): start([__file__, "rank", str(rank)], env=env) for rank in (0, 1)}
    codes = wait_all(procs, BOUND)
    sys.exit(0 if all(code == 0 for code in codes.values()) else 1)


if __name__ == "__main__":
    main()
