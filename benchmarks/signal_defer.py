"""What putting SIGINT/SIGTERM off across an optimizer's step costs (``hooks.Deferred``).

Usage::

    python benchmarks/signal_defer.py                 # 15 rounds of 20,000, ~10 s
    python benchmarks/signal_defer.py --out /tmp/defer.md

A ``tether.Checkpointer`` swaps the SIGINT and SIGTERM handlers for the span of each
``optimizer.step()`` inside ``ckpt.step`` and puts them back after (four
``signal.signal`` calls), so that a preemption's SIGTERM comes once the update is whole.
This times one start and end of that span, in one process on the main thread, with no
signal arriving, against a control that calls two empty methods the same way: per call,
the median of the rounds and their interquartile range. One process: no job, no store.

Writes ``--out`` (default ``benchmarks/results/signal-defer.md``).
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import time
from pathlib import Path

from tether._core.hooks import Deferred


class _Nothing:
    def start(self) -> None:
        pass

    def end(self) -> None:
        pass


def _per_call_us(span: Deferred | _Nothing, calls: int) -> float:
    start, end = span.start, span.end
    t0 = time.perf_counter()
    for _ in range(calls):
        start()
        end()
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "signal-defer.md"))
    args = parser.parse_args()
    load = os.getloadavg()[0]
    deferred, control = [], []
    for _ in range(args.rounds):  # alternating, so that drift lands on both
        deferred.append(_per_call_us(Deferred(), args.calls))
        control.append(_per_call_us(_Nothing(), args.calls))

    def quartiles(values: list[float]) -> tuple[float, float, float]:
        q1, median, q3 = statistics.quantiles(values, n=4)
        return median, q1, q3

    d, c = quartiles(deferred), quartiles(control)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [
        "# tether: putting SIGINT/SIGTERM off across an optimizer's step",
        "",
        f"{datetime.datetime.now():%Y-%m-%d %H:%M}, commit {commit}, load {load:.2f} at the start; "
        f"{args.rounds} rounds of {args.calls:,} start+end, the median round and the IQR of the rounds.",
        "",
        "| what | us per start+end | IQR |",
        "|---|---|---|",
        f"| `Deferred` (4 `signal.signal` calls) | {d[0]:.2f} | {d[1]:.2f}-{d[2]:.2f} |",
        f"| control: two empty methods | {c[0]:.2f} | {c[1]:.2f}-{c[2]:.2f} |",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
