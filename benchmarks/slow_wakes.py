"""How late a wait on a user's store hears a peer's failure when new connections are slow.

Usage (root: the slow resolver's mount namespace and port 53)::

    python benchmarks/slow_wakes.py                      # 3 jobs a store, ~4 minutes
    python benchmarks/slow_wakes.py --n 5 --answer-after 1.5 --out /tmp/wakes

Results go to ``--out`` + ``.md`` (default ``benchmarks/results/slow-wakes``).

Each job is ``tests/jobs/store_waits.py raise STORE OP`` (``tether.spawn``, 2 ranks):
rank 0 waits on STORE (``default``: torch's default store, with ``get``; ``job``: a
TCPStore client of ``MASTER_ADDR:MASTER_PORT``, the launcher's store, with ``wait``;
``own``: a TCPStore rank 0 hosts, with ``multi_get``) for a key; rank 1 raises 0.5 s
later. It runs under ``tests/slow_resolver.py --answer-after S``, where every reverse
lookup is answered S seconds late, so every new store connection takes 2 S (c10d looks
up both ends). The figure is the notice: rank 0's
``PeerFailure``, less rank 1's strike, both ``time.time()`` on one host. A wake that
needs a new connection opened from the wait (``tether/_core/storewaits.py``: ``own``;
before 16239e9, every store) cannot come before it opens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

STORES = ("default", "job", "own")
OPS = {"default": "get", "job": "wait", "own": "multi_get"}


def events(text: str) -> dict[str, dict[str, object]]:
    """The job's lifecycle lines (``LC {json}``), by event."""
    found = {}
    for line in text.splitlines():
        if line.startswith("LC "):
            event = json.loads(line[3:])
            found[str(event["event"])] = event
    return found


def late_resolver(answer_after: float) -> list[str]:
    """The command prefix that runs a command under ``tests/slow_resolver.py --answer-after``."""
    return [sys.executable, str(HERE.parent / "tests" / "slow_resolver.py"), "--answer-after", str(answer_after)]


def job(store: str, answer_after: float) -> tuple[float | None, float, str]:
    """One job: (notice in seconds or None, the job's wall time, what rank 0 raised)."""
    import _proc

    script = [sys.executable, str(HERE.parent / "tests" / "jobs" / "store_waits.py"), "raise", store, OPS[store]]
    # PYTHONPATH, where set, picks the tether measured
    done = _proc.run([*late_resolver(answer_after), *script], bound=180.0)
    seen = events(done.stdout + done.stderr)
    strike, raised = seen.get("strike"), seen.get("raised")
    wall = done.exited - done.started
    if strike is None or raised is None or done.leftovers:
        return None, wall, f"exit {done.returncode}, events {sorted(seen)}, left {done.leftovers}"
    notice = float(raised["time"]) - float(strike["time"])  # type: ignore[arg-type]
    return notice, wall, str(raised["exc"])


def main() -> None:
    import _proc

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=3, help="jobs a store (default 3)")
    parser.add_argument("--answer-after", type=float, default=1.5, help="the resolver's delay, seconds (default 1.5)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "slow-wakes", help="markdown copy")
    args = parser.parse_args()
    library = [_proc.library_state()]
    rows = ["| store | notice, each job (s) | median | rank 0 raised | job's wall time (s) |", "|---|---|---|---|---|"]
    for store in STORES:
        runs = [job(store, args.answer_after) for _ in range(args.n)]
        notices = [n for n, _, _ in runs if n is not None]
        cells = ", ".join("failed" if n is None else f"{n:.3f}" for n, _, _ in runs)
        median = f"{statistics.median(notices):.3f}" if notices else "-"
        raised = ", ".join(sorted({what for _, _, what in runs}))
        walls = ", ".join(f"{w:.0f}" for _, w, _ in runs)
        rows.append(f"| {store} | {cells} | {median} | {raised} | {walls} |")
    library.append(_proc.library_state())
    setup = (
        f"`tests/jobs/store_waits.py raise STORE OP` under `tests/slow_resolver.py --answer-after "
        f"{args.answer_after:g}` (a new store connection: {2 * args.answer_after:g} s), {args.n} jobs a store."
    )
    _proc.report(args.out, "A wake on a user's store, when new connections are slow", setup, library, ["\n".join(rows)])


if __name__ == "__main__":
    main()
