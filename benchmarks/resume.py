"""What a failure costs with ``tether.Checkpointer``: steps recomputed, time to train again, save costs.

Usage::

    python benchmarks/resume.py                 # 2 and 4 ranks, ~5 minutes on 2 cores
    python benchmarks/resume.py --ranks 2 --repeats 1
    python benchmarks/resume.py --step-time-pairs 4 --out benchmarks/results/resume-steptime.md

Every job is ``torchrun --max-restarts 1`` on loopback (gloo, one thread per rank) of this
file's worker: a DDP model from ``tether.auto_model`` trained for ``--steps`` steps
through ``Checkpointer.step``. In the first attempt rank 1 raises at step ``--fail-at``
(the others are then in ``backward()``); torchrun restarts every worker, which resume.
Each rank appends one JSON line per event to its own file (one clock: one machine).

Figures, per world size (median, and the range over ``--repeats`` jobs):

* **steps recomputed**: steps trained in the second attempt that the first had
  completed. Emergency save on (``every=50``): must be 0 (the target is <= 1);
  periodic saves only (``emergency=False``, ``every=10``): up to ``every``.
* **failure -> training again**: from the raise to the first step completed by the
  restarted job (torchrun's restart, the imports, ``resume()``'s load, one step),
  against the same job with no checkpoint at all (a plain restart, from step 0).
  Target: <= 2x the plain restart.
* **step time with periodic async checkpoints** every 10 steps vs none, in one job
  each, side by side (interleaved jobs); the median step time over the steps after the
  first 5. Target <= 1.02x.
* **emergency save time** of a ~100 MB model (``--big``: 25M float32 parameters): from
  the claim to the rename, as the saving rank measures it.

Before each world size the driver waits until the 1-minute load average is below
``--wait-load`` (see ``_proc.wait_for_load``); the result gives it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


# --- the worker (one rank under torchrun) ----------------------------------------------------


def worker(out: str, steps: int, fail_at: int, mode: str, big: bool) -> None:
    import torch

    import tether
    from tether import checkpoint

    torch.set_num_threads(1)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    tether.initialize("gloo")
    rank = tether.get_rank()
    log = open(Path(out, f"events.{rank}"), "a")  # noqa: SIM115 (kept open for the whole run)

    def note(event: str, **data: object) -> None:
        log.write(json.dumps({"event": event, "attempt": attempt, "t": time.time(), **data}) + "\n")
        log.flush()

    width = 2048 if big else 256
    torch.manual_seed(0)
    layers = [torch.nn.Linear(width, width) for _ in range(6 if big else 4)]
    model = tether.auto_model(torch.nn.Sequential(*layers))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    every = {"emergency": 50, "periodic": 10, "async10": 10}.get(mode)
    ckpt = None
    if mode != "none":
        ckpt = tether.Checkpointer(
            {"model": model, "optimizer": opt}, Path(out, "ckpt"), every=every, emergency=mode == "emergency"
        )
        original = checkpoint.Checkpointer._write

        def timed(self: checkpoint.Checkpointer, *args: object, **kwargs: object) -> Path:
            t = time.monotonic()
            path = original(self, *args, **kwargs)  # type: ignore[arg-type]
            if kwargs.get("emergency", args[-1] if args else False):
                note("emergency_saved", seconds=time.monotonic() - t)
            return path

        checkpoint.Checkpointer._write = timed  # type: ignore[method-assign]
    start = ckpt.resume() if ckpt is not None else tether.Position()
    note("resumed", step=start.step)
    x = torch.full((8, width), 0.01)
    for i in range(steps):
        if start.skips(0, i):
            continue
        t = time.monotonic()
        with ckpt.step(0, i) if ckpt is not None else _nothing():
            if attempt == 0 and i == fail_at and rank == 1:
                note("fault")
                raise RuntimeError("benchmark: rank 1 failed")
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
        note("step", step=i, seconds=time.monotonic() - t)
    if ckpt is not None:
        ckpt.wait()
    tether.finalize()


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


# --- the driver ---------------------------------------------------------------------------------


def events(out: Path, world: int) -> list[dict[str, object]]:
    found = []
    for r in range(world):
        path = out / f"events.{r}"
        if path.exists():
            found += [{**json.loads(line), "rank": r} for line in path.read_text().splitlines()]
    return found


def job(world: int, steps: int, fail_at: int, mode: str, big: bool, restarts: int) -> list[dict[str, object]]:
    import _proc

    with tempfile.TemporaryDirectory(prefix="tether-resume-bench-") as out:
        args = _proc.torchrun(
            world,
            __file__,
            "--worker",
            out,
            str(steps),
            str(fail_at),
            mode,
            "1" if big else "0",
            launcher=("--max-restarts", str(restarts), "--monitor_interval", "0.1"),
        )
        done = _proc.run(args, 600.0, env={"OMP_NUM_THREADS": "1"})
        if done.returncode != 0:
            raise RuntimeError(f"job {mode} at {world} ranks ended with {done.returncode}:\n{done.stderr[-3000:]}")
        return events(Path(out), world)


def recomputed(evs: list[dict[str, object]]) -> int:
    first = {e["step"] for e in evs if e["event"] == "step" and e["attempt"] == 0 and e["rank"] == 0}
    return sum(1 for e in evs if e["event"] == "step" and e["attempt"] == 1 and e["rank"] == 0 and e["step"] in first)


def back_to_training(evs: list[dict[str, object]]) -> float:
    fault = min(float(e["t"]) for e in evs if e["event"] == "fault")  # type: ignore[arg-type]
    again = min(float(e["t"]) for e in evs if e["event"] == "step" and e["attempt"] == 1)  # type: ignore[arg-type]
    return again - fault


def step_time(evs: list[dict[str, object]]) -> float:
    times = [float(e["seconds"]) for e in evs if e["event"] == "step" and int(e["step"]) >= 5]  # type: ignore[call-overload]
    return statistics.median(times)


def step_mean(evs: list[dict[str, object]]) -> float:
    """Mean step time after the first 5 steps: the throughput, save steps included."""
    times = [float(e["seconds"]) for e in evs if e["event"] == "step" and int(e["step"]) >= 5]  # type: ignore[call-overload]
    return statistics.fmean(times)


def measure_step_time(world: int, pairs: int) -> dict[str, object]:
    """``pairs`` pairs of jobs, no checkpoint and async saves every 10, in alternating order.

    Jobs of the same kind differ by 5-10 % here from one to the next, so one pair cannot
    read a 1.02x target; the ratio of each pair (ran back to back, under the same load) is
    kept, and the figure is their median with quartiles.
    """
    got: dict[str, list[float]] = {"none_mean": [], "async10_mean": [], "none_median": [], "async10_median": []}
    for i in range(pairs):
        for mode in ("none", "async10") if i % 2 == 0 else ("async10", "none"):
            evs = job(world, 60, -1, mode, big=True, restarts=0)
            got[f"{mode}_mean"].append(step_mean(evs))
            got[f"{mode}_median"].append(step_time(evs))
    return {"world": world, "pairs": pairs, **got}


def step_time_table(results: list[dict[str, object]]) -> str:
    import _proc

    lines = [
        "| ranks | step, no checkpoint: mean (ms) | step, async save every 10: mean (ms) | ratio of means, "
        "per pair: median (IQR) | verdict (target <= 1.02) | ratio of medians, per pair: median (IQR) |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        none, saved = r["none_mean"], r["async10_mean"]
        q1, med, q3 = _proc.paired_ratios(saved, none)  # type: ignore[arg-type]
        m1, mm, m3 = _proc.paired_ratios(r["async10_median"], r["none_median"])  # type: ignore[arg-type]
        lines.append(
            f"| {r['world']} | {statistics.median(none) * 1e3:.1f} | {statistics.median(saved) * 1e3:.1f} | "  # type: ignore[arg-type]
            f"{med:.3f}x ({q1:.3f} to {q3:.3f}) | {_proc.verdict(q1, q3, 1.02)} | {mm:.3f}x ({m1:.3f} to {m3:.3f}) |"
        )
    return "\n".join(lines)


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3g} ({min(xs):.3g}-{max(xs):.3g})"


def measure(world: int, repeats: int) -> dict[str, object]:
    steps, fail_at = 40, 25
    rec: dict[str, list[float]] = {k: [] for k in ("emergency", "periodic")}
    again: dict[str, list[float]] = {k: [] for k in ("emergency", "none")}
    timing: dict[str, list[float]] = {"async10": [], "none": []}
    saves: list[float] = []
    for _ in range(repeats):
        for mode in ("emergency", "periodic", "none"):
            evs = job(world, steps, fail_at, mode, big=False, restarts=1)
            if mode in rec:
                rec[mode].append(recomputed(evs))
            if mode in again:
                again[mode].append(back_to_training(evs))
        for mode in ("async10", "none"):
            timing[mode].append(step_time(job(world, 60, -1, mode, big=True, restarts=0)))
        evs = job(world, 8, 5, "emergency", big=True, restarts=1)
        saves += [float(e["seconds"]) for e in evs if e["event"] == "emergency_saved"]  # type: ignore[arg-type]
    ratio = [a / b for a, b in zip(again["emergency"], again["none"], strict=True)]
    step_ratio = [a / b for a, b in zip(timing["async10"], timing["none"], strict=True)]
    return {
        "world": world,
        "recomputed_emergency": rec["emergency"],
        "recomputed_periodic_every10": rec["periodic"],
        "again_emergency_s": again["emergency"],
        "again_plain_s": again["none"],
        "again_ratio": ratio,
        "step_async10_s": timing["async10"],
        "step_none_s": timing["none"],
        "step_ratio": step_ratio,
        "emergency_save_100MB_s": saves,
    }


def table(results: list[dict[str, object]]) -> str:
    rows = [
        ("steps recomputed, emergency save on (target <= 1)", "recomputed_emergency"),
        ("steps recomputed, periodic only, every=10", "recomputed_periodic_every10"),
        ("failure -> training again, emergency + resume (s)", "again_emergency_s"),
        ("failure -> training again, plain restart (s)", "again_plain_s"),
        ("ratio resume / plain restart (target <= 2)", "again_ratio"),
        ("step time, 100 MB model, async save every 10 (s)", "step_async10_s"),
        ("step time, 100 MB model, no checkpoint (s)", "step_none_s"),
        ("ratio (target <= 1.02)", "step_ratio"),
        ("emergency save of a 100 MB model (s)", "emergency_save_100MB_s"),
    ]
    head = "| figure | " + " | ".join(f"{r['world']} ranks: median (range)" for r in results) + " |"
    lines = [head, "|---|" + "---|" * len(results)]
    for label, key in rows:
        cells = [spread([float(v) for v in r[key]]) if r[key] else "-" for r in results]  # type: ignore[attr-defined]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    import _proc

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--wait-load", type=float, default=1.5)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "resume.md")
    parser.add_argument(
        "--step-time-pairs",
        type=int,
        default=None,
        help="measure only the step time, from this many interleaved pairs of jobs (results: --out)",
    )
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        out, steps, fail_at, mode, big = args.worker
        worker(out, int(steps), int(fail_at), mode, big == "1")
        return
    _proc.exit_on_sigterm()
    library = _proc.library_state()
    if args.step_time_pairs:
        step_time_only(args, library)
        return
    results, loads = _each_world(args, lambda world: measure(world, args.repeats))
    setup = f"torchrun --max-restarts 1, gloo, {args.repeats} job(s) per cell."
    _report(args, "# tether: what a failure costs with Checkpointer", setup, library, loads, results, [table(results)])


def _each_world(
    args: argparse.Namespace, measure_one: Callable[[int], dict[str, object]]
) -> tuple[list[dict[str, object]], list[str]]:
    """``measure_one(world)`` per world size, each after the load settled; the results and the loads."""
    import _proc

    results, loads = [], []
    for world in args.ranks:
        quiet = _proc.wait_for_load(args.wait_load, what=f"{world} ranks")
        loads.append(f"{world} ranks: {quiet.describe()}")
        results.append(measure_one(world))
    return results, loads


def step_time_only(args: argparse.Namespace, library: dict[str, object]) -> None:
    results, loads = _each_world(args, lambda world: measure_step_time(world, args.step_time_pairs))
    setup = (
        "torchrun, gloo, one thread per rank; the ~100 MB model (25M float32 parameters), 60 steps per job, the "
        "steps after the first 5 timed; a checkpoint job saves every 10 steps with `Checkpointer(every=10)` "
        f"(async). {args.step_time_pairs} pairs of jobs per world size, the two jobs of a pair back to back, "
        "their order alternating."
    )
    after = (
        "The mean counts the save steps (the snapshot on the training thread) and the steps the "
        "background writer shares the CPU with; the median of steps, the figure of `resume.md`, "
        "leaves the save steps out."
    )
    title = "# tether: step time with periodic async checkpoints"
    _report(args, title, setup, library, loads, results, [step_time_table(results), after])


def _report(
    args: argparse.Namespace,
    title: str,
    setup: str,
    library: dict[str, object],
    loads: list[str],
    results: list[dict[str, object]],
    body: list[str],
) -> None:
    """Write ``args.out`` (markdown) and its ``.json``, and print the markdown."""
    import _proc

    end = os.getloadavg()
    text = "\n\n".join(
        [
            title,
            f"`python benchmarks/resume.py {' '.join(sys.argv[1:])}` — {time.strftime('%Y-%m-%d %H:%M')}, "
            f"{os.cpu_count()} cores, load average at end {end[0]:.1f}/{end[1]:.1f}/{end[2]:.1f}; {setup}",
            _proc.describe_library(library, _proc.library_state()),
            "Load before each world size: " + "; ".join(loads) + ".",
            *body,
        ]
    )
    args.out.write_text(text + "\n")
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    print(text)


if __name__ == "__main__":
    main()
