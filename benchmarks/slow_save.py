"""How long the step of a job's first periodic save takes when new store connections are slow.

Usage (root: the slow resolver's mount namespace and port 53)::

    python benchmarks/slow_save.py                      # 3 jobs, ~2 minutes
    python benchmarks/slow_save.py --n 5 --answer-after 1.5 --out /tmp/save

Results go to ``--out`` + ``.md`` (default ``benchmarks/results/slow-save``).

Each job is ``benchmarks/_first_save_job.py`` (2 ranks, a ``Checkpointer`` saving every 5
of 20 steps, split across the ranks) under ``tests/slow_resolver.py --answer-after S``,
where every new store connection takes 2 S (c10d's reverse lookups at both ends). A
split save's writers report their parts on the job's store: through a connection opened
for them at the first save, on the main thread, or through one open since the job began
(``tether/checkpoint.py``, ``_write_part``). The figures: the first save's step (step 5),
and the slowest and the median of the other 19 steps, in seconds, rank 0's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

FIRST_SAVE = 5  # the job's first periodic save comes at this step


def job(answer_after: float) -> tuple[list[float] | None, float, str]:
    """One job: (rank 0's step times or None, the job's wall time, what went wrong)."""
    import _proc
    from slow_wakes import events, late_resolver

    with tempfile.TemporaryDirectory() as dirname:
        command = [*late_resolver(answer_after), sys.executable, str(HERE / "_first_save_job.py"), dirname]
        done = _proc.run(command, bound=180.0)
    steps = events(done.stdout + done.stderr).get("steps")
    wall = done.exited - done.started
    if done.returncode != 0 or steps is None or done.leftovers:
        return None, wall, f"exit {done.returncode}, left {done.leftovers}: {done.stderr[-300:]!r}"
    return [float(s) for s in steps["seconds"]], wall, ""  # type: ignore[union-attr]


def main() -> None:
    import _proc

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=3, help="jobs (default 3)")
    parser.add_argument("--answer-after", type=float, default=1.5, help="the resolver's delay, seconds (default 1.5)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "slow-save", help="markdown copy")
    args = parser.parse_args()
    library = [_proc.library_state()]
    rows = ["| job | first save's step (s) | slowest other step (s) | median other step (s) | wall (s) |"]
    rows.append("|---|---|---|---|---|")
    for n in range(1, args.n + 1):
        steps, wall, wrong = job(args.answer_after)
        if steps is None:
            rows.append(f"| {n} | failed: {wrong} | | | {wall:.0f} |")
            continue
        others = steps[: FIRST_SAVE - 1] + steps[FIRST_SAVE:]
        rows.append(
            f"| {n} | {steps[FIRST_SAVE - 1]:.3f} | {max(others):.3f} | {statistics.median(others):.3f} | {wall:.0f} |"
        )
    library.append(_proc.library_state())
    setup = (
        f"`benchmarks/_first_save_job.py` under `tests/slow_resolver.py --answer-after {args.answer_after:g}` "
        f"(a new store connection: {2 * args.answer_after:g} s), {args.n} jobs."
    )
    title = "The first periodic save's step, when new connections are slow"
    _proc.report(args.out, title, setup, library, ["\n".join(rows)])


if __name__ == "__main__":
    main()
