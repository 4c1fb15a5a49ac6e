"""How much a failed job prints, under ``tether.Parallel`` and under torchrun (issue 11).

Usage::

    python benchmarks/output.py            # 4 ranks; writes benchmarks/results/output.md

Runs ``tests/jobs/output_failure.py`` (rank 1 raises inside ``one_rank_first``; the other
ranks wait for it) once under ``Parallel(nproc_per_node=4)`` and once under ``torchrun
--nproc_per_node 4`` (with ``OMP_NUM_THREADS=1``, which silences torchrun's banner), and
counts the lines of stdout + stderr: all of them, the ranks' own (``[rank R] ...``), and
the tracebacks.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
JOB = HERE.parent / "tests" / "jobs" / "output_failure.py"


def count(text: str) -> dict[str, int]:
    lines = text.splitlines()
    return {
        "lines": len(lines),
        "ranks' own lines": sum(1 for line in lines if line.startswith("[rank ")),
        "tracebacks": text.count("Traceback (most recent call last)"),
    }


def main() -> None:
    import _proc

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "output.md")
    args = parser.parse_args()
    env = {"OMP_NUM_THREADS": "1"}
    runs = {
        "python + Parallel": _proc.run([sys.executable, str(JOB), "spawn", str(args.nproc)], 120.0, env),
        "torchrun": _proc.run(_proc.torchrun(args.nproc, JOB, "torchrun"), 120.0, env),
    }
    rows = ["| launcher | exit code | lines | ranks' own lines | tracebacks |", "|---|---|---|---|---|"]
    for name, done in runs.items():
        lines, own, tracebacks = count(done.stdout + done.stderr).values()
        rows.append(f"| {name} | {done.returncode} | {lines} | {own} | {tracebacks} |")
    text = "\n\n".join(
        [
            "# What a failed job prints",
            f"`python benchmarks/output.py {' '.join(sys.argv[1:])}` — {time.strftime('%Y-%m-%d %H:%M')}, "
            f"{os.cpu_count()} cores; {args.nproc} ranks, rank 1 raises (`tests/jobs/output_failure.py`).",
            _proc.describe_library(_proc.library_state(), _proc.library_state()),
            "\n".join(rows),
        ]
    )
    args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
