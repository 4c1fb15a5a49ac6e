"""Process groups that come and go (issue 7, part 2): 3 rounds in one process pair.

    lifecycle_cycles.py KIND METHOD [METHOD ...]
        KIND "user": each round is ``dist.init_process_group("gloo", init_method=...,
        rank=r, world_size=2)``, tether calls, ``dist.destroy_process_group()``.
        KIND "tether": ``tether.initialize("gloo", init_method=..., rank=r, world_size=2)``,
        tether calls, ``tether.finalize()``.
        METHOD: ``env`` (``env://``, MASTER_ADDR/MASTER_PORT in the ranks' environment, the
        same port every round), ``tcp`` (``tcp://127.0.0.1:PORT``, a fresh port every round,
        drawn by rank 0 as the round begins and handed to rank 1 in a file: a port drawn
        at the job's start was once taken by a test beside it before round 2 came),
        ``file`` (``file:///tmp/...``, a fresh file every round).
        This process starts one pair of rank processes per METHOD, all at once, each rank
        a fresh interpreter with its stderr in a file; after they exit it prints each
        rank's stderr as ``STDERR <method> <rank>: <line>`` and ``LC {"event": "exit",
        "name": "<method>/<rank>", "code": ...}``.
    torchrun --nproc_per_node 2 lifecycle_cycles.py torchrun tether
        3 rounds of ``tether.initialize("gloo")`` / ``tether.finalize()`` from torchrun's
        environment (torchrun's agent store outlives every round).

Each rank prints ``LC {"event": "round", ...}`` per round: what the getters answered before,
during and after the round, ``all_reduce(rank + 1)``, ``all_gather(100 * round + rank)``, and how long
rank 0 waited in a barrier that rank 1 reaches 0.5 s late (a stale key from an earlier round
would release it at once). After round 0 both ranks do local work for 6 s, longer than the
default grace (5 s). An exception is reported as ``LC {"event": "error", ...}`` and ends the rank.

With ``LIFECYCLE_SLOW_HOST=S`` in the environment, rank 0 (the host of the ``env://`` store)
sleeps S seconds at the end of each ``finalize``'s farewell, between its peer's last word
and the store's close, as a loaded machine may (KIND "tether"), or before each
``destroy_process_group`` (KIND "user"); the local work after round 0 is skipped. A rank
that does not wait for the old store to close reaches it on the next round's port. In
KIND "user", round 1 has rank 1 sleep instead: the host destroys and makes the next
round's store at once, and rank 1, leaving its group later, must not take that new store
for its old one and wait for it to close.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from lifecycle_common import emit, free_port, safe_str, start, wait_all

ROUNDS = 3
LOCAL_WORK = 6.0  # seconds of local work after round 0: longer than the default grace (5 s)
LATE = 0.5  # rank 1 reaches each barrier this late


def one_round(kind: str, init_method: str | None, rank: int, k: int) -> dict[str, object]:
    import torch.distributed as dist

    import tether

    before = {"before_world": tether.get_world_size(), "before_rank": tether.get_rank()}
    if kind == "user":
        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=2)
    elif init_method is None:
        tether.initialize("gloo")
    else:
        tether.initialize("gloo", init_method=init_method, rank=rank, world_size=2)
    out: dict[str, object] = {"round": k, **before, "world": tether.get_world_size(), "seen_rank": tether.get_rank()}
    out["sum"] = tether.all_reduce(rank + 1)
    t = time.monotonic()
    if rank == 1:
        time.sleep(LATE)
    tether.barrier()
    out["waited"] = round(time.monotonic() - t, 3)
    out["gathered"] = tether.all_gather(100 * k + rank)
    if kind == "user":
        late = float(os.environ.get("LIFECYCLE_SLOW_HOST", "0"))
        if rank == (1 if k == 1 else 0):  # the host destroys late, but in round 1 its peer does
            time.sleep(late)
        t = time.monotonic()
        dist.destroy_process_group()
    else:
        t = time.monotonic()
        tether.finalize()
    # how long the rank's end of the round took: a rank that waits for the host's old store
    # to close takes at least LIFECYCLE_SLOW_HOST (a failure's story, when it comes again)
    out["ended_in"] = round(time.monotonic() - t, 3)
    out["after_world"], out["after_rank"] = tether.get_world_size(), tether.get_rank()
    return out


def slow_host(rank: int, seconds: float) -> None:
    """Make this rank, if it hosts the store, slow between its farewell and the store's close."""
    from tether._core import ending

    leave = ending._leave

    def slow(ctx: object) -> None:
        leave(ctx)  # type: ignore[arg-type]
        if rank == 0:
            time.sleep(seconds)

    ending._leave = slow  # type: ignore[assignment]


