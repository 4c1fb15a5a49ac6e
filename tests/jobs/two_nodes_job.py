"""One node of a two-node job (2 nodes x 2 ranks) on loopback.

    python two_nodes_job.py spawn --node-rank K --port P --case C --out DIR
        this process is node K's launcher: tether.spawn(nnodes=2, node_rank=K, ...)
    torchrun --nnodes 2 --node_rank K ... two_nodes_job.py torchrun --case C --out DIR
        this process is one rank, under tether.Parallel(backend) (torchrun's static rendezvous)

Every rank reports with one ``EVENT {json}`` line on stdout (a single ``os.write``, so
lines of different processes never interleave). ``DIR/ready.<rank>`` tells the driver a
rank has joined and reached the point where its node may be killed.

Cases:
    happy        getters, barrier, all_reduce and all_gather across the nodes
    local_first  one_rank_first(local=True): node 0's local rank 0 works 3 s, node 1's 0.3 s
    raise        rank 3 (node 1) raises while the other ranks wait in a barrier
    node_lost    node 1's ranks sleep; node 0's wait in a barrier (the driver kills node 1)
    host_lost    node 0's ranks sleep; node 1's wait in a barrier (the driver kills node 0)
    stall        rank 3 (node 1) stalls in its own code; the others' barrier times out
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import torch
from lifecycle_common import hold_gil

import tether as idist

OPTIONS: dict[str, Any] = {"heartbeat": 0.5, "lost_after": 3.0}


def emit(**data: Any) -> None:
    os.write(1, f"EVENT {json.dumps(data, sort_keys=True)}\n".encode())


def caught(rank: int, exc: BaseException) -> None:
    now = time.time()
    data: dict[str, Any] = {"event": "caught", "rank": rank, "exc": type(exc).__name__, "t": now, "msg": str(exc)[:300]}
    if isinstance(exc, idist.PeerFailure):
        notice_ms = (now - exc.record.time) * 1000 if exc.record.time else None
        # seq and reporter: which record each survivor read. A 4.0 s notice (2026-12-07)
        # read seq 1: the poster's own store add had stalled (test-times.md)
        data.update(failed=exc.rank, orig=exc.exc_type, notice_ms=notice_ms, seq=exc.record.seq)
        data.update(reporter=exc.record.reporter)
    if isinstance(exc, idist.SyncTimeout) and exc.record is not None:
        data.update(failed=exc.record.rank, host=exc.record.host, pid=exc.record.pid)
    emit(**data)


def ready(out: str, rank: int) -> None:
    Path(out, f"ready.{rank}").touch()


def happy(rank: int, node: int, local: int, out: str) -> None:
    total = idist.all_reduce(torch.tensor([rank + 1]))
    gathered = idist.all_gather(torch.tensor([node, local]))
    names = idist.all_gather(f"node{node}-local{local}")
    idist.barrier()
    emit(event="happy", rank=rank, total=int(total.item()), gathered=gathered.tolist(), names=names)


def linger(rank: int, node: int, local: int, out: str) -> None:
    """The happy path, with 3 s between two collectives: the keepers judge their host 6 times."""
    time.sleep(3.0)
    happy(rank, node, local, out)


def gil_on_node_1(rank: int, node: int, local: int, out: str) -> None:
    """Node 1's local rank 0 holds its GIL 7 s in one C call (its node's heartbeat was its
    keeper's: lost_after is 3 s) while the others wait in a barrier; then the happy path."""
    if rank == 2:
        time.sleep(1.5)  # its node beats first: a node that never beat is not judged
        emit(event="held", rank=rank, seconds=round(hold_gil(7.0), 3))
    happy(rank, node, local, out)


def stop_while_node_1_holds(rank: int, node: int, local: int, out: str) -> None:
    """Rank 0 gets a SIGTERM of its own 0.5 s into a barrier, while rank 3, on node 1, holds
    its GIL 8 s in one C call and cannot answer where it is. The stop is rank 0's own."""
    if rank == 0:
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
    try:
        if rank == 3:
            start = time.time()
            try:
                hold_gil(8.0)  # its launcher's SIGTERM, once rank 2 failed, cuts it short
            finally:
                emit(event="held", rank=rank, seconds=round(time.time() - start, 3), t=time.time())
        idist.barrier()
    except BaseException as exc:
        caught(rank, exc)
        raise


def local_first(rank: int, node: int, local: int, out: str) -> None:
    with idist.one_rank_first(local=True):
        t_in = time.time()
        if local == 0:
            time.sleep(3.0 if node == 0 else 0.3)
        t_out = time.time()
    emit(event="block", rank=rank, node=node, local=local, t_in=t_in, t_out=t_out)
    idist.barrier()


def raise_on_node_1(rank: int, node: int, local: int, out: str) -> None:
    if rank == 3:
        time.sleep(1.0)  # the others are in the barrier by now
        emit(event="raise", rank=rank, t=time.time())
        raise ValueError("injected failure on node 1, rank 3")
    try:
        idist.barrier()
    except Exception as exc:
        caught(rank, exc)
        raise


def wait_for_kill(victim: int):  # type: ignore[no-untyped-def]
    def case(rank: int, node: int, local: int, out: str) -> None:
        ready(out, rank)
        if node == victim:
            time.sleep(120.0)  # killed with its launcher
            return
        try:
            idist.barrier()
        except Exception as exc:
            caught(rank, exc)
            raise

    return case


def stall_on_node_1(rank: int, node: int, local: int, out: str) -> None:
    if rank == 3:
        while True:  # alive, never arriving: ended by tether once the others' timeout is posted
            time.sleep(0.1)
    try:
        idist.barrier(timeout=2.0)
    except Exception as exc:
        caught(rank, exc)
        raise


CASES = {
    "happy": happy,
    "gil_on_node_1": gil_on_node_1,
    "linger": linger,
    "local_first": local_first,
    "raise": raise_on_node_1,
    "node_lost": wait_for_kill(1),
    "host_lost": wait_for_kill(0),
    "stall": stall_on_node_1,
    "stop_while_node_1_holds": stop_while_node_1_holds,
}


def work(local_rank: int, case: str, out: str) -> None:
    rank, node = idist.get_rank(), idist.get_node_rank()
    topo = (idist.get_world_size(), idist.get_nnodes(), idist.get_nproc_per_node(), idist.get_local_rank())
    if topo != (4, 2, 2, local_rank) or rank != node * 2 + local_rank:
        raise AssertionError(f"rank {rank} on node {node}: unexpected topology {topo}")
    emit(event="joined", rank=rank, node=node, local=local_rank, pid=os.getpid())
    idist.barrier()
    CASES[case](rank, node, local_rank, out)
    emit(event="done", rank=rank)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("launcher", choices=["spawn", "torchrun"])
    parser.add_argument("--case", choices=sorted(CASES), required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    options = {**OPTIONS, "grace": 2.0} if args.case == "stall" else OPTIONS  # the staller's end: 2 s after
    if args.launcher == "spawn":
        idist.spawn(
            "gloo",
            work,
            (args.case, args.out),
            nproc_per_node=2,
            nnodes=2,
            node_rank=args.node_rank,
            master_addr="127.0.0.1",
            master_port=args.port,
            **options,
        )
    else:
        with idist.Parallel("gloo", **options) as parallel:
            parallel.run(work, args.case, args.out)


if __name__ == "__main__":
    main()
