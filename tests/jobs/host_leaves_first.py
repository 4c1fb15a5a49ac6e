"""The store's host leaves first while a peer still works: its store must outlive the job.

    python host_leaves_first.py HOW AFTER

Two rank processes on ``env://`` (``tether.initialize``): rank 0 hosts the store, as a
plain ``python train.py`` job's rank 0 does (under torchrun and ``tether.spawn`` the
launcher hosts it). After one barrier rank 0 leaves by HOW, without ``finalize``:
``os-exit0`` (``os._exit(0)``) or ``return`` (its script ends). Rank 1 works on for
``WORK`` seconds (``HOST_FIRST_WORK``, 3 by default: a final save, no peer needed), then
does AFTER: ``finalize`` (it ends cleanly) or ``barrier`` (it waits for rank 0, who has
left: ``PeerFinished``).

    python host_leaves_first.py adopted [finalize]

A group the user made (``dist.init_process_group``) where only rank 0 ever calls tether
(with ``finalize``: both ranks call ``tether.finalize()`` at the end, which for rank 1,
never adopted, does nothing): rank 1 never registers, so nothing would tell rank 0 that it
left. Rank 0 must not wait for it, at exit or in its ``finalize``, and rank 1, which never
needs the store again, ends cleanly too. Rank 1 sleeps ``WORK`` seconds from rank 0's
adoption (a file rank 0 creates then): adopting opens store connections, which a slow
resolver makes slow (1 s each, and the group's host's lookups one after another, under
``tests/slow_resolver.py --answer-after 0.5``: 4.5 s), and a sleep counted from the
group's start ended before rank 0 had adopted.

The parent prints ``LC {"event": "ended", "rank": r, "time": ...}`` as each rank's process
ends (polled every 10 ms), then each rank's stderr as ``STDERR <rank>: <line>``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from lifecycle_common import emit, free_port, raised, start

WORK = float(os.environ.get("HOST_FIRST_WORK", "3"))  # seconds rank 1 works after rank 0 left
BOUND = 60.0


def rank_main(how: str, after: str, rank: int) -> None:
    import tether

    tether.initialize("gloo", init_method="env://", rank=rank, world_size=2)
    tether.barrier()
    if rank == 0:
        emit("left", rank=rank, how=how, time=time.time())
        if how == "os-exit0":
            os._exit(0)
        return
    started = time.monotonic()
    while time.monotonic() - started < WORK:
        time.sleep(0.05)
    emit("worked", rank=rank, seconds=round(time.monotonic() - started, 3), time=time.time())
    if after == "finalize":
        tether.finalize()
        emit("finalized", rank=rank, time=time.time())
        return
    emit("waits", rank=rank, time=time.time())
    try:
        tether.barrier()
    except BaseException as exc:
        raised(rank, exc)
        raise


def adopted_main(after: str, rank: int) -> None:
    import torch.distributed as dist

    import tether

    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=2)
    adopted = Path(os.environ["HOST_FIRST_ADOPTED"])
    if rank == 0:
        emit("adopted", rank=rank, world=tether.get_world_size(), time=time.time())
        adopted.touch()
        if after == "finalize":
            tether.finalize()
        return  # at exit: tether's context retires; rank 1 never registered
    if after == "finalize":
        tether.finalize()  # no context: nothing to leave
    deadline = time.monotonic() + BOUND
    while not adopted.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(WORK)  # no store needed


def main() -> None:
    if sys.argv[1] == "rank":  # host_leaves_first.py rank HOW AFTER RANK
        how, after, rank = sys.argv[2], sys.argv[3], int(sys.argv[4])
        if how == "adopted":
            adopted_main(after, rank)
        else:
            rank_main(how, after, rank)
        return
    how, after = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "")
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    if how == "adopted":  # no wait for every rank's hostname: rank 1 never gives one
        env.update(LOCAL_WORLD_SIZE="2")
    with tempfile.TemporaryDirectory(prefix="tether-host-first-") as tmp:
        procs, files = {}, {}
        for rank in (0, 1):
            files[rank] = Path(tmp, f"{rank}.err")
            with open(files[rank], "wb") as err:
                rank_env = {**env, "HOST_FIRST_ADOPTED": str(Path(tmp, "adopted"))}
                if how == "adopted":
                    rank_env["LOCAL_RANK"] = str(rank)
                procs[rank] = start([__file__, "rank", how, after, str(rank)], env=rank_env, stderr=err)
        deadline = time.monotonic() + BOUND
        codes: dict[int, int | None] = {}
        while len(codes) < len(procs) and time.monotonic() < deadline:
            for rank, proc in procs.items():
                if rank not in codes and proc.poll() is not None:
                    codes[rank] = proc.returncode
                    emit("ended", rank=rank, code=proc.returncode, time=time.time())
            time.sleep(0.01)
        for rank, proc in procs.items():
            if rank not in codes:
                proc.kill()
                proc.wait()
                emit("ended", rank=rank, code=None, time=time.time())
        for rank in procs:
            for line in files[rank].read_text(errors="replace").splitlines():
                sys.stderr.write(f"STDERR {rank}: {line}\n")
        sys.stderr.flush()
    sys.exit(0 if all(codes.get(r) == 0 for r in procs) else 1)


if __name__ == "__main__":
    main()