_PORT_FILE = "port-file:"  # an address to be drawn as the round begins (see ``round_address``)


def round_address(address: str | None, rank: int) -> str | None:
    """``address``, or for ``port-file:PATH`` a ``tcp://`` address whose port rank 0 draws
    now and writes to PATH (a rename: rank 1 never reads half of it), and rank 1 reads."""
    if address is None or not address.startswith(_PORT_FILE):
        return address
    path = Path(address.removeprefix(_PORT_FILE))
    if rank == 0:
        path.with_suffix(".new").write_text(str(free_port()))
        path.with_suffix(".new").rename(path)
    deadline = time.monotonic() + 60.0
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 0 never wrote {path}")
        time.sleep(0.01)
    return f"tcp://127.0.0.1:{path.read_text()}"


def rank_main(kind: str, method: str, rank: int, addresses: list[str | None]) -> None:
    slowed = float(os.environ.get("LIFECYCLE_SLOW_HOST", "0"))
    if slowed:
        slow_host(rank, slowed)
    for k in range(ROUNDS):
        try:
            out = one_round(kind, round_address(addresses[k], rank), rank, k)
        except BaseException as exc:
            emit("error", method=method, rank=rank, round=k, exc=type(exc).__name__, msg=safe_str(exc)[:300])
            raise
        emit("round", method=method, rank=rank, **out)
        if k == 0 and not slowed:
            time.sleep(LOCAL_WORK)


def addresses(method: str, tmp: str) -> list[str | None]:
    if method == "env":
        return ["env://"] * ROUNDS
    if method == "tcp":
        return [f"{_PORT_FILE}{tmp}/{method}-port-{k}" for k in range(ROUNDS)]
    if method == "file":
        return [f"file://{tmp}/{method}-store-{k}" for k in range(ROUNDS)]
    raise SystemExit(f"unknown init method {method!r}")


def main() -> None:
    if sys.argv[1] == "rank":  # lifecycle_cycles.py rank KIND METHOD RANK ADDRESS...
        kind, method, rank = sys.argv[2], sys.argv[3], int(sys.argv[4])
        rank_main(kind, method, rank, [a or None for a in sys.argv[5:]])
        return
    if sys.argv[1] == "torchrun":  # a rank under torchrun
        rank_main(sys.argv[2], "torchrun", int(os.environ["RANK"]), [None] * ROUNDS)
        return
    kind, methods = sys.argv[1], sys.argv[2:]
    with tempfile.TemporaryDirectory(prefix="tether-cycles-") as tmp:
        procs = {}
        files = {}
        for method in methods:
            addrs = addresses(method, tmp)
            env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())} if method == "env" else {}
            for rank in (0, 1):
                name = f"{method}/{rank}"
                files[name] = Path(tmp, f"{method}-{rank}.err")
                with open(files[name], "wb") as err:
                    argv = [__file__, "rank", kind, method, str(rank), *[a or "" for a in addrs]]
                    procs[name] = start(argv, env=env, stderr=err)
        codes = wait_all(procs, bound=40.0 if os.environ.get("LIFECYCLE_SLOW_HOST") else 100.0)
        for name in procs:
            method, rank = name.split("/")
            for line in files[name].read_text(errors="replace").splitlines():
                sys.stderr.write(f"STDERR {method} {rank}: {line}\n")
        sys.stderr.flush()
    sys.exit(0 if all(c == 0 for c in codes.values()) else 1)


if __name__ == "__main__":
    main()
