"""SIGINT/SIGTERM honoured within 0.5 s where tether waits (issue 7, part 5).

    lifecycle_signals.py spawn SIG DIR          tether.spawn of 2 ranks (grace 1)
    torchrun --nproc_per_node 2 lifecycle_signals.py torchrun SIG DIR
                                                tether.initialize("gloo", grace=1) per rank
    lifecycle_signals.py plain SIG DIR          starts 2 rank processes itself, each calling
                                                tether.initialize("gloo", init_method=
                                                "tcp://127.0.0.1:PORT", rank=R, world_size=2,
                                                grace=1); prints LC "exit" lines for them

After a start barrier, rank 0 writes DIR/in_barrier (its pid) and waits in tether.barrier(),
which rank 1 does not join. Rank 1 is the sender: 0.3 s after rank 0 entered the barrier it
sends SIG (SIGINT or SIGTERM) to rank 0's process, then watches for rank 0 to write
DIR/caught (it caught KeyboardInterrupt/SystemExit) or to be gone, and prints
``LC {"event": "observed", "latency": ...}`` (None: no reaction within 3 s). Then rank 1
calls tether.barrier() itself, which must raise PeerFailure naming rank 0.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from lifecycle_common import emit, free_port, launcher_failed, raised, start, wait_all

import tether

SETTLE = 0.3  # seconds between rank 0 entering the barrier and the signal
WATCH = 3.0  # how long the sender waits for a reaction (6x the bound)


def write_json(path: Path, data: dict[str, object]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


def victim(out: Path) -> None:
    write_json(out / "in_barrier", {"pid": os.getpid(), "time": time.time()})
    emit("in_barrier", rank=0, pid=os.getpid(), time=time.time())
    try:
        tether.barrier()
    except BaseException as exc:
        now = time.time()
        write_json(out / "caught", {"time": now, "exc": type(exc).__name__})
        raised(0, exc)
        raise
    emit("passed", rank=0, time=time.time())


def sender(out: Path, signame: str) -> None:
    marker = out / "in_barrier"
    deadline = time.time() + 60
    while not marker.exists() and time.time() < deadline:
        time.sleep(0.005)
    pid = json.loads(marker.read_text())["pid"]
    time.sleep(SETTLE)
    sent = time.time()
    os.kill(pid, getattr(signal, signame))
    emit("sent", rank=1, pid=pid, signal=signame, time=sent)
    try:  # under torchrun the agent may SIGTERM this rank once rank 0 is gone: report that too
        how, at = None, None
        while time.time() < sent + WATCH:
            caught = out / "caught"
            if caught.exists():
                how, at = "caught", json.loads(caught.read_text())["time"]
                break
            if gone(pid):
                how, at = "exited", time.time()
                break
            time.sleep(0.002)
        emit("observed", rank=1, how=how, latency=None if at is None else round(at - sent, 4))
        tether.barrier()
    except BaseException as exc:
        raised(1, exc)
        raise
    emit("passed", rank=1, time=time.time())


def body(local_rank: int, signame: str, out: str) -> None:
    tether.barrier()  # the start line
    if tether.get_rank() == 0:
        victim(Path(out))
    else:
        sender(Path(out), signame)


def main() -> None:
    launcher, signame, out = sys.argv[1], sys.argv[2], sys.argv[3]
    # A shell starts a background job (``cmd &``, ``nohup``) with SIGINT ignored, and every
    # process of the job inherits it; tether, as Python, leaves an ignored signal ignored.
    # This job tests the handler, not the shell that ran the suite: restore Python's own.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if launcher == "spawn":
        try:
            tether.spawn("gloo", body, (signame, out), nproc_per_node=2, grace=1.0)
        except BaseException as exc:
            launcher_failed(exc)
            sys.exit(1)
        emit("launcher", exc=None)
    elif launcher == "torchrun":
        tether.initialize("gloo", grace=1.0)
        try:
            body(tether.get_local_rank(), signame, out)
        finally:
            tether.finalize()
    elif launcher == "plain-rank":
        rank, port = int(sys.argv[4]), int(sys.argv[5])
        tether.initialize("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, grace=1.0)
        try:
            body(rank, signame, out)
        finally:
            tether.finalize()
    elif launcher == "plain":
        port = str(free_port())
        procs = {str(r): start([__file__, "plain-rank", signame, out, str(r), port]) for r in (0, 1)}
        codes = wait_all(procs, bound=60.0)
        sys.exit(0 if all(c == 0 for c in codes.values()) else 1)
    else:
        raise SystemExit(f"unknown launcher {launcher!r}")


if __name__ == "__main__":
    main()
