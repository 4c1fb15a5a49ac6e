"""Cost of a sync call: tether vs raw ``torch.distributed`` vs ignite, in the same processes.

Usage::

    python benchmarks/sync.py                  # 2 and 4 ranks, ~9 minutes (190 s + 360 s here)
    python benchmarks/sync.py --ranks 2 --quick

One torchrun job per world size. Each rank calls ``tether.initialize("gloo")``; raw
``torch.distributed`` calls then run on the very same default process group, and
ignite's ``idist`` adopts it too (``ignite.distributed.sync()``), so every contender runs
in the same processes over the same sockets. Contenders are interleaved: each *round*
runs one timed batch of every contender, row by row (the order of the rows rotated from
round to round), and a row's batches are cut into ``--chunks`` chunks (default 10) that
alternate, contender by contender, the first contender rotating from chunk to chunk;
every chunk starts aligned on an untimed ``dist.barrier()``, and a batch's cost per call
is the slowest rank's summed chunk time divided by the batch's call count. The
contenders a ratio compares thus run within the same second, a few tens of ms apart.
Up to ``results/sync-863fcc2.md`` a round ran whole batches in one rotated order over
every row, so the two sides of a ratio could run seconds apart, and the machine's load
drifted in between (``--chunks 1`` keeps a row's batches whole, but adjacent). ``--pin`` pins each rank's
threads to one core (``_proc.pin_rank``), as ``ddp.py`` does by default; here it made the
noise worse (``results/sync-pinned.md``: 4 ranks on 2 cores, two ranks to a core, per-call
IQRs of 50-160 %), so ranks are left to the scheduler by default. A batch lasts about
``--batch-seconds`` (0.25 s; its call count is calibrated once per contender after the
warm-up, the largest over ranks): batches of 50 calls of a few hundred µs had an IQR of
30-50 % here, which no 5 % target can be read through. The table gives the median over
rounds and the spread (interquartile range, % of the median); a ratio is the median of
the per-round ratios, with their quartiles, and a target is *met* when the upper quartile
is within it, *not met* when the IQR crosses it, *MISSED* when the whole IQR is above it. Before each world
size the driver waits until the 1-minute load average is below ``--wait-load`` (default
1.5; polled every 20 s, up to ``--wait-max`` s, then it measures anyway and says so); the
result gives that load and the load at the end.

What is compared (µs per call):

* ``one_rank_first`` with an empty body: tether (a store gate: the working rank writes
  ``go``, the others read it) vs ignite (a collective ``barrier`` before the block on the
  waiters, after it on the working rank).
* ``barrier``: tether (the store gate) vs ``dist.barrier()`` (a gloo collective) vs
  ignite's (``dist.barrier()`` behind its dispatch), and the bare store gate that
  tether's barrier is built on (``add`` + ``get``/``set`` on the same store, no failure
  handling): the store-vs-collective comparison behind tether's choice.
* ``all_reduce`` of one int: ``tether.all_reduce(1)`` vs raw ``dist.all_reduce`` of a
  ``torch.tensor(1)`` plus ``.item()`` (the same work tether does for a number) vs ignite,
  and the control: the same raw call as a contender of its own ("raw dist, again"), whose
  ratio to the baseline shows the noise floor: a target tighter than its IQR cannot be
  read on this machine, whatever tether does.
* ``all_reduce`` of a float32 tensor of 1 KiB and of 64 MiB: tether vs raw, in place.
* ``all_gather`` and ``broadcast`` of 1 KiB and 64 MiB, tether with and without the
  mismatch check (``check_collectives``: one all_gather of a 4,192-byte frame per call,
  which carries the data of a call of up to 4 KiB a rank: at 1 KiB that is the whole call).
* ``all_gather`` of this process's random states (what a periodic checkpoint gathers
  from every rank, about 12 KiB pickled) and ``broadcast`` of a 100-byte str: tether (one
  collective when the bytes fit its frame) vs torch's ``all_gather_object`` /
  ``broadcast_object_list``, and, for the states, the two all_gathers (sizes, then the
  padded bytes) tether made before its frames. No target: reported.
* ``send`` + ``recv`` of one float32, in pairs of ranks (even sends first): torch's
  functions as tether wraps them with ``sync_timeout`` set (marked, and waiting on the
  async work with the job's bound) vs torch's own.

Beside the wall time, each batch records the CPU time of the calling thread
(``time.thread_time``) and of the whole process (``time.process_time``), mean over ranks:
the CPU a contender adds to its baseline's per call is an absolute cost that the load of
2 busy cores moves much less than a wall-clock ratio (the last section of the result).

"raw dist" calls torch's own functions (``torch.distributed.distributed_c10d``): in a
process tether watches, ``torch.distributed.all_reduce`` and friends are tether's
marking wrappers (``tether/_core/rawcalls.py``), and ignite's calls go through them, so
the "ignite" column includes that wrapper's cost.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

TARGETS = [  # (row, contender, baseline, max ratio: the upper quartile of the per-round ratios)
    ("all_reduce 1 KiB f32", "tether", "raw dist", 1.05),
    ("all_reduce 64 MiB f32", "tether", "raw dist", 1.01),
    ("all_reduce 1 int", "tether", "raw dist", 1.05),
    ("all_reduce 1 int", "raw dist, again", "raw dist", 1.05),  # the noise floor: what no contender beats
    ("barrier", "tether (store)", "raw dist (collective)", 1.0),
    ("one_rank_first", "tether", "ignite", 1.0),
    ("all_gather 1 KiB f32", "tether + check", "tether", 1.05),
    ("broadcast 1 KiB f32", "tether + check", "tether", 1.05),
    ("all_gather 64 MiB f32", "tether + check", "tether", 1.01),
    ("broadcast 64 MiB f32", "tether + check", "tether", 1.01),
    ("send + recv 4 B", "tether (bounded)", "raw dist", 1.05),  # no issue's target: the all_reduce one
]
# rows without a target, and the baseline each of their contenders is compared with
REPORTED = [
    ("all_gather random states", "size + data (two all_gathers)", "tether"),
    ("all_gather random states", "tether", "raw dist"),
    ("broadcast str 100 B", "tether", "raw dist"),
]


# --- the worker (one rank under torchrun) ----------------------------------------------------


def _contenders(world: int, quick: bool) -> list[tuple[str, str, Callable[[], object], int]]:
    """(row, column, one call, calls per batch)."""
    import torch
    import torch.distributed as dist

    import tether

    try:
        import ignite.distributed as igd

        igd.sync()
        assert igd.get_world_size() == world
    except ImportError:
        igd = None

    from tether._core.runtime import current

    ctx = current()
    store = ctx.store
    assert store is not None
    gate_seq = [0]

    def store_gate() -> None:
        # What tether.barrier does, without its checks: one add; the last arrival writes
        # "go", every other rank reads it (a get that blocks until it is set).
        gate_seq[0] += 1
        key = f"bench/gate/{gate_seq[0]}"
        if int(store.add(key + "/n", 1)) == world:
            store.set(key + "/go", "ok")
        else:
            store.get(key + "/go")

    def ofr_tether() -> None:
        with tether.one_rank_first():
            pass

    def ofr_ignite() -> None:
        with igd.one_rank_first():
            pass

    # torch's own functions: ``dist.all_reduce`` is tether's marking wrapper in a process
    # tether watches (``_core/rawcalls.py``); the raw baseline must not pay for it
    c10d = dist.distributed_c10d

    def raw_int() -> object:
        t = torch.tensor(1)
        c10d.all_reduce(t)
        return t.item()

    # the mismatch check (``check_collectives``) on and off, in the same processes
    import dataclasses

    unchecked = ctx.settings
    checked = dataclasses.replace(unchecked, check_collectives=True)

    def with_settings(settings: object, call: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            ctx.settings = settings  # type: ignore[assignment]
            try:
                return call()
            finally:
                ctx.settings = unchecked

        return run

    from tether._core import rawcalls

    bounded = dataclasses.replace(unchecked, timeout=60.0)  # sync_timeout: the wrappers' bounded path
    peer = dist.get_rank() ^ 1
    one = torch.ones(1)

    def ping(send: Callable[..., object], recv: Callable[..., object]) -> Callable[[], object]:
        def run() -> object:
            if peer > dist.get_rank():
                send(one, peer)
                return recv(one, peer)
            recv(one, peer)
            return send(one, peer)

        return run

    small = torch.ones(256, dtype=torch.float32)  # 1 KiB
    big = torch.ones(16 * 1024 * 1024, dtype=torch.float32)  # 64 MiB
    k = 20 if quick else 50
    kb = 1 if quick else 2
    out: list[tuple[str, str, Callable[[], object], int]] = [
        ("one_rank_first", "tether", ofr_tether, k),
        ("barrier", "tether (store)", lambda: tether.barrier(), k),
        ("barrier", "raw dist (collective)", lambda: c10d.barrier(), k),
        ("barrier", "bare store gate", store_gate, k),
        ("all_reduce 1 int", "tether", lambda: tether.all_reduce(1), k),
        ("all_reduce 1 int", "raw dist", raw_int, k),
        ("all_reduce 1 int", "raw dist, again", raw_int, k),  # the control: the baseline against itself
        ("all_reduce 1 KiB f32", "tether", lambda: tether.all_reduce(small), k),
        ("all_reduce 1 KiB f32", "raw dist", lambda: c10d.all_reduce(small), k),
        ("all_reduce 64 MiB f32", "tether", lambda: tether.all_reduce(big), kb),
        ("all_reduce 64 MiB f32", "raw dist", lambda: c10d.all_reduce(big), kb),
    ]
    if world % 2 == 0:
        originals = rawcalls._originals  # torch's send and recv, before tether wrapped them
        out.append(("send + recv 4 B", "tether (bounded)", with_settings(bounded, ping(dist.send, dist.recv)), k))
        out.append(("send + recv 4 B", "raw dist", ping(originals["send"], originals["recv"]), k))
    for size, tensor, calls in (("1 KiB", small, k), ("64 MiB", big, kb)):
        for name, op in (("all_gather", tether.all_gather), ("broadcast", tether.broadcast)):
            row = f"{name} {size} f32"
            out.append((row, "tether", with_settings(unchecked, lambda op=op, t=tensor: op(t)), calls))
            out.append((row, "tether + check", with_settings(checked, lambda op=op, t=tensor: op(t)), calls))
    # a str or an object travels in one frame when it fits (``collectives._frame``); the
    # random states a periodic checkpoint gathers from every rank are such an object
    from tether import _randomness

    states = _randomness.state()
    text = "x" * 100

    def two_gathers() -> object:  # how tether gathered an object before its frames: size, then data
        data = pickle.dumps(states)
        sizes = tether.all_gather(len(data))
        padded = torch.zeros(max(sizes), dtype=torch.uint8)
        padded[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        return tether.all_gather(padded.unsqueeze(0))

    def object_list(obj: object) -> object:
        got = [None] * world
        c10d.all_gather_object(got, obj)
        return got

    def broadcast_list() -> object:
        box = [text if dist.get_rank() == 0 else None]
        c10d.broadcast_object_list(box, src=0)
        return box[0]

    row = "all_gather random states (~12 KiB)"  # the pickle's size varies a little from process to process
    out += [
        (row, "tether", lambda: tether.all_gather(states), k),
        (row, "raw dist", lambda: object_list(states), k),
        (row, "size + data (two all_gathers)", two_gathers, k),
        ("broadcast str 100 B", "tether", lambda: tether.broadcast(text if dist.get_rank() == 0 else ""), k),
        ("broadcast str 100 B", "raw dist", broadcast_list, k),
    ]
    if igd is not None:
        out += [
            ("one_rank_first", "ignite", ofr_ignite, k),
            ("barrier", "ignite", lambda: igd.barrier(), k),
            ("all_reduce 1 int", "ignite", lambda: igd.all_reduce(1), k),
        ]
    return out


def _calibrate(contenders: list[tuple[str, str, Callable[[], object], int]], batch_s: float) -> list[int]:
    """Calls per batch, so that each batch of a row's fastest contender lasts about ``batch_s``.

    Every contender of a row makes the same number of calls, on every rank.

    Short batches are dominated by the machine's slow noise (a batch of 50 calls of
    300 us: IQR 30-50 % here); batches of a quarter second narrow it several times.
    """
    import torch
    import torch.distributed as dist

    fastest: dict[str, float] = {}  # per row: the contenders of a row make the same number of calls
    for row, _, call, n in contenders:
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(n):
            call()
        per_call = (time.perf_counter() - t0) / n
        fastest[row] = min(per_call, fastest.get(row, per_call))
    counts = [max(n, min(20_000, round(batch_s / fastest[row]))) for row, _, _, n in contenders]
    agreed = torch.tensor(counts, dtype=torch.int64)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)  # every rank must make the same number of calls
    return [int(c) for c in agreed.tolist()]


def worker(rounds: int, quick: bool, batch_s: float, chunks: int, pin: bool) -> None:
    import torch
    import torch.distributed as dist

    import _proc
    import tether

    torch.set_num_threads(1)
    if pin:
        _proc.pin_rank(int(os.environ["LOCAL_RANK"]))
    tether.initialize("gloo")
    # torch's own Work.wait, which the raw calls below make inside (c10d's synchronous
    # collectives wait on their work): tether wraps it to name the user's waits on async
    # works (``rawcalls._name_work_waits``), and the raw baseline must not pay for that.
    # tether's own waits call torch's anyway (``waits._wait_on``); the ignite column loses
    # the 0.7 us that wrapper costs inside tether's wrapped dist.* calls
    from torch._C._distributed_c10d import Work

    from tether._core import rawcalls

    Work.wait = rawcalls._originals["Work.wait"]  # type: ignore[method-assign]
    rank, world = dist.get_rank(), dist.get_world_size()
    contenders = _contenders(world, quick)
    for _, _, call, _ in contenders:  # warm up every path (and gloo's connections)
        for _ in range(3):
            call()
    counts = _calibrate(contenders, batch_s)
    rows = list(dict.fromkeys(row for row, _, _, _ in contenders))
    members = {row: [i for i, c in enumerate(contenders) if c[0] == row] for row in rows}
    samples: list[list[float]] = [[] for _ in contenders]
    # CPU per call, beside the wall time: the calling thread's, and the whole process's
    # (gloo's threads, tether's), which a wall-clock ratio on 2 busy cores cannot isolate
    cpu: dict[str, list[list[float]]] = {"thread": [[] for _ in contenders], "process": [[] for _ in contenders]}
    for r in range(rounds):
        shift = r % len(rows)
        order = rows[shift:] + rows[:shift]
        if r % 2:
            order.reverse()
        for row in order:
            # the contenders of a row, chunk by chunk, each chunk's first contender rotating
            mine = members[row]
            parts = max(1, min(chunks, *(counts[i] for i in mine)))
            spent = dict.fromkeys(mine, 0.0)
            used = {i: [0.0, 0.0] for i in mine}
            for c in range(parts):
                for i in mine[c % len(mine) :] + mine[: c % len(mine)]:
                    call, n = contenders[i][2], counts[i] // parts
                    dist.barrier()
                    c0, p0 = time.thread_time(), time.process_time()
                    t0 = time.perf_counter()
                    for _ in range(n):
                        call()
                    spent[i] += time.perf_counter() - t0
                    used[i][0] += time.thread_time() - c0
                    used[i][1] += time.process_time() - p0
            for i in mine:
                calls = counts[i] // parts * parts
                samples[i].append(spent[i] / calls * 1e6)
                cpu["thread"][i].append(used[i][0] / calls * 1e6)
                cpu["process"][i].append(used[i][1] / calls * 1e6)
    # slowest rank per batch: gather outside any timing
    mine = torch.tensor(samples, dtype=torch.float64)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    spent_cpu = {k: torch.tensor(v, dtype=torch.float64) for k, v in cpu.items()}
    for v in spent_cpu.values():  # the mean over ranks: what a rank spends
        dist.all_reduce(v)
        v /= world
    if rank == 0:
        result = {
            "world": world,
            "rounds": rounds,
            "rows": [
                {
                    "op": op,
                    "who": who,
                    "calls": counts[i],
                    "us": mine[i].tolist(),
                    "cpu_us": spent_cpu["thread"][i].tolist(),
                    "process_cpu_us": spent_cpu["process"][i].tolist(),
                }
                for i, (op, who, _, _) in enumerate(contenders)
            ],
        }
        print("RESULT " + json.dumps(result), flush=True)
    tether.finalize()


# --- the driver ----------------------------------------------------------------------------


def _stats(xs: list[float]) -> tuple[float, float]:
    med = statistics.median(xs)
    if len(xs) >= 4:
        q = statistics.quantiles(xs, n=4)
        return med, (q[2] - q[0]) / med * 100
    return med, (max(xs) - min(xs)) / med * 100


def run_world(
    n: int, rounds: int, quick: bool, batch_s: float, chunks: int, bound: float, pin: bool
) -> dict[str, object]:
    import _proc

    args = _proc.torchrun(
        n,
        __file__,
        "--worker",
        "--rounds",
        str(rounds),
        "--batch-seconds",
        str(batch_s),
        "--chunks",
        str(chunks),
        *(["--quick"] if quick else []),
        *(["--pin"] if pin else []),
        launcher=("--monitor_interval", "0.1"),
    )
    done = _proc.run(args, bound, env={"OMP_NUM_THREADS": "1"})
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode != 0 or not lines or done.leftovers:
        sys.stderr.write(done.stdout[-3000:] + done.stderr[-5000:])
        raise SystemExit(f"sync benchmark at {n} ranks failed: exit {done.returncode}, leftovers {done.leftovers}")
    return json.loads(lines[-1][len("RESULT ") :])


def _baseline(op: str, who: str) -> str | None:
    """The contender ``who`` is compared with in row ``op`` (None: it is the baseline)."""
    for row, contender, base, _ in TARGETS:
        if row == op and contender == who:
            return base
    for prefix, contender, base in REPORTED:
        if op.startswith(prefix) and contender == who:
            return base
    base = {"one_rank_first": "ignite", "barrier": "raw dist (collective)"}.get(op, "raw dist")
    if op.startswith(("all_gather", "broadcast")) and op.endswith("f32"):
        base = "tether"
    return None if who == base else base


def _ratio(res: dict[str, object], op: str, who: str, base: str) -> tuple[float, float, float] | None:
    import _proc

    rows = {(row["op"], row["who"]): row["us"] for row in res["rows"]}  # type: ignore[attr-defined]
    if (op, who) not in rows or (op, base) not in rows:
        return None
    return _proc.paired_ratios(rows[(op, who)], rows[(op, base)])


def table(results: list[dict[str, object]]) -> str:
    """One markdown table: a row per (op, contender), a column pair per world size."""
    worlds = [r["world"] for r in results]
    keyed: dict[tuple[str, str], dict[int, tuple[float, float]]] = {}
    for res in results:
        for row in res["rows"]:  # type: ignore[attr-defined]
            keyed.setdefault((row["op"], row["who"]), {})[res["world"]] = _stats(row["us"])
    head = "| op | contender | " + " | ".join(f"{w} ranks µs (IQR %) | ratio (IQR)" for w in worlds) + " |"
    lines = [head, "|" + "---|" * (2 + 2 * len(worlds))]
    ops = list(dict.fromkeys(op for op, _ in keyed))
    for (op, who), per in sorted(keyed.items(), key=lambda kv: ops.index(kv[0][0])):
        base = _baseline(op, who)
        cells = []
        for res in results:
            med, iqr = per[res["world"]]  # type: ignore[index]
            quart = _ratio(res, op, who, base) if base else None
            ratio = f"{quart[1]:.3f}x ({quart[0]:.3f} to {quart[2]:.3f})" if quart else ("1" if base is None else "")
            cells.append(f"{med:,.0f} ({iqr:.0f}%) | {ratio}")
        lines.append(f"| {op} | {who} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cpu_costs(results: list[dict[str, object]]) -> list[str]:
    """Per targeted contender, the CPU it adds to its baseline's per call: median of the
    per-round differences, with their quartiles (mean over ranks), the calling thread's and
    the whole process's."""
    import _proc

    out = []
    for res in results:
        rows = {(row["op"], row["who"]): row for row in res["rows"]}  # type: ignore[attr-defined]
        for op, who, base, _ in TARGETS:
            mine, theirs = rows.get((op, who)), rows.get((op, base))
            if mine is None or theirs is None or "cpu_us" not in mine:
                continue
            cells = []
            for key, what in (("cpu_us", "calling thread"), ("process_cpu_us", "process")):
                q1, med, q3 = _proc.quartiles([a - b for a, b in zip(mine[key], theirs[key], strict=True)])
                own = statistics.median(theirs[key])
                cells.append(f"{med:+.1f} µs of the {what}'s (IQR {q1:+.1f} to {q3:+.1f}; {base}: {own:.1f})")
            out.append(f"{res['world']} ranks: {op}: {who} - {base}, CPU per call: " + ", ".join(cells))
    return out


