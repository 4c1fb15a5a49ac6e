"""How fast a failure reaches every rank, and what the watchdog costs when nothing fails.

Usage::

    python benchmarks/faults.py                         # 2 4 8 16 ranks, every kind, 3 repeats
    python benchmarks/faults.py --quick                 # 2 4 ranks, 1 repeat, 5 s idle window
    python benchmarks/faults.py --ranks 4 --kinds sigkill stall --repeats 5
    python benchmarks/faults.py --idle-only --idle-seconds 60
    python benchmarks/faults.py --ranks 2 4 --launcher spawn torchrun \
        --torchrun-kinds raise_allreduce sigkill sigstop

Fault latency. Every job runs under ``tether.spawn`` (gloo; ``--launcher spawn``, the
default) or under torchrun (``--launcher torchrun``: ``python -m torch.distributed.run
--nproc_per_node N --master_addr 127.0.0.1 --master_port <free>`` with its defaults, each
worker calling ``tether.initialize("gloo")``), launched as a fresh interpreter started as
its own session, bounded, and checked for leftover processes. ``--kinds`` are run under
``tether.spawn``, ``--torchrun-kinds`` (default: the same) under torchrun; each launcher's
figures are a section of their own. Before each section (and before the idle cost) the
driver waits until the 1-minute load average is below ``--wait-load`` (default 1.5;
polled every 20 s, up to ``--wait-max`` s, then it measures anyway and says so); the
result file gives the load at the start of every section and at the end.
Each rank stamps ``time.time()`` (one clock: one machine) to its own file when it is
ready, when it injects the fault (the victim, just before it), and when it catches the
tether exception (survivors, first statement of the ``except``). Per run:

* (a) *notice*: fault -> every survivor raised = max over survivors of
  ``caught - fault``; the table also gives the median over all survivors of all runs.
* (b) *gone*: fault -> every process gone = the launcher's exit (its pipes closed and
  it was reaped, as seen by this driver). ``ranks gone`` is fault -> ``tether.spawn``
  returned in the launcher (every rank reaped; not known under torchrun).

Under torchrun two things can tell a survivor: tether's own judge (the keeper thread of
each other rank of the host reads the victim's /proc state every 0.2 s) and torchrun's
agent, which SIGTERMs the remaining workers once it sees one end (``--monitor-interval``,
0.1 s by default); tether turns that SIGTERM into the peer's failure (a sweep of the
host's ranks). The torchrun section counts the survivors that raised by that path
("via SIGTERM"; the exception's ``__cause__`` is the ``SignalStop``).

Kinds (the victim is rank N-1, except for ``raise_ofr``: rank 0):

==================  =============================================================
raise_ofr           ``one_rank_first(0)``: rank 0's block raises; the others wait
raise_allreduce     rank N-1 raises while the others sit in ``tether.all_reduce``
raise_backward      rank N-1 raises while the others sit in ``loss.backward()`` of a DDP
                    model from ``tether.auto_model`` (tether's guard on DDP's all-reduce)
exit                rank N-1 calls ``os._exit(3)`` while the others all_reduce
sigkill             rank N-1 SIGKILLs itself while the others all_reduce
sigstop             rank N-1 SIGSTOPs itself (a freeze): a judge on the same host (the
                    spawn launcher; under torchrun the other ranks' keepers) sees /proc
                    state ``T`` for ``lost_after`` (``--lost-after``, default 2.0 s),
                    posts the loss and SIGKILLs it
stall               ``barrier(timeout=1.0)`` while rank N-1 sleeps in user code; the
                    fault time is the earliest survivor's barrier entry + 1.0 s
==================  =============================================================

Idle cost. ``--idle-ranks`` ranks under ``tether.spawn`` (``tether<r>``), and as many
under torchrun with ``tether.initialize`` (``tether_torchrun<r>``: there each rank's keeper
judges the other ranks of its host from /proc), sit initialized and idle for
``--idle-seconds``; each measures its own CPU time (``getrusage(RUSAGE_SELF)``: every
thread of the process) over that window and counts its store operations by wrapping the
methods of ``TCPStore`` (class-level: the connections the listener and keeper threads
cloned before the wrap are ``TCPStore`` objects too, and count). Each rank checks that
after the window: one operation on the channel's pre-existing connection and one on a
fresh clone, from a probe thread, must both be counted (``counter check`` in the table).
At the same time, two baselines idle for the same window: a process that only imported
torch, and a raw ``torch.distributed`` gloo rank (torchrun, no tether).

Writes ``benchmarks/results/faults.md``, ``faults.png`` and ``faults.json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE))

KINDS = ["raise_ofr", "raise_allreduce", "raise_backward", "exit", "sigkill", "sigstop", "stall"]
STALL_TIMEOUT = 1.0
VICTIM_DELAY = 0.3  # the victim waits this long after the last barrier, so the others are waiting


# --- inside a rank -----------------------------------------------------------------------------


def _note(outdir: str, rank: int, event: str, **extra: object) -> None:
    with open(os.path.join(outdir, f"r{rank}.jsonl"), "a") as fp:
        fp.write(json.dumps({"ev": event, "t": time.time(), "rank": rank, **extra}) + "\n")


def job(local_rank: int, kind: str, outdir: str) -> None:
    import tether

    rank, n = tether.get_rank(), tether.get_world_size()
    victim = 0 if kind == "raise_ofr" else n - 1
    tether.barrier()
    tether.all_reduce(1)  # every path warm
    model = _ddp() if kind == "raise_backward" else None
    tether.barrier()
    _note(outdir, rank, "ready")
    try:
        if rank == victim:
            _fault(kind, outdir, rank)
        elif kind == "raise_ofr":
            with tether.one_rank_first(0):
                pass
        elif kind == "stall":
            _note(outdir, rank, "enter")
            tether.barrier(timeout=STALL_TIMEOUT)
        elif model is not None:
            _step(model)  # waits in backward() for the victim's gradients
        else:
            tether.all_reduce(1)
        _note(outdir, rank, "returned")  # a survivor that was not told: a bug
    except tether.TetherError as exc:
        record = getattr(exc, "record", None)
        _note(
            outdir,
            rank,
            "caught",
            exc=type(exc).__name__,
            posted=getattr(record, "time", None),
            reporter=getattr(record, "reporter", None),
            sigterm=isinstance(exc.__cause__, SystemExit),  # torchrun's SIGTERM, traced to the peer
        )
        raise
    except BaseException as exc:  # anything else a survivor raised (a bug, or a bare SIGTERM)
        _note(outdir, rank, "other", exc=type(exc).__name__, message=str(exc)[:300])
        raise


def _ddp() -> object:
    """A small DDP model from ``auto_model``, two steps in: its buckets are rebuilt already."""
    import torch

    import tether

    torch.manual_seed(0)
    model = tether.auto_model(torch.nn.Linear(64, 8))
    for _ in range(2):
        _step(model)
    return model


def _step(model: object) -> None:
    import torch

    model(torch.full((4, 64), 0.1)).sum().backward()  # type: ignore[operator]


def _fault(kind: str, outdir: str, rank: int) -> None:
    import tether

    time.sleep(VICTIM_DELAY)
    if kind == "raise_ofr":
        with tether.one_rank_first(0):
            _note(outdir, rank, "fault")
            raise RuntimeError("benchmark: the download failed")
    if kind == "stall":
        time.sleep(120)  # the watchdog's ladder ends this process after its grace
        return
    _note(outdir, rank, "fault")
    if kind == "raise_allreduce":
        raise RuntimeError("benchmark: rank failed while the others all_reduce")
    if kind == "raise_backward":
        raise RuntimeError("benchmark: rank failed while the others are in backward()")
    if kind == "exit":
        os._exit(3)
    if kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(120)  # if ever continued
    raise ValueError(kind)


def _options(kind: str, heartbeat: float, lost_after: float) -> dict[str, float]:
    return {"heartbeat": heartbeat, "lost_after": lost_after} if kind == "sigstop" else {}


def launch(kind: str, n: int, outdir: str, heartbeat: float, lost_after: float) -> None:
    """The launcher process of one fault job."""
    import tether

    opts = _options(kind, heartbeat, lost_after)
    failed = False
    try:
        tether.spawn("gloo", job, args=(kind, outdir), nproc_per_node=n, **opts)
    except tether.JobFailed:
        failed = True
    Path(outdir, "launcher.json").write_text(json.dumps({"spawn_returned": time.time(), "failed": failed}))
    sys.exit(1 if failed else 0)


def torchrun_worker(kind: str, outdir: str, heartbeat: float, lost_after: float) -> None:
    """One rank of a fault job under torchrun."""
    import tether

    tether.initialize("gloo", **_options(kind, heartbeat, lost_after))
    job(int(os.environ["LOCAL_RANK"]), kind, outdir)
    tether.finalize()


def torchrun_args(n: int, *script_args: str) -> list[str]:
    """torchrun on loopback, its defaults otherwise (monitor interval 0.1 s), running this file."""
    import _proc

    return _proc.torchrun(n, __file__, *script_args)


# --- idle cost ----------------------------------------------------------------------------------

_STORE_OPS = (
    "add",
    "append",
    "check",
    "compare_set",
    "delete_key",
    "get",
    "list_keys",
    "multi_get",
    "multi_set",
    "num_keys",
    "queue_len",
    "queue_pop",
    "queue_push",
    "set",
    "wait",
)


def _count_store_ops() -> dict[str, int]:
    """Wrap every TCPStore operation (class-level: clones count too); per-thread counts."""
    import torch.distributed as dist

    counts: dict[str, int] = {}
    lock = threading.Lock()
    cls = dist.TCPStore
    for name in _STORE_OPS:
        original = getattr(cls, name)

        def wrapper(
            self: object, *args: object, _orig: object = original, _name: str = name, **kwargs: object
        ) -> object:
            key = f"{threading.current_thread().name}:{_name}"
            with lock:
                counts[key] = counts.get(key, 0) + 1
            return _orig(self, *args, **kwargs)  # type: ignore[operator]

        setattr(cls, name, wrapper)
    return counts


def _thread_cpu() -> dict[str, int]:
    """ns on CPU per thread, from /proc/self/task/*/schedstat; Python threads by their name."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            ns = int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0])
            comm = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
        except OSError:
            continue
        out[f"{names.get(int(tid), comm)}/{tid}"] = ns
    return out


def _idle_window(seconds: float, counts: dict[str, int] | None = None) -> dict[str, object]:
    before = dict(counts) if counts is not None else {}
    c0 = _thread_cpu()
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    time.sleep(seconds)
    r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    c1 = _thread_cpu()
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    per_thread = {k.rsplit("/", 1)[0]: (v - c0.get(k, 0)) / 1e6 for k, v in c1.items() if v - c0.get(k, 0) > 0}
    out: dict[str, object] = {"wall": t1 - t0, "cpu": cpu, "threads": threading.active_count(), "thread_ms": per_thread}
    if counts is not None:
        after = dict(counts)
        out["ops"] = {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}
    return out


def _counter_check(counts: dict[str, int]) -> dict[str, object]:
    """Are operations on the channel's connections counted, from a thread other than the main one?

    ``channel._store`` was cloned before the wrap (as the listener's and keeper's
    connections were); ``channel.client()`` is a fresh clone. Both must show up.
    """
    from tether._core.context import peek

    ctx = peek()
    assert ctx is not None and ctx.channel is not None
    channel = ctx.channel
    fresh = channel.client()
    out: dict[str, object] = {"types": sorted({type(s).__name__ for s in (ctx.store, channel._store, fresh)})}

    def probe() -> None:
        channel._store.check([channel.key("bench-probe")])
        fresh.check([channel.key("bench-probe")])

    t = threading.Thread(target=probe, name="bench-probe")
    t.start()
    t.join()
    out["counted"] = counts.get("bench-probe:check", 0)
    out["ok"] = out["counted"] == 2
    return out


def idle_job(local_rank: int, seconds: float, outdir: str, prefix: str = "tether") -> None:
    import tether

    counts = _count_store_ops()
    tether.barrier()
    time.sleep(1.0)  # let the start-up settle
    res = _idle_window(seconds, counts)
    res["native_threads"] = len(os.listdir("/proc/self/task"))
    res["counter_check"] = _counter_check(counts)
    Path(outdir, f"{prefix}{tether.get_rank()}.json").write_text(json.dumps(res))
    tether.barrier()


def idle_launch(n: int, seconds: float, outdir: str) -> None:
    import tether

    tether.spawn("gloo", idle_job, args=(seconds, outdir), nproc_per_node=n)


def idle_torchrun_worker(seconds: float, outdir: str) -> None:
    import tether

    tether.initialize("gloo")
    idle_job(int(os.environ["LOCAL_RANK"]), seconds, outdir, prefix="tether_torchrun")
    tether.finalize()


def idle_raw_worker(seconds: float, outdir: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    dist.barrier()
    time.sleep(1.0)
    res = _idle_window(seconds)
    res["native_threads"] = len(os.listdir("/proc/self/task"))
    Path(outdir, f"raw{dist.get_rank()}.json").write_text(json.dumps(res))
    dist.barrier()
    dist.destroy_process_group()


def idle_plain(seconds: float, outdir: str) -> None:
    import torch  # noqa: F401  (the same imports as a rank)

    time.sleep(1.0)
    res = _idle_window(seconds)
    res["native_threads"] = len(os.listdir("/proc/self/task"))
    Path(outdir, "plain.json").write_text(json.dumps(res))


TICK = 0.5  # the keeper's period under torchrun (``watchdog.JUDGE_PERIOD``), for the ticker control


def idle_ticker(seconds: float, outdir: str) -> None:
    """The control for tether's threads: a thread that only wakes every ``TICK`` s and reads one /proc file.

    What tether's keeper does when nothing fails (its judge reads a peer's ``/proc/<pid>/stat``),
    and nothing else: on this VM a wake-up after a sleep is charged far more CPU time than
    the work it does, and this row shows how much.
    """
    import select

    import torch  # noqa: F401  (the same imports as a rank)

    stop = threading.Event()

    def tick() -> None:
        while not stop.is_set():
            select.select([], [], [], TICK)
            with open(f"/proc/{os.getppid()}/stat", "rb") as fp:
                fp.read()

    thread = threading.Thread(target=tick, name="ticker", daemon=True)
    thread.start()
    time.sleep(1.0)
    res = _idle_window(seconds)
    stop.set()
    res["native_threads"] = len(os.listdir("/proc/self/task"))
    Path(outdir, "ticker.json").write_text(json.dumps(res))


def measure_idle(n: int, seconds: float) -> dict[str, object]:
    import _proc

    with tempfile.TemporaryDirectory(prefix="tether-idle-") as outdir:
        me = str(Path(__file__).resolve())
        bound = seconds + 120 + 5 * n
        jobs = {
            "tether": [sys.executable, me, "--_idle-launch", str(n), str(seconds), outdir],
            "tether_torchrun": torchrun_args(n, "--_idle-torchrun", str(seconds), outdir),
            "raw": torchrun_args(n, "--_idle-raw", str(seconds), outdir),
            "plain": [sys.executable, me, "--_idle-plain", str(seconds), outdir],
            "ticker": [sys.executable, me, "--_idle-ticker", str(seconds), outdir],
        }
        done: dict[str, _proc.Finished] = {}
        threads = [
            threading.Thread(target=lambda k=k, a=a: done.__setitem__(k, _proc.run(a, bound)), daemon=True)
            for k, a in jobs.items()
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for k, d in done.items():
            if d.returncode != 0 or d.leftovers:
                sys.stderr.write(f"idle job {k}: exit {d.returncode}, leftovers {d.leftovers}\n{d.stderr[-2000:]}\n")
        files = {p.stem: json.loads(p.read_text()) for p in Path(outdir).glob("*.json")}
    return {"ranks": n, "seconds": seconds, "files": files}


def _idle_group(name: str) -> str:
    return name.rstrip("0123456789")


def idle_table(idle: dict[str, object]) -> str:
    files: dict[str, dict[str, object]] = idle["files"]  # type: ignore[assignment]
    lines = [
        "| process | CPU s per minute | CPU % | store ops/s | threads (Python / native) "
        "| CPU ms in window, by thread | store ops in window, by thread | counter check |",
        "|---|---|---|---|---|---|---|---|",
    ]
    order = {"tether": 0, "tether_torchrun": 1, "raw": 2, "plain": 3, "ticker": 4}
    for name in sorted(files, key=lambda s: (order.get(_idle_group(s), 9), s)):
        f = files[name]
        wall, cpu = float(f["wall"]), float(f["cpu"])  # type: ignore[arg-type]
        ops = f.get("ops")
        rate = f"{sum(ops.values()) / wall:.2f}" if isinstance(ops, dict) else "n/a"
        detail = ", ".join(f"{k} {v}" for k, v in sorted(ops.items())) if isinstance(ops, dict) else ""
        per_thread = f.get("thread_ms", {})
        ranked = sorted(per_thread.items(), key=lambda kv: -kv[1])  # type: ignore[union-attr]
        by_thread = ", ".join(f"{k} {v:.1f}" for k, v in ranked if v >= 0.05)
        check = f.get("counter_check")
        verdict = (
            ("ok" if check.get("ok") else f"⚠ {check.get('counted')}/2 counted") + f" ({', '.join(check['types'])})"
            if isinstance(check, dict)
            else ""
        )
        lines.append(
            f"| {name} | {cpu / wall * 60:.4f} | {cpu / wall * 100:.3f} | {rate} "
            f"| {f['threads']} / {f['native_threads']} | {by_thread} | {detail} | {verdict} |"
        )

    def share(group: str) -> list[float]:
        return [float(f["cpu"]) / float(f["wall"]) for k, f in files.items() if _idle_group(k) == group]  # type: ignore[arg-type]

    def own_threads(group: str) -> list[float]:
        """CPU share of tether's own threads (tether-*) per rank of ``group``."""
        out = []
        for k, f in files.items():
            if _idle_group(k) == group:
                ms = sum(v for t, v in f.get("thread_ms", {}).items() if t.startswith("tether-"))  # type: ignore[union-attr]
                out.append(ms / 1e3 / float(f["wall"]))  # type: ignore[arg-type]
        return out

    raw = share("raw")
    for group, label in (("tether", "tether.spawn"), ("tether_torchrun", "torchrun")):
        mine = share(group)
        if mine and raw:
            extra = statistics.mean(mine) - statistics.mean(raw)
            threads = own_threads(group)
            lines += [
                "",
                f"tether's own idle cost under {label}: its threads alone (tether-listener, tether-keeper) "
                f"{min(threads) * 100:.3f}-{max(threads) * 100:.3f} % CPU per rank "
                f"({statistics.mean(threads) * 60:.4f} CPU s per minute, mean); mean {group} rank - mean raw gloo "
                f"rank: {extra * 100:+.3f} % CPU ({extra * 60:+.4f} CPU s per minute; the gloo loop's own "
                "variation is of the same size).",
            ]
    return "\n".join(lines)


# --- the driver ----------------------------------------------------------------------------------


def one_run(kind: str, n: int, heartbeat: float, lost_after: float, launcher: str = "spawn") -> dict[str, object]:
    import _proc

    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix=f"tether-fault-{launcher}-{kind}-{n}-") as outdir:
        timings = ["--heartbeat", str(heartbeat), "--lost-after", str(lost_after)]
        if launcher == "torchrun":
            args = torchrun_args(n, "--_torchrun-worker", kind, outdir, *timings)
        else:
            args = [sys.executable, str(Path(__file__).resolve()), "--_launch", kind, str(n), outdir, *timings]
        done = _proc.run(args, bound=90 + 6 * n)
        events: list[dict[str, object]] = []
        for p in Path(outdir).glob("r*.jsonl"):
            events += [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
        stamp = Path(outdir, "launcher.json")  # tether.spawn's launcher only
        spawn_returned = json.loads(stamp.read_text())["spawn_returned"] if stamp.exists() else None
    victim = 0 if kind == "raise_ofr" else n - 1
    caught = {e["rank"]: e for e in events if e["ev"] == "caught"}
    returned = sorted(e["rank"] for e in events if e["ev"] == "returned")
    other = sorted({f"{e['exc']}: {e['message']}" for e in events if e["ev"] == "other" and e["rank"] != victim})
    if kind == "stall":
        enters = [float(e["t"]) for e in events if e["ev"] == "enter"]  # type: ignore[arg-type]
        fault = min(enters) + STALL_TIMEOUT if enters else None
    else:
        faults = [float(e["t"]) for e in events if e["ev"] == "fault"]  # type: ignore[arg-type]
        fault = faults[0] if faults else None
    survivors = [r for r in range(n) if r != victim]
    lat = [float(caught[r]["t"]) - fault for r in survivors if r in caught] if fault else []  # type: ignore[arg-type]
    missing = [r for r in survivors if r not in caught]
    run = {
        "launcher": launcher,
        "kind": kind,
        "n": n,
        "load": load,
        "exit": done.returncode,
        "leftovers": done.leftovers,
        "missing": missing,
        "returned": returned,
        "exc": sorted({str(e["exc"]) for e in caught.values()}),
        "other": other,
        "via_sigterm": sum(1 for e in caught.values() if e.get("sigterm")),
        "notice": lat,
        "notice_max": max(lat) if lat and not missing else None,
        "posted": [
            float(caught[r]["posted"]) - fault
            for r in survivors  # type: ignore[arg-type]
            if r in caught and caught[r].get("posted") and fault
        ],
        "reporter": sorted({caught[r].get("reporter") for r in caught if caught[r].get("reporter") is not None}),  # type: ignore[type-var]
        "ranks_gone": spawn_returned - fault if fault and spawn_returned else None,
        "gone": done.exited - fault if fault else None,
    }
    if missing or returned or done.returncode in (0, None) or done.leftovers or fault is None:
        run["stderr_tail"] = done.stderr[-1500:]
    return run


def teardown_baseline(times: int = 3) -> float:
    """Seconds from the last line a process that imported torch prints to its exit being seen."""
    import _proc

    out = []
    for _ in range(times):
        done = _proc.run([sys.executable, "-c", "import time, torch; print(time.time(), flush=True)"], bound=60)
        out.append(done.exited - float(done.stdout.split()[0]))
    return statistics.median(out)


def _exit_floor_child(outdir: str) -> None:
    import torch  # noqa: F401  (a process the size of a rank)

    Path(outdir, "t").write_text(repr(time.time()))
    os._exit(3)


def exit_floor(times: int = 3) -> float:
    """ms from a torch process's ``os._exit`` to its parent seeing it gone (kernel teardown)."""
    import multiprocessing
    import multiprocessing.connection

    mp = multiprocessing.get_context("spawn")
    out = []
    for _ in range(times):
        with tempfile.TemporaryDirectory() as outdir:
            p = mp.Process(target=_exit_floor_child, args=(outdir,))
            p.start()
            multiprocessing.connection.wait([p.sentinel], timeout=120)
            seen = time.time()
            p.join(5)
            if p.exitcode is None:
                p.kill()
                p.join()
            stamp = Path(outdir, "t")
            if stamp.exists():
                out.append((seen - float(stamp.read_text())) * 1e3)
    return statistics.median(out) if out else float("nan")


def _med(xs: list[float | None]) -> float | None:
    ys = [x for x in xs if x is not None]
    return statistics.median(ys) if ys else None


def summarize(
    runs: list[dict[str, object]], kinds: list[str], ranks: list[int], launcher: str = "spawn"
) -> dict[tuple[str, int], dict[str, object]]:
    out = {}
    for k in kinds:
        for n in ranks:
            rs = [r for r in runs if r["kind"] == k and r["n"] == n and r.get("launcher", "spawn") == launcher]
            if not rs:
                continue
            everyone = [x for r in rs for x in r["notice"]]  # type: ignore[attr-defined]
            out[(k, n)] = {
                "repeats": len(rs),
                "notice_max": _med([r["notice_max"] for r in rs]),  # type: ignore[misc]
                "notice_all": _med(everyone),
                "notice_range": (min(everyone), max(everyone)) if everyone else None,
                "notice_max_range": (
                    min(r["notice_max"] for r in rs if r["notice_max"] is not None),
                    max(r["notice_max"] for r in rs if r["notice_max"] is not None),
                )
                if any(r["notice_max"] is not None for r in rs)
                else None,  # type: ignore[type-var]
                "survivors": len(everyone),
                "via_sigterm": sum(int(r.get("via_sigterm", 0)) for r in rs),  # type: ignore[call-overload]
                "posted": _med([x for r in rs for x in r["posted"]]),  # type: ignore[attr-defined]
                "reporter": sorted({x for r in rs for x in r["reporter"]}),  # type: ignore[attr-defined]
                "ranks_gone": _med([r["ranks_gone"] for r in rs]),  # type: ignore[misc]
                "gone": _med([r["gone"] for r in rs]),  # type: ignore[misc]
                "gone_range": (
                    min(r["gone"] for r in rs if r["gone"] is not None),
                    max(r["gone"] for r in rs if r["gone"] is not None),
                )
                if any(r["gone"] is not None for r in rs)
                else None,  # type: ignore[type-var]
                "bad": [r for r in rs if r["missing"] or r["returned"] or r["leftovers"] or r["exit"] in (0, None)],
                "exc": sorted({e for r in rs for e in r["exc"]}),  # type: ignore[attr-defined]
            }
    return out


def _outliers(runs: list[dict[str, object]]) -> list[str]:
    """One line per run whose slowest survivor was far slower than its cell's median."""
    out = []
    for r in runs:
        cell = [
            float(x["notice_max"])  # type: ignore[arg-type]
            for x in runs
            if x["launcher"] == r["launcher"] and x["kind"] == r["kind"] and x["n"] == r["n"] and x["notice_max"]
        ]
        worst = r["notice_max"]
        if worst is None or not cell:
            continue
        med = statistics.median(cell)
        if float(worst) > 2 * med and float(worst) - med > 0.1:  # type: ignore[arg-type]
            notice = ", ".join(_ms(x) for x in r["notice"])  # type: ignore[attr-defined]
            posted = ", ".join(_ms(x) for x in r["posted"])  # type: ignore[attr-defined]
            out.append(
                f"* {r['launcher']} {r['kind']} {r['n']} ranks, repeat {r.get('repeat')}: survivors raised after "
                f"[{notice}] ms (cell median {_ms(med)}), the record they raised was posted [{posted}] ms after "
                f"the fault by {r['reporter']} (-1: the launcher), exceptions {r['exc']}, load {float(r['load']):.1f}"  # type: ignore[arg-type]
            )
    return out


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x * 1e3:.1f}"


def _s(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def fault_tables(
    summary: dict[tuple[str, int], dict[str, object]], kinds: list[str], ranks: list[int], launcher: str = "spawn"
) -> str:
    sigterm = launcher == "torchrun"
    head = (
        "| kind | "
        + " | ".join(f"{n} ranks" for n in ranks)
        + " | survivors raised | record posted by | fault → record posted, ms |"
        + (" survivors told via SIGTERM |" if sigterm else "")
    )
    sep = "|---|" + "---|" * (len(ranks) + 3 + sigterm)
    a = [
        "(a) fault → every survivor raised, ms: median over repeats of the slowest survivor "
        "(median over all survivors of all repeats in brackets; [repeats]; "
        "range of the slowest survivor over repeats, min-max, below)",
        "",
        head,
        sep,
    ]
    b = [
        "(b) fault → every process gone, s: launcher exit ("
        + ("ranks reaped by `tether.spawn` in brackets" if not sigterm else "torchrun's exit; ranks reaped: not known")
        + "; min-max over repeats below)",
        "",
        "| kind | " + " | ".join(f"{n} ranks" for n in ranks) + " |",
        "|---|" + "---|" * len(ranks),
    ]
    for k in kinds:
        ca, cb, exc, who, posted, told = [], [], set(), set(), [], []
        for n in ranks:
            s = summary.get((k, n))
            if s is None:
                ca.append("")
                cb.append("")
                continue
            flag = " ⚠" if s["bad"] else ""
            spread = s["notice_max_range"]
            span = f"<br>{_ms(spread[0])}-{_ms(spread[1])}" if spread else ""  # type: ignore[index]
            ca.append(f"{_ms(s['notice_max'])} ({_ms(s['notice_all'])}) [{s['repeats']}]{flag}{span}")  # type: ignore[arg-type]
            gspread = s["gone_range"]
            gspan = f"<br>{_s(gspread[0])}-{_s(gspread[1])}" if gspread else ""  # type: ignore[index]
            cb.append(f"{_s(s['gone'])} ({_s(s['ranks_gone'])}){flag}{gspan}")  # type: ignore[arg-type]
            exc |= set(s["exc"])  # type: ignore[arg-type]
            who |= {"launcher" if r == -1 else f"rank {r}" if r == 0 else "a rank" for r in s["reporter"]}  # type: ignore[attr-defined]
            posted.append(_ms(s["posted"]))  # type: ignore[arg-type]
            told.append(f"{s['via_sigterm']}/{s['survivors']}")
        a.append(
            f"| {k} | "
            + " | ".join(ca)
            + f" | {', '.join(sorted(exc))} | {', '.join(sorted(who))} | {' / '.join(posted)} |"
            + (f" {' / '.join(told)} |" if sigterm else "")
        )
        b.append(f"| {k} | " + " | ".join(cb) + " |")
    return "\n".join([*a, "", *b])


def plot(
    summaries: dict[str, dict[tuple[str, int], dict[str, object]]],
    kinds: dict[str, list[str]],
    ranks: list[int],
    path: Path,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors: dict[str, str] = {}
    styles = {"spawn": ("o", "-"), "torchrun": ("s", ":")}
    for launcher, summary in summaries.items():
        marker, ls = styles[launcher]
        for k in kinds[launcher]:
            label = k if launcher == "spawn" else f"{k} (torchrun)"
            color = colors.get(k)
            ns = [n for n in ranks if (k, n) in summary and summary[(k, n)]["notice_max"] is not None]
            if ns:
                line = ax1.plot(
                    ns,
                    [summary[(k, n)]["notice_max"] * 1e3 for n in ns],
                    marker=marker,
                    ls=ls,
                    color=color,
                    label=label,
                )[0]  # type: ignore[operator]
                colors.setdefault(k, line.get_color())
                color = colors[k]
            ns = [n for n in ranks if (k, n) in summary and summary[(k, n)]["gone"] is not None]
            if ns:
                line = ax2.plot(
                    ns, [summary[(k, n)]["gone"] for n in ns], marker=marker, ls=ls, color=color, label=label
                )[0]
                colors.setdefault(k, line.get_color())
                gone = [(n, summary[(k, n)]["ranks_gone"]) for n in ns if summary[(k, n)]["ranks_gone"] is not None]
                ax2.plot([n for n, _ in gone], [g for _, g in gone], "x--", color=line.get_color(), lw=1)
    ax1.axhline(10, color="grey", ls="--", lw=1, label="target 10 ms")
    ax2.axhline(1, color="grey", ls="--", lw=1, label="target 1 s (2, 4 ranks)")
    ax2.plot([], [], "kx--", lw=1, label="dashed: ranks reaped (spawn returned)")
    for ax, title, unit in (
        (ax1, "(a) fault → every survivor raised", "ms"),
        (ax2, "(b) fault → every process gone", "s"),
    ):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(ranks, [str(n) for n in ranks])
        ax.set_xlabel("ranks (gloo, 2 cores; circles: tether.spawn, squares: torchrun)")
        ax.set_ylabel(f"{unit}, median over repeats")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


LAUNCHER_TITLE = {
    "spawn": "`tether.spawn` (its launcher hosts the store and judges its children from /proc)",
    "torchrun": "torchrun (`python -m torch.distributed.run`, defaults: monitor interval 0.1 s; "
    '`tether.initialize("gloo")` in each worker; the other ranks of the host judge from /proc)',
}


def main() -> None:
    import _proc

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=None, help="world sizes (default 2 4 8 16)")
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=KINDS, help="kinds under tether.spawn")
    parser.add_argument(
        "--launcher", nargs="+", choices=["spawn", "torchrun"], default=["spawn"], help="launchers (default spawn)"
    )
    parser.add_argument(
        "--torchrun-kinds", nargs="+", choices=KINDS, default=None, help="kinds under torchrun (default: --kinds)"
    )
    parser.add_argument(
        "--repeats", type=int, default=None, help="runs per cell (default 3; 1 at 16 ranks and with --quick)"
    )
    parser.add_argument("--quick", action="store_true", help="2 and 4 ranks, 1 repeat, 5 s idle window")
    parser.add_argument(
        "--heartbeat", type=float, default=0.5, help="heartbeat for sigstop (s; node heartbeats: unused on one node)"
    )
    parser.add_argument("--lost-after", type=float, default=2.0, help="lost_after for sigstop (s)")
    parser.add_argument("--idle-seconds", type=float, default=None, help="idle window (default 20 s; 5 with --quick)")
    parser.add_argument("--idle-ranks", type=int, default=2)
    parser.add_argument("--no-idle", action="store_true", help="skip the idle-cost measurement")
    parser.add_argument("--idle-only", action="store_true", help="only the idle-cost measurement")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where faults.md/.png/.json go")
    _proc.add_driver_options(parser, note="faults.md", each="section")
    parser.add_argument("--_launch", nargs=3, metavar=("KIND", "N", "OUTDIR"), help=argparse.SUPPRESS)
    parser.add_argument("--_torchrun-worker", nargs=2, metavar=("KIND", "OUTDIR"), help=argparse.SUPPRESS)
    parser.add_argument("--_idle-launch", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--_idle-torchrun", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--_idle-raw", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--_idle-plain", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--_idle-ticker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._launch:
        kind, n, outdir = args._launch
        launch(kind, int(n), outdir, args.heartbeat, args.lost_after)
        return
    if args._torchrun_worker:
        torchrun_worker(args._torchrun_worker[0], args._torchrun_worker[1], args.heartbeat, args.lost_after)
        return
    if args._idle_launch:
        idle_launch(int(args._idle_launch[0]), float(args._idle_launch[1]), args._idle_launch[2])
        return
    if args._idle_torchrun:
        idle_torchrun_worker(float(args._idle_torchrun[0]), args._idle_torchrun[1])
        return
    if args._idle_raw:
        idle_raw_worker(float(args._idle_raw[0]), args._idle_raw[1])
        return
    if args._idle_plain:
        idle_plain(float(args._idle_plain[0]), args._idle_plain[1])
        return
    if args._idle_ticker:
        idle_ticker(float(args._idle_ticker[0]), args._idle_ticker[1])
        return

    _proc.exit_on_sigterm(ignore=args.ignore_sigterm)
    library = [_proc.library_state()]
    ranks = args.ranks or ([2, 4] if args.quick else [2, 4, 8, 16])
    idle_seconds = args.idle_seconds or (5.0 if args.quick else 20.0)
    launchers = list(dict.fromkeys(args.launcher))
    kinds = {"spawn": args.kinds, "torchrun": args.torchrun_kinds or args.kinds}
    runs: list[dict[str, object]] = []
    quiet: dict[str, _proc.Quiet] = {}
    started = time.monotonic()
    if not args.idle_only:
        for launcher in launchers:
            for n in ranks:
                section = f"{launcher}, {n} ranks"
                quiet[section] = _proc.wait_for_load(args.wait_load, up_to=args.wait_max, what=section)
                print(f"[{section}: {quiet[section].describe()}]", flush=True)
                repeats = args.repeats or (1 if args.quick or n >= 16 else 3)
                for rep in range(repeats):
                    for kind in kinds[launcher]:  # kinds interleaved within a repeat
                        r = one_run(kind, n, args.heartbeat, args.lost_after, launcher)
                        r["repeat"] = rep
                        runs.append(r)
                        print(
                            f"[{time.monotonic() - started:6.0f} s] {launcher:8s} {kind:16s} {n:2d} ranks #{rep}: "
                            f"notice {_ms(r['notice_max'])} ms, gone {_s(r['gone'])} s, exit {r['exit']}, "
                            f"{r['exc']}{' via SIGTERM ' + str(r['via_sigterm']) if r['via_sigterm'] else ''}"
                            f"{' missing ' + str(r['missing']) if r['missing'] else ''}"
                            f"{' OTHER ' + str(r['other']) if r['other'] else ''}"
                            f"{' LEFTOVERS ' + str(r['leftovers']) if r['leftovers'] else ''} "
                            f"(load {r['load']:.1f})",
                            flush=True,
                        )
                        if "stderr_tail" in r:
                            print(
                                "    launcher stderr tail:\n    " + str(r["stderr_tail"]).replace("\n", "\n    "),
                                flush=True,
                            )
    if not args.no_idle:
        quiet["idle"] = _proc.wait_for_load(args.wait_load, up_to=args.wait_max, what="the idle cost")
        print(f"[idle: {quiet['idle'].describe()}]", flush=True)
    idle = None if args.no_idle else measure_idle(args.idle_ranks, idle_seconds)
    teardown = None if args.idle_only else teardown_baseline()
    all_kinds = {k for launcher in launchers for k in kinds[launcher]}
    floor = exit_floor() if {"exit", "sigkill"} & all_kinds and not args.idle_only else None

    library.append(_proc.library_state())
    one, five, fifteen = os.getloadavg()
    lines = [
        "# tether fault benchmarks",
        "",
        *([args.note, ""] if args.note else []),
        f"`python benchmarks/faults.py {_proc.command_line()}` — {time.strftime('%Y-%m-%d %H:%M')}, "
        f"{os.cpu_count()} cores, load average at end {one:.1f}/{five:.1f}/{fifteen:.1f} (1/5/15 min). gloo; "
        f"sigstop with lost_after={args.lost_after} s (heartbeat={args.heartbeat} s, used by node heartbeats "
        "only, and this is one node); other kinds with the default watchdog settings (grace 5 s).",
        "",
        _proc.describe_library(*library),
        "",
    ]
    if quiet:
        lines += [
            "Load (1-minute average) before each launcher and world size, after waiting for it to drop below "
            f"{args.wait_load:g}: " + "; ".join(f"{k}: {q.describe()}" for k, q in quiet.items()) + ".",
            "",
        ]
    summaries = {}
    if runs:
        for launcher in launchers:
            spans = []
            for n in ranks:
                loads = [float(r["load"]) for r in runs if r["launcher"] == launcher and r["n"] == n]  # type: ignore[arg-type]
                if loads:
                    spans.append(f"{n} ranks {min(loads):.1f}-{max(loads):.1f} (median {statistics.median(loads):.1f})")
            summary = summarize(runs, kinds[launcher], ranks, launcher)
            summaries[launcher] = summary
            lines += [
                f"## {LAUNCHER_TITLE[launcher]}",
                "",
                f"Load (1-minute average) at the start of each run: {'; '.join(spans)}.",
                "",
                fault_tables(summary, kinds[launcher], ranks, launcher),
                "",
            ]
        bad = [
            r for r in runs if r["missing"] or r["returned"] or r["leftovers"] or r["other"] or r["exit"] in (0, None)
        ]
        problems = "; ".join(
            f"{r['launcher']} {r['kind']}@{r['n']}: missing {r['missing']}, exit {r['exit']}, "
            f"leftovers {r['leftovers']}, other {r['other']}"
            for r in bad
        )
        lines.append(
            f"Runs with a survivor that never raised, a leftover process or a wrong exit: {len(bad)}"
            + (f" ⚠ {problems}" if bad else "")
        )
        lines.append("")
        outliers = _outliers(runs)
        lines.append(
            "Outliers (a run whose slowest survivor took more than twice its cell's median and 100 ms more): "
            + (str(len(outliers)) if not outliers else f"{len(outliers)} ⚠")
        )
        lines += ["", *outliers, ""] if outliers else [""]
        if floor is not None:
            lines += [
                f"For scale: a process that imported torch and calls `os._exit` is seen gone by its parent "
                f"{floor:.0f} ms later (median of 3; the kernel unmaps its memory before it closes its fds, "
                "so neither the launcher's sentinel nor the peers' gloo sockets can fire sooner): the floor "
                "for `exit` and `sigkill`.",
                "",
            ]
        if teardown is not None:
            lines += [
                f'For scale: `python -c "import time, torch; print(time.time())"` takes {teardown:.2f} s from its '
                "print to its exit being seen (CPython tearing down torch's modules; median of 3, same load): "
                "the launcher pays this after `tether.spawn` returned.",
                "",
            ]
        args.out.mkdir(parents=True, exist_ok=True)
        if importlib.util.find_spec("matplotlib") is not None:
            plot(summaries, kinds, ranks, args.out / "faults.png")
        else:  # the figure is optional; the tables are the result
            lines += ["No `faults.png`: matplotlib is not installed.", ""]
    if idle is not None:
        lines += [
            f"## Idle cost over {idle_seconds:.0f} s, {args.idle_ranks} ranks",
            "",
            "`getrusage(RUSAGE_SELF)`, all threads; store ops counted by wrapping `TCPStore` methods (counter "
            "check: two probe operations on the channel's connections, one cloned before the wrap, counted). "
            "tether*: an initialized tether rank under `tether.spawn`; tether_torchrun*: one under torchrun "
            "(its keeper judges the host's other ranks); raw*: a torchrun gloo rank without tether; plain: a "
            "process that imported torch; ticker: one that imported torch and whose one thread wakes every "
            f"{TICK:g} s (the keeper's period under torchrun) to read one /proc file, the work of tether's keeper "
            "when nothing fails, and nothing else (the control for what a wake-up is charged on this machine). "
            "Targets: ≤0.1 % CPU, ≤1 store op/s per process.",
            "",
            idle_table(idle),
            "",
        ]
    text = "\n".join(lines)
    print()
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "faults.md").write_text(text)
    (args.out / "faults.json").write_text(
        json.dumps(
            {
                "argv": sys.argv[1:],
                "library": library,
                "runs": runs,
                "idle": idle,
                "load": {k: vars(q) for k, q in quiet.items()},
            },
            indent=1,
            default=str,
        )
    )


if __name__ == "__main__":
    main()
