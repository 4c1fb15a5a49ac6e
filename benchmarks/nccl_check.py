"""Check tether's NCCL paths on one GPU with two ranks (issue 9); not run in CI (no GPU).

    NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 python benchmarks/nccl_check.py \
        [--out benchmarks/results/nccl.md] [--log jobs.log] [--timeout 60] [--launcher torchrun|plain]

NCCL refuses two ranks on one GPU ("Duplicate GPU detected"). Given one ``NCCL_HOSTID``
each, it treats them as two hosts that talk over sockets (seen on an H200 with NCCL
2.28.9, 2026-12-04: ``results/nccl.md``); where NCCL refuses even so, the script says
so plainly (exit 2, "CANNOT RUN"). Each check is a fresh 2-rank job, killed at
``--timeout``: under torchrun by default (each rank takes its ``NCCL_HOSTID`` from
``LOCAL_RANK``; the exit codes come from torchrun's failure summary), or, with
``--launcher plain``, this script started twice with torchrun's variables (tether does not
own such processes: Python's teardown runs at their exit).

* (a) ``raw_future``: a raw ``dist.all_reduce(async_op=True)`` whose peer joins 2 s late:
  its future is done while ``work.is_completed()`` is still false (why tether polls).
* (b) ``tether_waits``: ``tether.all_reduce`` on a CUDA tensor, peer 2 s late: it does not
  return before the GPU finished (``is_completed()``), and the sum is right.
* (c) ``peer_raises``: after one all-reduce together, rank 1 raises while rank 0 waits in
  ``tether.all_reduce``: rank 0 raises ``PeerFailure`` naming rank 1 within 0.5 s of it
  (the polled wait wakes at once).
* (c') ``peer_raises_first``: the same in the communicator's *first* collective, where NCCL
  blocks the issue itself while it connects the ranks: rank 0 raises ``PeerFailure``
  naming rank 1 (not NCCL's "internal error") once the ladder's abort (``grace / 2``) ends
  the issue, within 5 s of the start, and exits without a signal.
* (c'') ``stall_timeout``: ``sync_timeout=2``; rank 1 sleeps 10 s outside tether while
  rank 0 waits in ``tether.all_reduce``: rank 0 raises ``SyncTimeout`` naming rank 1
  within ``sync_timeout + grace`` s.
* (d) ``abort_bound``: rank 1 raises while rank 0 is blocked *outside* tether
  (``dist.all_reduce`` then ``torch.cuda.synchronize()``): torch's watchdog or tether's
  ladder aborts NCCL's communicator; whether or not the abort returns, rank 0 ends within
  ``grace + 2`` s, and without a signal; its next tether call raises the failure.
* (e) ``ddp_grads``: one backward of a plain DDP and of one guarded by
  ``tether.register_comm_hook`` (~32 MB of ``Linear`` layers, different data per rank),
  rank 1 reaching backward 2 s late: rank 0's gradients equal plain DDP's. NCCL completes
  the hook's future at enqueue, so a future handed to the reducer without the work's CUDA
  events lets the reducer copy the bucket before it was reduced (the ``ddp.py`` fix).
* (f) ``ddp_peer_raises``: rank 1 raises at step 3 of a loop over ``tether.auto_model``'s
  DDP; rank 0, whose CPU runs ahead of NCCL, ends within ``grace + 2`` s, and the job's
  output holds rank 1's error.
* (g) ``group_gate``: every rank makes ``dist.new_group([0, 1])`` (the members' store gate
  before torch's creation, ``_core/making.py``), then waits on an async all-reduce's work
  on it with ``work.wait()`` (tether's wrapper, ``rawcalls._name_work_waits``) and
  synchronizes: the sum is right, and both ranks exit 0.
* (g') ``group_peer_raises``: rank 1 raises 1 s in, where rank 0 makes a group of both:
  rank 0 raises ``PeerFailure`` naming rank 1 at the gate, within 1.5 s of the start.
* (h) ``funcol_sum``: ``funcol.all_reduce(t, "sum", WORLD).wait()`` on a CUDA tensor,
  through tether's wrapper of ``wait_tensor`` (``_core/funcol.py``), rank 1 2 s late: the
  sum is right, and both ranks exit 0.
* (h') ``funcol_peer_raises``: after one such all-reduce together, rank 1 raises 1 s in
  while rank 0 waits on the next one and reads its sum (``.item()``: NCCL's wait only
  orders the stream, the CPU blocks in the copy): rank 0 ends within ``grace + 2`` s of
  the failure, without a signal, and the job's output holds rank 1's error.

Prints one PASS/FAIL line per check, writes them to ``--out`` with the date and the GPU,
and exits 1 on any FAIL, 2 when it cannot run, 0 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

CHECKS = (
    "raw_future",
    "tether_waits",
    "peer_raises",
    "peer_raises_first",
    "stall_timeout",
    "abort_bound",
    "ddp_grads",
    "ddp_peer_raises",
    "group_gate",
    "group_peer_raises",
    "funcol_sum",
    "funcol_peer_raises",
)
LATE = 2.0  # seconds rank 1 joins late in (a) and (b)
GRACE = 3.0  # the watchdog's grace in (c'), (d) and (f)
SYNC_TIMEOUT = 2.0  # (c'')


def _say(event: str, **data: object) -> None:
    print("NCCL " + json.dumps({"event": event, **data}), flush=True)


# --- inside a rank ----------------------------------------------------------------------


def rank_main(check: str) -> None:
    import torch
    import torch.distributed as dist

    import tether

    # under torchrun every rank gets the same environment: one NCCL "host" per rank, as in run_job
    os.environ.setdefault("NCCL_HOSTID", f"tether-check-{os.environ['LOCAL_RANK']}")
    tether.initialize("nccl", grace=GRACE, sync_timeout=SYNC_TIMEOUT if check == "stall_timeout" else None)
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
    elif check in ("peer_raises", "peer_raises_first", "stall_timeout", "abort_bound"):
        if check != "peer_raises_first":
            tether.all_reduce(t)  # the communicator's first collective, together: its channels connect
        if rank == 1 and check == "stall_timeout":
            time.sleep(10.0)
            return
        if rank == 1:
            time.sleep(1.0)
            raise RuntimeError("rank 1 failed on purpose")
        start = time.monotonic()
        _say("blocked", rank=rank, time=time.time())
        try:
            if check != "abort_bound":
                tether.all_reduce(t)
            else:
                dist.all_reduce(t)
                torch.cuda.synchronize()
                _say("returned", rank=rank, took=time.monotonic() - start)  # torch's own abort ends the kernel
                tether.barrier()  # the next tether call raises the failure
        except BaseException as exc:
            _say("raised", rank=rank, exc=type(exc).__name__, msg=str(exc)[:300], took=time.monotonic() - start)
            raise
    elif check == "group_gate":
        pair = dist.new_group([0, 1])
        work = dist.all_reduce(t, group=pair, async_op=True)
        assert work is not None
        work.wait()
        torch.cuda.synchronize()
        if rank == 0:
            _say("group_gate", total=float(t[:4].sum().item()))
    elif check == "group_peer_raises":
        if rank == 1:
            time.sleep(1.0)
            raise RuntimeError("rank 1 failed on purpose")
        start = time.monotonic()
        try:
            dist.new_group([0, 1])
        except BaseException as exc:
            _say("raised", rank=rank, exc=type(exc).__name__, msg=str(exc)[:300], took=time.monotonic() - start)
            raise
    elif check in ("funcol_sum", "funcol_peer_raises"):
        _funcol(check, rank, t)
    elif check == "ddp_grads":
        _ddp_grads(rank, device)
    elif check == "ddp_peer_raises":
        _ddp_peer_raises(rank, device)
    tether.finalize()


def _funcol(check: str, rank: int, t: torch.Tensor) -> None:
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol  # after the start: tether wraps it on import

    import tether

    if check == "funcol_sum":
        if rank == 1:
            time.sleep(LATE)
        total = float(funcol.all_reduce(t, "sum", dist.group.WORLD).wait()[:4].sum().item())
        if rank == 0:
            _say("funcol_sum", total=total, wrapped=hasattr(funcol.wait_tensor, "__wrapped__"))
        return
    funcol.all_reduce(t, "sum", dist.group.WORLD).wait()  # together: the communicator connects
    before = t.sum().item()  # the CPU waits for the GPU: both ranks are past the first
    if rank == 1:
        time.sleep(1.0)
        raise RuntimeError("rank 1 failed on purpose")
    start = time.monotonic()
    _say("blocked", rank=rank, time=time.time(), before=before)
    try:
        funcol.all_reduce(t, "sum", dist.group.WORLD).wait().sum().item()
        _say("returned", rank=rank, took=time.monotonic() - start)
        tether.barrier()  # the next tether call raises the failure
    except BaseException as exc:
        _say("raised", rank=rank, exc=type(exc).__name__, msg=str(exc)[:300], took=time.monotonic() - start)
        raise


def _layers(device: torch.device) -> torch.nn.Module:
    import torch

    torch.manual_seed(0)  # the same weights on both ranks
    return torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)]).to(device)


def _synchronize(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _ddp_grads(rank: int, device: torch.device) -> None:
    import copy

    import torch
    from torch.nn.parallel import DistributedDataParallel

    import tether

    net = _layers(device)
    ids = None if device.type == "cpu" else [device.index]  # cpu: a smoke test of this check on gloo
    plain = DistributedDataParallel(copy.deepcopy(net), device_ids=ids)
    guarded = DistributedDataParallel(copy.deepcopy(net), device_ids=ids)
    tether.register_comm_hook(guarded)
    torch.manual_seed(1 + rank)  # different data per rank: an unreduced gradient differs from the mean
    x = torch.randn(256, 1024, device=device)
    took = {}
    for name, model in (("plain", plain), ("guarded", guarded)):
        loss = model(x).square().mean()
        _synchronize(device)
        if rank == 1:
            time.sleep(LATE)
        start = time.monotonic()
        loss.backward()
        took[name] = round(time.monotonic() - start, 4)
        _synchronize(device)
    pairs = [(a.grad, b.grad) for a, b in zip(plain.parameters(), guarded.parameters(), strict=True)]
    diff = max(float((a - b).abs().max()) for a, b in pairs if a is not None and b is not None)
    scale = max(float(a.abs().max()) for a, _ in pairs if a is not None)
    bitwise = all(a is not None and b is not None and torch.equal(a, b) for a, b in pairs)
    _say("ddp_grads", rank=rank, max_diff=diff, grad_scale=scale, bitwise=bitwise, backward_s=took)


def _ddp_peer_raises(rank: int, device: torch.device) -> None:
    import torch

    import tether

    model = tether.auto_model(_layers(device))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.manual_seed(1 + rank)
    x = torch.randn(256, 1024, device=device)
    start = time.monotonic()
    try:
        for step in range(6):
            if step == 3:
                start = time.monotonic()
                _say("blocked", rank=rank, time=time.time())
                if rank == 1:
                    time.sleep(1.0)
                    raise RuntimeError("rank 1 failed on purpose at step 3")
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            _say("step", rank=rank, step=step, loss=loss.item())  # .item() waits for the GPU
    except BaseException as exc:
        _say("raised", rank=rank, exc=type(exc).__name__, msg=str(exc)[:300], took=time.monotonic() - start)
        raise


# --- the driver -------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_TORCHRUN_CODE = re.compile(r"rank\s*:\s*(\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def run_job(check: str, timeout: float, launcher: str) -> tuple[list[dict[str, object]], str, list[int | None], float]:
    """Two ranks of this script; returns their NCCL events, output, exit codes and wall time."""
    if launcher == "torchrun":
        return _run_torchrun(check, timeout)
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
    return _events(text), text, codes, took


def _run_torchrun(check: str, timeout: float) -> tuple[list[dict[str, object]], str, list[int | None], float]:
    """The job under torchrun (each rank picks its ``NCCL_HOSTID`` from ``LOCAL_RANK``); the
    ranks' exit codes are read from torchrun's failure summary (a rank not in it exited 0)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    command += ["--master-addr", "127.0.0.1", "--master-port", str(_free_port()), __file__, "--rank-main", check]
    start = time.monotonic()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        text, _ = proc.communicate(timeout=timeout)
        listed = {int(r): int(c) for r, c in _TORCHRUN_CODE.findall(text)}
        codes: list[int | None] = [listed.get(r, 0) for r in range(2)]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        text, _ = proc.communicate()
        codes = [None, None]
    took = time.monotonic() - start
    return _events(text), text, codes, took