def verdicts(results: list[dict[str, object]]) -> list[str]:
    import _proc

    out = []
    for res in results:
        for op, who, base, limit in TARGETS:
            quart = _ratio(res, op, who, base)
            if quart is None:
                continue
            q1, ratio, q3 = quart
            out.append(
                f"{res['world']} ranks: {op}: {who} / {base} = {ratio:.3f}x (IQR {q1:.3f}x to {q3:.3f}x; "
                f"target <= {limit}x) {_proc.verdict(q1, q3, limit)}"
            )
        ops = list(dict.fromkeys(row["op"] for row in res["rows"]))  # type: ignore[attr-defined]
        for prefix, who, base in REPORTED:
            for op in (o for o in ops if o.startswith(prefix)):
                quart = _ratio(res, op, who, base)
                if quart is not None:
                    out.append(
                        f"{res['world']} ranks: {op}: {who} / {base} = {quart[1]:.3f}x "
                        f"(IQR {quart[0]:.3f}x to {quart[2]:.3f}x; no target)"
                    )
    return out


def main() -> None:
    import _proc

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4], help="world sizes (default: 2 4)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 15, 5 with --quick)")
    parser.add_argument("--quick", action="store_true", help="fewer rounds and calls per batch")
    parser.add_argument("--pin", action="store_true", help="pin each rank's threads to one core (default: unpinned)")
    parser.add_argument(
        "--batch-seconds", type=float, default=None, help="length of a timed batch (default 0.25 s, 0.05 with --quick)"
    )
    parser.add_argument(
        "--chunks",
        type=int,
        default=10,
        help="chunks a batch is cut into, the contenders of a row alternating chunk by chunk (default 10; "
        "1: one whole batch each)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the raw samples here")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "sync.md", help="markdown copy of the table")
    _proc.add_driver_options(parser)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    rounds = args.rounds or (5 if args.quick else 15)
    if args.batch_seconds is None:
        args.batch_seconds = 0.05 if args.quick else 0.25
    if args.worker:
        worker(rounds, args.quick, args.batch_seconds, args.chunks, args.pin)
        return

    _proc.exit_on_sigterm(ignore=args.ignore_sigterm)
    try:
        import ignite  # noqa: F401
    except ImportError:
        print("pytorch-ignite is not importable: ignite columns skipped (pip install -e '.[bench]')")
    library = [_proc.library_state()]
    results = []
    quiet = {}
    for n in args.ranks:
        quiet[n] = _proc.wait_for_load(args.wait_load, up_to=args.wait_max, what=f"{n} ranks")
        print(f"[{n} ranks: {quiet[n].describe()}]", flush=True)
        t0 = time.monotonic()
        bound = 120 + 40 * n * rounds / 5
        results.append(run_world(n, rounds, args.quick, args.batch_seconds, args.chunks, bound, args.pin))
        results[-1]["load"] = vars(quiet[n])
        print(f"[{n} ranks: {time.monotonic() - t0:.0f} s]", flush=True)
    if args.json:  # the raw samples first: a table that cannot be drawn loses no run
        args.json.write_text(json.dumps(results, indent=1))
    library.append(_proc.library_state())
    one, five, fifteen = os.getloadavg()
    text = "\n".join(
        [
            "# tether sync benchmarks",
            "",
            *([args.note, ""] if args.note else []),
            f"`python benchmarks/sync.py {_proc.command_line()}` — {time.strftime('%Y-%m-%d %H:%M')}, "
            f"{os.cpu_count()} cores, load average at end {one:.1f}/{five:.1f}/{fifteen:.1f} (1/5/15 min); "
            "torchrun, gloo"
            + (
                ", each rank's threads pinned to one core (round-robin; `_proc.pin_rank`)."
                if args.pin
                else ", unpinned."
            ),
            "",
            _proc.describe_library(*library),
            "",
            "Load (1-minute average) before each world size, after waiting for it to drop below "
            f"{args.wait_load:g}: " + "; ".join(f"{n} ranks: {q.describe()}" for n, q in quiet.items()) + ".",
            "",
            f"µs per call, median of {rounds} rounds of batches of about {args.batch_seconds:g} s, each cut into "
            f"{args.chunks} chunks that alternate with the chunks of the row's other contenders "
            "(slowest rank per batch; the calls per batch are in the json); IQR = interquartile range in % of "
            "the median; ratio = median of the per-round ratios (the batches of a row ran interleaved), "
            "with their quartiles, vs raw dist (one_rank_first: vs ignite; barrier: vs dist.barrier; "
            "with the check: vs tether without it). A target is met when the upper quartile is within it.",
            "",
            table(results),
            "",
            *verdicts(results),
            "",
            "CPU per call that a contender adds to its baseline's (``time.thread_time`` of the calling thread "
            "and ``time.process_time`` around the same batches; mean over ranks, median of the per-round "
            "differences): an absolute cost, which the machine's load moves less than a wall-clock ratio.",
            "",
            *cpu_costs(results),
        ]
    )
    print()
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
