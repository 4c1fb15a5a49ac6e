"""A job whose store's host freezes, as a node hosting the store would: ``store_silent.py``.

torchrun's agent hosts the job's store; no rank shares its process, and under torchrun
no rank judges the agent from /proc, so only the store's own silence can tell. The driver
starts torchrun (2 ranks), waits until both ranks met in a ``tether.barrier``, then
SIGSTOPs the agent: every store operation then waits until it resumes, whatever its
timeout. Rank 0 is in a second barrier (a store wait) when the agent stops; rank 1 enters
it 3 s later.

Each rank prints an ``LC raised`` line for what it raised, with the seconds from the stop
(``after``). The driver prints ``LC stopped``, then one ``LC gone`` per rank (whether its
process ended within 60 s of the stop, and when), SIGKILLs the frozen agent, and exits 0.

Usage: ``store_silent.py [NPROC]`` (driver; 2 ranks by default); torchrun runs
``store_silent.py rank DIR``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lifecycle_common import emit, free_port, raised

LOST_AFTER = 2.0  # the store may be silent for max(2 x lost_after, 10 s): 10 s
GRACE = 5.0


def rank_main(shared: Path) -> None:
    import tether

    tether.initialize("gloo", lost_after=LOST_AFTER, grace=GRACE)
    rank = tether.get_rank()
    tether.barrier()
    (shared / f"ready-{rank}").write_text(str(os.getpid()))
    while not (shared / "stopped-at").exists():
        time.sleep(0.05)
    if rank == 1:
        time.sleep(3.0)
    try:
        tether.barrier()  # a store wait on the frozen store
    except Exception as exc:
        raised(rank, exc, after=time.time() - float((shared / "stopped-at").read_text()))
        raise


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "rank":
        rank_main(Path(sys.argv[2]))
        return
    nproc = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    shared = Path(tempfile.mkdtemp())
    agent = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_addr", "127.0.0.1",
         "--master_port", str(free_port()), "--monitor_interval", "0.1", __file__, "rank", str(shared)]
    )  # fmt: skip
    deadline = time.monotonic() + 120.0
    ready = [shared / f"ready-{r}" for r in range(nproc)]
    while not all(p.exists() for p in ready) and time.monotonic() < deadline and agent.poll() is None:
        time.sleep(0.05)
    pids = [int(p.read_text()) for p in ready if p.exists()]
    os.kill(agent.pid, signal.SIGSTOP)
    stopped = time.time()
    (shared / "stopped-at").write_text(repr(stopped))
    emit("stopped", at=stopped, ranks=len(pids))
    gone: dict[int, float] = {}
    while len(gone) < len(pids) and time.time() - stopped < 60.0:
        for pid in pids:
            if pid not in gone and not _alive(pid):
                gone[pid] = time.time() - stopped
        time.sleep(0.05)
    for r, pid in enumerate(pids):
        emit("gone", rank=r, gone=pid in gone, after=gone.get(pid))
        if pid not in gone:
            os.kill(pid, signal.SIGKILL)
    agent.kill()
    agent.wait()


if __name__ == "__main__":
    main()
