"""Check tether's NCCL paths on one GPU with two ranks (issue 9); not run in CI (no GPU).

    python benchmarks/nccl_check.py [--out benchmarks/results/nccl.md] [--timeout 60]

NCCL refuses two ranks on one GPU ("Duplicate GPU detected"). Giving each rank its own
``NCCL_HOSTID`` is reported to make NCCL treat them as two hosts that talk over sockets;
that is unverified with torch, so the script first tries it and says plainly when NCCL
refuses (exit 2, "CANNOT RUN"). Each check is a fresh 2-rank job (this script, launched
twice with torchrun's variables, one ``NCCL_HOSTID`` each), killed at ``--timeout``:

* (a) ``raw_future``: a raw ``dist.all_reduce(async_op=True)`` whose peer joins 2 s late:
  its future is done while ``work.is_completed()`` is still false (why tether polls).
* (b) ``tether_waits``: ``tether.all_reduce`` on a CUDA tensor, peer 2 s late: it does not
  return before the GPU finished (``is_completed()``), and the sum is right.
* (c) ``peer_raises``: rank 1 raises while rank 0 is blocked in ``tether.all_reduce``:
  rank 0 raises ``PeerFailure`` naming rank 1 within 5 s.
* (d) ``abort_bound``: rank 1 raises while rank 0 is blocked *outside* tether
  (``dist.all_reduce`` then ``torch.cuda.synchronize()``): the watchdog aborts NCCL's
  communicator and, whether or not the abort returns, rank 0 ends within ``grace + 2`` s.

Prints one PASS/FAIL line per check, writes them to ``--out`` with the date and the GPU,
and exits 1 on any FAIL, 2 when it cannot run, 0 otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

CHECKS = ("raw_future", "tether_waits", "peer_raises", "abort_bound")
LATE = 2.0  # seconds rank 1 joins late in (a) and (b)
GRACE = 3.0  # the watchdog's grace in (d)


def _say(event: str, **data: object) -> None:
    print("NCCL " + json.dumps({"event": event, **data}), flush=True)


# --- inside a rank ----------------------------------------------------------------------


def rank_main(check: str) -> None:
    import torch
    import torch.distributed as dist

    import tether

    tether.initialize("nccl", grace=GRACE)
    rank = tether.get_rank()
    device = tether.device()
    _say("device", rank=rank, device=str(device), hostid=os.environ.get("NCCL_HOSTID"))
    t = torch.ones(1 << 20, device=device)
    tether.barrier()
    if check == "raw_future":
        if rank == 1:
            time.sleep(LATE)
        work = dist.all_reduce(t, async_op=True)
        if rank == 0:
            _say("raw_future", future_done=work.get_future().done(), completed=work.is_completed())
        work.wait()
        torch.cuda.synchronize()
    elif check == "tether_waits":
        if rank == 1:
            time.sleep(LATE)
        start = time.monotonic()
        out = tether.all_reduce(t)
        took = time.monotonic() - start
        assert isinstance(out, torch.Tensor)
        if rank == 0:
            _say("tether_waits", took=took, total=float(out[:4].sum().item()))
    elif check in ("peer_raises", "abort_bound"):
        if rank == 1:
            time.sleep(1.0)
            raise RuntimeError("rank 1 failed on purpose")
        start = time.monotonic()
        _say("blocked", rank=rank, time=time.time())
        try:
            if check == "peer_raises":
                tether.all_reduce(t)
            else:
                dist.all_reduce(t)
                torch.cuda.synchronize()
        except BaseException as exc:
            _say("raised", rank=rank, exc=type(exc).__name__, msg=str(exc)[:300], took=time.monotonic() - start)
            raise
    tether.finalize()


# --- the driver -------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_job(check: str, timeout: float) -> tuple[list[dict[str, object]], str, list[int | None], float]:
    """Two ranks of this script; returns their NCCL events, output, exit codes and wall time."""
    port = _free_port()
    procs = []
    start = time.monotonic()
    for rank in range(2):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "NCCL_HOSTID": f"tether-check-{rank}",
            "PYTHONUNBUFFERED": "1",
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, __file__, "--rank-main", check],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        )
    outputs, codes = [], []
    for proc in procs:
        left = max(1.0, timeout - (time.monotonic() - start))
        try:
            out, _ = proc.communicate(timeout=left)
            codes.append(proc.returncode)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            codes.append(None)
        outputs.append(out)
    took = time.monotonic() - start
    text = "\n".join(outputs)
    events = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("NCCL {")]
    return events, text, codes, took


def _event(events: list[dict[str, object]], name: str) -> dict[str, object]:
    return next((e for e in events if e["event"] == name), {})


def judge(check: str, events: list[dict[str, object]], codes: list[int | None], took: float) -> tuple[bool, str]:
    if check == "raw_future":
        e = _event(events, "raw_future")
        ok = e.get("future_done") is True and e.get("completed") is False
        return ok, f"future done={e.get('future_done')}, is_completed()={e.get('completed')} (rank 1 {LATE:g} s late)"
    if check == "tether_waits":
        e = _event(events, "tether_waits")
        took_s, total = float(e.get("took", 0.0)), e.get("total")  # type: ignore[arg-type]
        ok = took_s >= LATE - 0.5 and total == 8.0 and codes == [0, 0]
        return ok, f"tether.all_reduce returned after {took_s:.2f} s (peer {LATE:g} s late), sum {total}, codes {codes}"
    e = _event(events, "raised")
    if check == "peer_raises":
        took_s = float(e.get("took", 99.0))  # type: ignore[arg-type]
        ok = e.get("exc") == "PeerFailure" and "rank 1" in str(e.get("msg")) and took_s < 5.0
        return ok, f"rank 0 raised {e.get('exc')} after {took_s:.2f} s: {str(e.get('msg'))[:120]}; codes {codes}"
    ended = codes[0] is not None
    ok = ended and took < 1.0 + GRACE + 2.0 + 15.0  # start-up included: generous for NCCL's init
    how = f"raised {e.get('exc')} after {float(e.get('took', 0.0)):.2f} s" if e else "no exception seen"  # type: ignore[arg-type]
    return ok, f"rank 0 {how}; exit codes {codes}; job took {took:.1f} s (grace {GRACE:g} s)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--checks", nargs="+", default=list(CHECKS), choices=CHECKS)
    args = parser.parse_args()
    today = datetime.date.today().isoformat()
    import torch

    if not torch.cuda.is_available():
        print(f"CANNOT RUN ({today}): this machine has no CUDA device; nothing was checked")
        return 2
    gpu = torch.cuda.get_device_name(0)
    versions = f"torch {torch.__version__}; NCCL {torch.cuda.nccl.version()}"
    lines = [f"# NCCL check, {today}", "", f"GPU: {gpu}; {versions}", ""]
    failed = False
    for check in args.checks:
        events, text, codes, took = run_job(check, args.timeout)
        if "Duplicate GPU" in text:
            print(f"CANNOT RUN ({today}): NCCL refused two ranks on one GPU even with NCCL_HOSTID:")
            print(text[-2000:])
            return 2
        ok, detail = judge(check, events, codes, took)
        failed = failed or not ok
        line = f"{'PASS' if ok else 'FAIL'} ({check}) {detail}"
        print(line, flush=True)
        lines.append(f"- {line}")
        if not ok:
            print(text[-3000:])
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--rank-main":
        rank_main(sys.argv[2])
    else:
        sys.exit(main())
