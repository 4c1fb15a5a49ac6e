"""How long a job takes to start N ranks: tether.spawn's forkserver against spawn, torch, ignite.

Usage::

    python benchmarks/startup.py                 # 2 and 4 ranks, 8 rounds; writes results/startup.md

Each job (``_startup_job.py``) is a fresh interpreter that starts N ranks; every rank joins
a gloo group, passes one barrier and exits. Contenders, interleaved round by round (the
order rotates), in one run:

* ``torch.multiprocessing.spawn`` + ``init_process_group``: the raw reference;
* ``ignite.distributed.Parallel`` (where installed): the peer tether stands in for;
* ``tether.spawn(start_method="spawn")``: every worker imports torch itself;
* ``tether.spawn`` (its default, a forkserver that imported tether and torch once).

Two figures per job: *launch*, the seconds from just before the launch call to its return
(printed by the job), and *whole*, the job's wall time from the driver's ``Popen`` to its
exit (the launcher's own imports included). Medians with their IQR; ratios are the median
and quartiles of the per-round ratios against torch's.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
JOB = HERE / "_startup_job.py"


def contenders() -> list[str]:
    names = ["torch", "ignite", "tether-spawn", "tether"]
    return names if importlib.util.find_spec("ignite") else [n for n in names if n != "ignite"]


LABELS = {
    "torch": "torch.multiprocessing.spawn",
    "ignite": "ignite Parallel",
    "tether-spawn": 'tether.spawn, start_method="spawn"',
    "tether": "tether.spawn (default: forkserver)",
}


def run_job(
    name: str, world: int, prefix: list[str] | None = None, env: dict[str, str] | None = None, bound: float = 120.0
) -> tuple[float, float]:
    """One ``_startup_job.py`` job, run after the command ``prefix`` (``slow_start.py``: a
    slow resolver): (*launch*, *whole*) in seconds; a failed job ends the benchmark."""
    import _proc

    command = [*(prefix or []), sys.executable, str(JOB), name, str(world)]
    done = _proc.run(command, bound, {"OMP_NUM_THREADS": "1", **(env or {})})
    lines = [line for line in done.stdout.splitlines() if line.startswith("LAUNCH ")]
    if done.returncode != 0 or not lines or done.leftovers:
        raise SystemExit(
            f"{name} at {world} ranks failed (exit {done.returncode}, leftovers {done.leftovers}):\n"
            + (done.stdout + done.stderr)[-3000:]
        )
    return float(lines[-1].split()[1]), done.exited - done.started


def measure(world: int, rounds: int) -> dict[str, dict[str, list[float]]]:
    names = contenders()
    got: dict[str, dict[str, list[float]]] = {n: {"launch": [], "whole": []} for n in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            launch, whole = run_job(name, world)
            got[name]["launch"].append(launch)
            got[name]["whole"].append(whole)
        sys.stderr.write(f"[{world} ranks: round {r + 1} of {rounds} done]\n")
    return got


def table(world: int, got: dict[str, dict[str, list[float]]]) -> list[str]:
    import _proc

    rows = []
    base = got["torch"]
    for name, figures in got.items():
        cells = [LABELS[name]]
        for key in ("launch", "whole"):
            q1, med, q3 = _proc.quartiles(figures[key])
            r1, ratio, r3 = _proc.paired_ratios(figures[key], base[key])
            cells += [f"{med:.2f} ({100 * (q3 - q1) / med:.0f}%)", f"{ratio:.2f}x ({r1:.2f} to {r3:.2f})"]
        rows.append(f"| {world} | " + " | ".join(cells) + " |")
    return rows


def main() -> None:
    import _proc

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "startup.md")
    _proc.add_driver_options(parser)
    args = parser.parse_args()
    _proc.exit_on_sigterm(args.ignore_sigterm)
    library = _proc.library_state()
    results, loads, rows = {}, [], []
    for world in args.worlds:
        quiet = _proc.wait_for_load(args.wait_load, up_to=args.wait_max, what=f"{world} ranks")
        results[world] = measure(world, args.rounds)
        loads.append(f"{world} ranks: {quiet.describe()}, {os.getloadavg()[0]:.2f} at end")
        rows += table(world, results[world])
    head = (
        "| ranks | contender | launch s (IQR %) | launch vs torch (IQR) | whole job s (IQR %) | whole vs torch (IQR) |"
    )
    text = "\n\n".join(
        [
            "# tether start-up benchmark",
            f"`python benchmarks/startup.py {_proc.command_line()}` — {time.strftime('%Y-%m-%d %H:%M')}, "
            f"{os.cpu_count()} cores; gloo, one thread per rank; every rank joins, passes one barrier, exits.",
            *([args.note] if args.note else []),
            _proc.describe_library(library, _proc.library_state()),
            "Load (1-minute average): " + "; ".join(loads) + ".",
            f"Medians of {args.rounds} interleaved rounds. *launch*: from just before the launch call to its "
            "return; *whole*: the job's wall time, its launcher's imports included. Ratios: median and quartiles "
            "of the per-round ratios against `torch.multiprocessing.spawn`.",
            "\n".join([head, "|---|---|---|---|---|---|", *rows]),
        ]
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    args.out.with_suffix(".json").write_text(json.dumps({str(w): r for w, r in results.items()}, indent=1) + "\n")
    print(text)
    medians = {w: {n: statistics.median(f["launch"]) for n, f in r.items()} for w, r in results.items()}
    print(json.dumps(medians))


if __name__ == "__main__":
    main()
