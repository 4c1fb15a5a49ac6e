"""Bounded store: the job's store holds as many keys after 100,000 syncs as after 100.

Usage::

    python benchmarks/store_keys.py                     # 100,000 mixed calls, 2 ranks, ~1-3 minutes
    python benchmarks/store_keys.py --calls 2000        # a quick check
    python benchmarks/store_keys.py --calls 20000 --only oro barrier   # bisect: only these ops

One job of 2 ranks under ``tether.spawn`` (gloo), whose launcher hosts the c10d TCPStore;
the launcher is a fresh interpreter started as its own session and bounded (see
``_proc``). Both ranks run the same deterministic rotation of calls (``OPS``):

==============  ========================================================================
barrier         ``tether.barrier()``
ofr             ``with tether.one_rank_first(): pass``
oro             a ``@tether.one_rank_only(with_barrier=True)`` function
ar_int          ``tether.all_reduce(1)``
ar_tensor       ``tether.all_reduce(torch.ones(8))``
ag_float        ``tether.all_gather(0.1)``
ag_str          ``tether.all_gather("abc")``
bcast           ``tether.broadcast(tensor, src=0)``
barrier_list    ``tether.barrier(group=[0, 1])`` (a list group: its own gate sequence)
slow            every ``--slow-every`` calls: rank 1 sleeps 0.3 s, then ``all_reduce(1)``;
                rank 0 waits past ``check_after`` (0.2 s), so the mismatch check adds to
                the sync's counter on the store: that key must go once the call is done
stall           every ``--stall-every`` calls: rank 1 sleeps 0.4 s, then ``barrier()``;
                rank 0 waits past ``warn_after`` (0.2 s, given to ``spawn``), so its keeper
                logs a stall report after a whereabouts query: the answers must go
==============  ========================================================================

(``warn_after`` = 0.2 s applies to every wait, so ``slow`` also logs a stall report.)

At 100, 1,000, 10,000 and 100,000 calls (those up to ``--calls``, and ``--calls`` itself)
both ranks pass a ``tether.barrier()`` and then a raw ``dist.barrier()`` (a gloo
collective, no store key), so every store write of the calls before it is done; rank 0
reads ``store.num_keys()`` on its store client (the server counts every key of the job:
tether's, and the process groups' own), then a second ``dist.barrier()`` holds rank 1
until it has. Note that the TCPStore's ``num_keys`` does not count queues (tether's
inboxes): their lengths are read with ``queue_len`` at the end instead.

Checks beside the count: rank 1 looks, just before its late ``slow`` call, for the
mismatch-check key rank 0 should have added (so the path was exercised), and rank 0
counts the stall reports tether logged. If the count grew, TCPStore cannot list its keys:
rank 0 then probes the key families of the protocol it knows of (``channel.py``,
``waits.py``: ``P/sync/<group>/<seq>/{n,go,expired}`` for every seq it used, attributed to
the operation that used that seq; ``P/where/<qid>/<rank>``), which may not be all of them.

Writes ``benchmarks/results/store_keys.md`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE))

OPS = ["barrier", "ofr", "oro", "ar_int", "ar_tensor", "ag_float", "ag_str", "bcast", "barrier_list"]
SPECIAL = ["slow", "stall"]
SAMPLES = [100, 1_000, 10_000, 100_000]
SLOW_SLEEP = 0.3  # > check_after (0.2 s): rank 0's collective writes the mismatch-check key
STALL_SLEEP = 0.4  # > warn_after (0.2 s): rank 0's barrier logs a stall report


def schedule(i: int, ops: list[str], slow_every: int, stall_every: int) -> str:
    """The op of call ``i`` (1-based); the same on every rank."""
    if "stall" in ops and stall_every and i % stall_every == stall_every // 2:
        return "stall"
    if "slow" in ops and slow_every and i % slow_every == slow_every // 4:
        return "slow"
    plain = [op for op in ops if op not in SPECIAL]
    return plain[i % len(plain)] if plain else "barrier"


# --- inside a rank -----------------------------------------------------------------------------


class _Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.stalls = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "has waited" in record.getMessage():
            self.stalls += 1


def worker(local_rank: int, cfg: dict[str, object]) -> None:
    import torch
    import torch.distributed as dist

    import tether
    from tether._core.runtime import current

    torch.set_num_threads(1)
    rank = tether.get_rank()
    ctx = current()
    store = ctx.store
    assert store is not None and ctx.channel is not None
    counter = _Count()
    logging.getLogger("tether").addHandler(counter)

    calls = int(cfg["calls"])  # type: ignore[arg-type]
    ops = list(cfg["ops"])  # type: ignore[call-overload]
    slow_every, stall_every = int(cfg["slow_every"]), int(cfg["stall_every"])  # type: ignore[arg-type]
    samples = sorted({s for s in SAMPLES if s <= calls} | {calls})
    out = Path(str(cfg["outdir"]))

    @tether.one_rank_only(with_barrier=True)
    def only_rank0() -> int:
        return 1

    tensor = torch.ones(8)
    bt = torch.zeros(4)

    def slow() -> None:
        if rank == 1:
            time.sleep(SLOW_SLEEP)
            key = ctx.channel.key("sync", "w", ctx.seqs.get("w", 0) + 1, "n")  # type: ignore[union-attr]
            stats["check_key_seen"] += int(store.check([key]))
        tether.all_reduce(1)

    def stall() -> None:
        if rank == 1:
            time.sleep(STALL_SLEEP)
        tether.barrier()

    def ofr() -> None:
        with tether.one_rank_first():
            pass

    run = {
        "barrier": lambda: tether.barrier(),
        "ofr": ofr,
        "oro": only_rank0,
        "ar_int": lambda: tether.all_reduce(1),
        "ar_tensor": lambda: tether.all_reduce(tensor),
        "ag_float": lambda: tether.all_gather(0.1),
        "ag_str": lambda: tether.all_gather("abc"),
        "bcast": lambda: tether.broadcast(bt, src=0),
        "barrier_list": lambda: tether.barrier(group=[0, 1]),
        "slow": slow,
        "stall": stall,
    }
    stats = {"slow": 0, "stall": 0, "check_key_seen": 0}
    owner: dict[str, bytearray] = {"w": bytearray(), "g0.1": bytearray()}  # seq -> op index, per group
    codes = OPS + SPECIAL + ["sample"]

    def note(op: str, before: dict[str, int]) -> None:
        for g, seqs in owner.items():
            n = ctx.seqs.get(g, 0) - before.get(g, 0)
            seqs.extend([codes.index(op)] * n)

    rows = []
    t0 = time.monotonic()
    for i in range(1, calls + 1):
        op = schedule(i, ops, slow_every, stall_every)
        if op in stats:
            stats[op] += 1
        before = dict(ctx.seqs)
        run[op]()
        note(op, before)
        if i in samples:
            before = dict(ctx.seqs)
            tether.barrier()
            note("sample", before)
            dist.barrier()
            if rank == 0:
                keys = int(store.num_keys())
                time.sleep(0.05)
                again = int(store.num_keys())
                rows.append({"calls": i, "keys": keys, "again": again, "s": time.monotonic() - t0})
                (out / "rows.json").write_text(json.dumps(rows))
                print(f"[{i:>7,} calls: {keys} keys, {time.monotonic() - t0:6.1f} s]", flush=True)
            dist.barrier()

    # where did keys pile up? (only if they did: the probe costs a round trip per key)
    base = rows[0]["keys"] if rank == 0 and rows else 0
    grew = bool(rank == 0 and rows and rows[-1]["keys"] != base)
    result: dict[str, object] = {"rows": rows, "stats": stats, "stall_reports": counter.stalls}
    if rank == 0:
        chan = ctx.channel
        result["inbox_len"] = {r: int(store.queue_len(chan.key("inbox", r))) for r in range(tether.get_world_size())}
        qn_key = chan.key("q", "n")
        result["queries"] = int(store.add(qn_key, 0)) if store.check([qn_key]) else 0
    if grew:
        found: dict[str, int] = {}
        for g, seqs in owner.items():
            for seq, code in enumerate(seqs, start=1):
                for suffix in ("n", "go", "expired"):
                    if store.check([chan.key("sync", g, seq, suffix)]):
                        name = f"P/sync/{g}/<seq>/{suffix} of {codes[code]}"
                        found[name] = found.get(name, 0) + 1
        for qid in range(1, int(result["queries"]) + 1):  # type: ignore[call-overload]
            for r in range(tether.get_world_size()):
                if store.check([chan.key("where", qid, r)]):
                    found["P/where/<qid>/<rank>"] = found.get("P/where/<qid>/<rank>", 0) + 1
        for single in (("q", "n"), ("fail", "n")):  # counters made on first use
            if store.check([chan.key(*single)]):
                found["P/" + "/".join(single)] = 1
        result["probe"] = found
    if rank == 1:
        (out / "rank1.json").write_text(json.dumps(stats))
    dist.barrier()
    if rank == 0:
        (out / "result.json").write_text(json.dumps(result))


def launch(cfg_json: str) -> None:
    """The launcher process: hosts the store (``tether.spawn``)."""
    import tether

    cfg = json.loads(cfg_json)
    tether.spawn("gloo", worker, (cfg,), nproc_per_node=2, warn_after=float(cfg["warn_after"]))


# --- the driver ----------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100_000, help="mixed calls per rank (default 100,000)")
    parser.add_argument(
        "--only", nargs="+", choices=OPS + SPECIAL, default=None, help="run only these ops (default: all)"
    )
    parser.add_argument("--slow-every", type=int, default=2_000, help="a slow collective every N calls")
    parser.add_argument("--stall-every", type=int, default=10_000, help="a stall report every N calls")
    parser.add_argument("--warn-after", type=float, default=0.2, help="spawn's warn_after (s)")
    parser.add_argument("--bound", type=float, default=None, help="kill the job after this long (s)")
    parser.add_argument("--out", type=Path, default=RESULTS / "store_keys.md", help="markdown copy; '-' for none")
    parser.add_argument("--_launch", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._launch:
        launch(args._launch)
        return
    import torch

    import _proc

    _proc.exit_on_sigterm()
    ops = args.only or OPS + SPECIAL
    bound = args.bound or 90 + args.calls * 0.005
    with tempfile.TemporaryDirectory() as outdir:
        cfg = {
            "calls": args.calls,
            "ops": ops,
            "slow_every": args.slow_every,
            "stall_every": args.stall_every,
            "warn_after": args.warn_after,
            "outdir": outdir,
        }
        t0 = time.monotonic()
        done = _proc.run([sys.executable, str(Path(__file__).resolve()), "--_launch", json.dumps(cfg)], bound)
        wall = time.monotonic() - t0
        res_path, rows_path, r1_path = (Path(outdir, f) for f in ("result.json", "rows.json", "rank1.json"))
        result = json.loads(res_path.read_text()) if res_path.exists() else None
        rows = json.loads(rows_path.read_text()) if rows_path.exists() else []
        rank1 = json.loads(r1_path.read_text()) if r1_path.exists() else {}
    print(done.stdout[-2000:], end="")
    if result is None or done.returncode != 0 or done.leftovers:
        sys.stderr.write(done.stderr[-5000:])
        print(
            f"store_keys: job failed: exit {done.returncode} (None: killed at {bound:.0f} s), "
            f"leftovers {done.leftovers}, {len(rows)} samples taken",
            file=sys.stderr,
        )
    if not rows:
        raise SystemExit(1)

    base, last = rows[0], rows[-1]
    same = last["keys"] == base["keys"]
    lines = [
        "# tether store keys over a long job",
        "",
        f"`python benchmarks/store_keys.py {' '.join(sys.argv[1:])}` — {time.strftime('%Y-%m-%d %H:%M')}, "
        f"{os.cpu_count()} cores, load average {'/'.join(f'{x:.1f}' for x in os.getloadavg())} (1/5/15 min, "
        f"at end); torch {torch.__version__}; 2 ranks, `tether.spawn` (gloo, its launcher hosts the "
        f"TCPStore), warn_after={args.warn_after} s. Job wall time {wall:.0f} s (exit {done.returncode}).",
        "",
        f"Ops in rotation: {', '.join(o for o in ops if o not in SPECIAL)}"
        + (f"; slow collective every {args.slow_every:,} calls" if "slow" in ops else "")
        + (f"; stall report every {args.stall_every:,} calls" if "stall" in ops else "")
        + ". Keys: `store.num_keys()` on rank 0 after a `tether.barrier()` + `dist.barrier()` (every key of "
        "the store, the process groups' included; queues not counted).",
        "",
        "| calls | keys | seconds elapsed |",
        "|---:|---:|---:|",
    ]
    for r in rows:
        flag = f" (then {r['again']} 50 ms later)" if r["again"] != r["keys"] else ""
        lines.append(f"| {r['calls']:,} | {r['keys']}{flag} | {r['s']:.1f} |")
    lines.append("")
    if result is not None:
        stats = result["stats"]
        lines += [
            f"Slow collectives: {stats['slow']}, mismatch-check key seen on the store by the late rank: "
            f"{rank1.get('check_key_seen', '?')}/{rank1.get('slow', '?')}. Stall calls: {stats['stall']}; stall "
            f"reports logged on rank 0: {result['stall_reports']}; "
            f"whereabouts queries asked: {result.get('queries', '?')}. Inbox queue lengths at the end (not in "
            f"num_keys): {result.get('inbox_len', '?')}.",
            "",
        ]
        if "probe" in result:
            probe = result["probe"]
            lines += [
                "The count grew. TCPStore cannot list keys; keys still present among the families rank 0 knows "
                "of (each sync seq attributed to the op that used it):",
                "",
                *(f"* `{k}`: {v}" for k, v in sorted(probe.items(), key=lambda kv: -kv[1])),
                *(["* (none of the known families: the growth is elsewhere)"] if not probe else []),
                "",
            ]
    lines.append(f"keys after {last['calls']:,} == keys after {base['calls']:,}: {'yes' if same else 'no'}")
    text = "\n".join(lines)
    print()
    print(text)
    if str(args.out) != "-":
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    if result is None or done.returncode != 0:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
