"""Step time with periodic checkpoints every 10 steps vs none, interleaved in the same processes.

Usage::

    python benchmarks/checkpoint_step.py                    # 2 and 4 ranks, ~16 minutes on 2 cores
    python benchmarks/checkpoint_step.py --ranks 2 --rounds 4 --out /tmp/ckpt-trial

Results go to ``--out`` + ``.md`` and + ``.json``, by default
``benchmarks/results/checkpoint-step``. Target (issue 12): <= 1.02x.

Why not separate jobs (``resume.py --step-time-pairs``): two jobs of the same kind differ
by 5-10 % here from one to the next, more than the 2 % to be read. Here both contenders
run in the same processes, over the same model, optimizer and process group, in
interleaved blocks, the way ``ddp.py`` compares hooks.

One torchrun job per world size (gloo, one thread per rank). Each rank builds the ~100 MB
model of ``resume.py --big`` (six ``Linear(2048, 2048)``, 25.2M float32 parameters) with
``tether.auto_model``, SGD, and one ``tether.Checkpointer(every=10)`` into a temporary
directory (rank 0 saves). A *block* is 20 training steps (forward, loss, backward, SGD
step, zero_grad) of one contender:

* **none**: the loop as written without a Checkpointer;
* **every 10**: the same steps inside ``ckpt.step(...)``: two periodic saves per block,
  at its 5th and 15th step, and ``ckpt.wait()`` at its end, *inside* the timing, so
  whatever a save costs (the random states' all-gather, the snapshot on the training
  thread, the writer thread's CPU, a wait for it) is charged to its own block and never
  spills into the next;
* **none, again**: a second block of *none*, the control: its ratio to *none* is what
  the machine's noise alone gives, the floor under which no ratio can be read.

Each step's input is one fixed batch, or with ``--input loader`` a fresh batch from a
shuffled ``DataLoader`` (both contenders draw from one iterator): a real loop's
allocations between steps. They matter here: a guarded step of this model reuses its
memory, and a few small allocations between two steps can make glibc trim its heap, so
that the next step faults ~64-96 MiB in again (``between_steps.py``). A loop with a
``DataLoader`` does not hide that cost: a save cost as much with either input
(``results/checkpoint-step-2r-{fixed,loader}-088e5c0-*.md``); whether a guarded step
faults at all varies from job to job (``results/between-steps-loops*.md``).

The writer process of commit 74b90a5 was a third contender here until it was reverted
(``benchmarks/results/checkpoint-writer-process.md``).

Warm-up: a 15-step block of each (one save, at step 10). Then ``--rounds`` rounds of
``--passes`` passes (default 2), a pass one block of each contender, in an order shuffled
from round to round (the same seed on every rank) and reversed every other pass (A B C,
C B A: a drift linear over the round weighs on each contender alike); each block starts
on an untimed ``dist.barrier()``; each step is timed on every rank, and a contender's time
in a round is the slowest rank's sum of its steps there (``ckpt.wait()`` at a block's end
is charged to the block's last step).
The figure is the median of the per-round ratios with their quartiles; a target is *met*
when the upper quartile is within it. Before each world size the driver waits until the
1-minute load average is below ``--wait-load``.

The VM drifts: a block's ratio moved by ±4-18 % from round to round on 2026-12-02, with
the control's as wide, and 50-step blocks did not narrow it (``checkpoint-step-b50.md``).
Before commit 9f96b0d each round ran one block of each contender in an order rotated from
round to round; ``ddp.py`` found such an order biased between identical contenders
(``results/ddp-interleave.md``), hence the shuffled order and the passes.
So the steps are also read one by one: *where a save's cost lands* gives, for each step
since the last save, the median over rounds of its excess over its round's plain median
step, on rank 0 (the saver), and their sum, the cost of one save in ms; and, immune to
the drift, the step that saves and the two after against the same block's later steps
(``where_it_lands``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

BLOCK = 20  # steps per block (--block): saves at its 5th and 15th step (every=10, after a 15-step warm-up block)
WARMUP = 15


def worker(rounds: int, out: str, steps: int, passes: int, source: str) -> None:
    import torch
    import torch.distributed as dist

    import _proc
    import tether

    torch.set_num_threads(1)
    tether.initialize("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = tether.auto_model(torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(6)]))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    ckpt = tether.Checkpointer({"model": model, "optimizer": opt}, Path(out, "ckpt"), every=10, emergency=False)
    batches = _proc.batches(source == "loader")

    def train() -> None:
        model(next(batches)).square().mean().backward()
        opt.step()
        opt.zero_grad()

    def none(n: int, times: list[float], _: list[int]) -> None:
        for _ in range(n):
            t0 = time.perf_counter()
            train()
            times.append(time.perf_counter() - t0)

    def saving(c: tether.Checkpointer) -> Any:
        def block(n: int, times: list[float], since: list[int]) -> None:
            for _ in range(n):
                since.append((c.position.step + 1) % 10)  # 0: this step saves (every=10)
                t0 = time.perf_counter()
                with c.step(0, c.position.iteration):
                    train()
                times.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            c.wait()
            times[-1] += time.perf_counter() - t0  # the block's last wait, charged to its last step

        return block

    contenders = [("none", none), ("every10", saving(ckpt)), ("control", none)]
    for _, block in contenders:
        block(WARMUP, [], [])  # a save at step 10 (the writer started); the next blocks save at their 5th and 15th
    per_step: dict[str, list[list[float]]] = {name: [] for name, _ in contenders}
    since: list[int] = []  # the every10 blocks' steps since their last save, in order (the same every round)
    for r in range(rounds):
        order = list(contenders)
        random.Random(r).shuffle(order)  # the same order on every rank: the same seed
        times: dict[str, list[float]] = {name: [] for name, _ in contenders}  # a round's steps, its passes in turn
        for p in range(passes):
            for name, block in order if p % 2 == 0 else order[::-1]:
                dist.barrier()
                block(steps, times[name], since if name == "every10" and r == 0 else [])
        for name, _ in contenders:
            per_step[name].append(times[name])
    mine = torch.tensor([per_step[name] for name, _ in contenders], dtype=torch.float64) * 1e3
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    if rank == 0:
        blocks = torch.stack(every).sum(3).amax(0) / (steps * passes)  # each rank's round summed; the slowest's
        result = {f"{name}_ms": blocks[i].tolist() for i, (name, _) in enumerate(contenders)}
        # one rank's steps, the saver's: summed they are its block (the slowest rank per step would
        # count a delay twice: the saver's snapshot, then the others' wait for it in the next step)
        steps_ms = {f"{name}_steps_ms": mine[i].tolist() for i, (name, _) in enumerate(contenders)}
        saved = len(list(Path(out, "ckpt").iterdir()))
        record = {"world": world, "rounds": rounds, **result, **steps_ms, "since_save": since, "saved": saved}
        print("RESULT " + json.dumps(record), flush=True)
    tether.finalize()


def run_world(n: int, rounds: int, steps: int, passes: int, source: str) -> dict[str, Any]:
    import _proc

    with tempfile.TemporaryDirectory(prefix="tether-ckpt-step-") as out:
        shape = ("--rounds", str(rounds), "--block", str(steps), "--passes", str(passes), "--input", source)
        args = _proc.torchrun(n, __file__, "--worker", *shape, "--dir", out)
        # a hang guard: a step took ~0.5 s at 4 ranks on 2 cores; this allows ~4x that
        done = _proc.run(args, 300 + 2.0 * n * (3 * rounds * passes + 3) * steps / 4, env={"OMP_NUM_THREADS": "1"})
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{n} ranks: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    found: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return found


def table(results: list[dict[str, Any]]) -> tuple[str, list[str]]:
    import _proc

    rows = [
        "| ranks | contender | ms/step (IQR %) | ratio to no checkpoint (IQR) | verdict (<= 1.02) |",
        "|---|---|---|---|---|",
    ]
    lines = []
    for r in results:
        none = r["none_ms"]
        rows.append(f"| {r['world']} | no checkpoint | {_cell(none)} | 1 | |")
        q1, med, q3 = _proc.paired_ratios(r["every10_ms"], none)
        verdict = _proc.verdict(q1, q3, 1.02)
        cell = _cell(r["every10_ms"])
        rows.append(f"| {r['world']} | save every 10 | {cell} | {med:.3f}x ({q1:.3f} to {q3:.3f}) | {verdict} |")
        if "control_ms" in r:
            c1, cmed, c3 = _proc.paired_ratios(r["control_ms"], none)
            floor = f"{cmed:.3f}x ({c1:.3f} to {c3:.3f})"
            rows.append(f"| {r['world']} | none, again (control) | {_cell(r['control_ms'])} | {floor} | |")
        lines.append(
            f"{r['world']} ranks: save every 10 / no checkpoint = {med:.3f}x (IQR {q1:.3f}x to {q3:.3f}x; "
            f"target <= 1.02x) {verdict}; {r['saved']} checkpoints written"
        )
        if "control_ms" in r:
            lines.append(f"{r['world']} ranks: the control (none, again / none) = {floor}: the noise floor")
        if "since_save" in r:
            lines.append(where_it_lands(r))
    return "\n".join(rows), lines


def where_it_lands(r: dict[str, Any]) -> str:
    """A save's cost by the step it lands on, on rank 0 (the saver), read two ways.

    *Against the plain block*: for each position (steps since the last save: 0 is the step
    that saves), the median over rounds of (that round's steps at the position) minus (the
    median step of that round's *none* block); their sum is the cost of one save, and the
    control's steps, given the same positions by their index, summed the same way, are its
    noise floor. The VM's drift between blocks enters each of the ten terms.

    *Within the block*: the steps at positions 0-2 against the median of the same block's
    steps at 3-9, which ran seconds apart, not a block apart: immune to that drift, it
    assumes that positions 3-9 carry no cost of the save (the first reading shows whether
    they do).
    """
    since = r["since_save"]

    def at(times: list[float], positions: range) -> list[float]:
        return [t for t, s in zip(times, since, strict=True) if s in positions]

    def excess(blocks: list[list[float]]) -> list[float]:
        return [
            statistics.median(
                statistics.median(at(times, range(p, p + 1))) - statistics.median(base)
                for times, base in zip(blocks, r["none_steps_ms"], strict=True)
            )
            for p in range(10)
        ]

    cost, floor = excess(r["every10_steps_ms"]), excess(r["control_steps_ms"])
    near = [
        statistics.median(
            statistics.median(at(times, range(p, p + 1))) - statistics.median(at(times, range(3, 10)))
            for times in r["every10_steps_ms"]
        )
        for p in range(3)
    ]
    plain = statistics.median(statistics.median(b) for b in r["none_steps_ms"])
    by_step = ", ".join(f"{c:+.1f}" for c in cost)
    return (
        f"{r['world']} ranks: where a save's cost lands on rank 0, ms over the plain step ({plain:.1f} ms) by "
        f"steps since the save (0: the step that saves): {by_step}; sum {sum(cost):.1f} ms a save "
        f"= {sum(cost) / (10 * plain) * 100:.1f}% of its 10 steps; the control, summed the same way: "
        f"{sum(floor):+.1f} ms ({sum(floor) / (10 * plain) * 100:+.1f}%). Within the block, the step that saves "
        f"and the two after: {', '.join(f'{c:+.1f}' for c in near)} ms over its steps 3-9 since the save, "
        f"{sum(near):.1f} ms a save = {sum(near) / (10 * plain) * 100:.1f}% of its 10 steps"
    )


def _cell(xs: list[float]) -> str:
    import _proc

    q1, med, q3 = _proc.quartiles(xs)
    return f"{med:.1f} ({(q3 - q1) / med * 100:.0f}%)"


def main() -> None:
    import _proc

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4], help="world sizes (default: 2 4)")
    parser.add_argument("--rounds", type=int, default=12, help="interleaved rounds (default 12)")
    parser.add_argument("--block", type=int, default=BLOCK, help=f"steps a block (default {BLOCK}; 10: one save)")
    parser.add_argument("--passes", type=int, default=2, help="blocks of each contender a round (default 2)")
    parser.add_argument(
        "--input",
        choices=("fixed", "loader"),
        default="fixed",
        help="each step's batch: one fixed tensor (default) or a shuffled DataLoader's (allocations between steps)",
    )
    parser.add_argument("--out", type=Path, default=HERE / "results" / "checkpoint-step", help="OUT.md and OUT.json")
    _proc.add_driver_options(parser)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.block % 10:
        parser.error("--block: a multiple of 10 (every block then starts at the same step of the save cycle)")
    if args.worker:
        worker(args.rounds, args.dir, args.block, args.passes, args.input)
        return
    _proc.exit_on_sigterm(ignore=args.ignore_sigterm)
    library = [_proc.library_state()]
    results, loads = [], []
    for n in args.ranks:
        quiet = _proc.wait_for_load(args.wait_load, up_to=args.wait_max, what=f"{n} ranks")
        t0 = time.monotonic()
        results.append(run_world(n, args.rounds, args.block, args.passes, args.input))
        end = os.getloadavg()[0]
        loads.append(f"{n} ranks: {quiet.describe()}, {end:.2f} at end ({time.monotonic() - t0:.0f} s)")
        print(f"[{loads[-1]}]", flush=True)
    library.append(_proc.library_state())
    one, five, fifteen = os.getloadavg()
    rows, lines = table(results)
    text = "\n\n".join(
        [
            "# tether: step time with periodic checkpoints, interleaved in the same processes",
            *([args.note] if args.note else []),
            f"`python benchmarks/checkpoint_step.py {_proc.command_line()}` — {time.strftime('%Y-%m-%d %H:%M')}, "
            f"{os.cpu_count()} cores, load average at end {one:.1f}/{five:.1f}/{fifteen:.1f} (1/5/15 min); "
            "torchrun, gloo, one thread per rank; the ~100 MB model (25.2M float32 parameters), SGD; "
            f"input: {'a shuffled DataLoader' if args.input == 'loader' else 'one fixed batch'}.",
            _proc.describe_library(*library),
            "Load (1-minute average) at the start of each world size, after waiting for it to drop below "
            f"{args.wait_load:g}, and at its end: " + "; ".join(loads) + ".",
            f"ms per step, median of {args.rounds} rounds of {args.passes} passes, a pass one {args.block}-step "
            "block of each contender (order shuffled per round, reversed every other pass), the slowest rank's "
            "sum of its steps in the round; IQR = interquartile range in % of the "
            "median; ratio = median of "
            f"the per-round ratios with their quartiles. A block with saves holds {args.block // 10} of them and "
            "ends with `ckpt.wait()`, inside its time (see the module docstring).",
            rows,
            "\n".join(lines),
        ]
    )
    print(text)
    args.out.with_suffix(".md").write_text(text + "\n")
    raw = {"results": results, "loads": loads, "none_median_ms": [statistics.median(r["none_ms"]) for r in results]}
    args.out.with_suffix(".json").write_text(json.dumps(raw, indent=1) + "\n")


if __name__ == "__main__":
    main()