def _events(text: str) -> list[dict[str, object]]:
    """Every ``NCCL {...}`` event in ``text``, also where two ranks' lines ran into each other."""
    decoder, events, at = json.JSONDecoder(), [], text.find("NCCL {")
    while at >= 0:
        with contextlib.suppress(ValueError):
            events.append(decoder.raw_decode(text, at + 5)[0])
        at = text.find("NCCL {", at + 5)
    return events


def _event(events: list[dict[str, object]], name: str) -> dict[str, object]:
    return next((e for e in events if e["event"] == name), {})


def _no_signal(code: int | None) -> bool:
    return code is not None and code >= 0  # ended, and not by a signal (SIGABRT at teardown: -6)


def judge(
    check: str, events: list[dict[str, object]], codes: list[int | None], took: float, text: str
) -> tuple[bool, str]:
    if check == "raw_future":
        e = _event(events, "raw_future")
        ok = e.get("future_done") is True and e.get("completed") is False
        return ok, f"future done={e.get('future_done')}, is_completed()={e.get('completed')} (rank 1 {LATE:g} s late)"
    if check == "tether_waits":
        e = _event(events, "tether_waits")
        took_s, total = float(e.get("took", 0.0)), e.get("total")  # type: ignore[arg-type]
        ok = took_s >= LATE - 0.5 and total == 8.0 and codes == [0, 0]
        return ok, f"tether.all_reduce returned after {took_s:.2f} s (peer {LATE:g} s late), sum {total}, codes {codes}"
    if check == "funcol_sum":
        e = _event(events, "funcol_sum")
        ok = e.get("total") == 8.0 and e.get("wrapped") is True and codes == [0, 0]
        how = f"through tether's wait_tensor: {e.get('wrapped')}"
        return ok, f"funcol all-reduce ({how}): sum {e.get('total')}, codes {codes}"
    if check == "group_gate":
        total = _event(events, "group_gate").get("total")
        ok = total == 8.0 and codes == [0, 0]
        return ok, f"all-reduce on a new group, its work waited: sum {total}, codes {codes}"
    if check == "ddp_grads":
        e = next((e for e in events if e["event"] == "ddp_grads" and e["rank"] == 0), {})
        diff, scale = float(e.get("max_diff", 99.0)), float(e.get("grad_scale", 0.0))  # type: ignore[arg-type]
        ok = diff <= 1e-6 * max(scale, 1e-30) and codes == [0, 0]
        return ok, (
            f"rank 0: guarded vs plain DDP gradients max |diff| {diff:.3g} (largest gradient {scale:.3g}), "
            f"bitwise {e.get('bitwise')}, backward {e.get('backward_s')} s (peer {LATE:g} s late); codes {codes}"
        )
    e = next((e for e in events if e["event"] == "raised" and e["rank"] == 0), {})
    if check in ("ddp_peer_raises", "funcol_peer_raises"):
        ok = _no_signal(codes[0]) and took < 1.0 + GRACE + 2.0 + 20.0 and "failed on purpose" in text
        how = f"raised {e.get('exc')} after {e.get('took')} s: {str(e.get('msg'))[:120]}" if e else "no exception seen"
        cause = "failed on purpose" in text
        return ok, f"rank 0 {how}; exit codes {codes}; job took {took:.1f} s (grace {GRACE:g} s); cause shown: {cause}"
    if check in ("peer_raises", "peer_raises_first", "stall_timeout", "group_peer_raises"):
        took_s = float(e.get("took", 99.0))  # type: ignore[arg-type]
        want, within = {
            "peer_raises": ("PeerFailure", 1.0 + 0.5),  # rank 1 raises 1 s in
            "peer_raises_first": ("PeerFailure", 5.0),
            "group_peer_raises": ("PeerFailure", 1.0 + 0.5),
            "stall_timeout": ("SyncTimeout", SYNC_TIMEOUT + GRACE),
        }[check]
        ok = e.get("exc") == want and "rank 1" in str(e.get("msg")) and took_s < within and _no_signal(codes[0])
        return ok, f"rank 0 raised {e.get('exc')} after {took_s:.2f} s: {str(e.get('msg'))[:160]}; codes {codes}"
    ok = _no_signal(codes[0]) and took < 1.0 + GRACE + 2.0 + 15.0  # start-up included: generous for NCCL's init
    back = next((r for r in events if r["event"] == "returned" and r["rank"] == 0), {})
    how = f"raised {e.get('exc')} after {e.get('took')} s" if e else "no exception seen"
    if back:
        how = f"returned from the raw wait after {back.get('took')} s, then {how}"
    return ok, f"rank 0 {how}; exit codes {codes}; job took {took:.1f} s (grace {GRACE:g} s)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--checks", nargs="+", default=list(CHECKS), choices=CHECKS)
    parser.add_argument(
        "--launcher",
        choices=("torchrun", "plain"),
        default="torchrun",
        help="torchrun (tether owns the ranks: a failed rank ends with os._exit) or plain processes "
        "with torchrun's variables (Python's teardown runs)",
    )
    parser.add_argument("--log", type=Path, default=None, help="every job's whole output, appended")
    args = parser.parse_args()
    today = datetime.date.today().isoformat()
    import torch

    if not torch.cuda.is_available():
        print(f"CANNOT RUN ({today}): this machine has no CUDA device; nothing was checked")
        return 2
    gpu = torch.cuda.get_device_name(0)
    versions = f"torch {torch.__version__}; NCCL {torch.cuda.nccl.version()}"
    lines = [f"# NCCL check, {today}", "", f"GPU: {gpu}; {versions}; launcher: {args.launcher}", ""]
    failed = False
    for check in args.checks:
        events, text, codes, took = run_job(check, args.timeout, args.launcher)
        if "Duplicate GPU" in text:
            print(f"CANNOT RUN ({today}): NCCL refused two ranks on one GPU even with NCCL_HOSTID:")
            print(text[-2000:])
            return 2
        ok, detail = judge(check, events, codes, took, text)
        if args.log is not None:
            with args.log.open("a") as log:
                log.write(f"===== {check}: codes {codes}, {took:.1f} s\n{text}\n")
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
