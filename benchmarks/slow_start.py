"""How a slow resolver slows a job's start, and the store's stall behind it.

Usage (root: the slow resolver's mount namespace and port 53)::

    python benchmarks/slow_start.py                            # ~3 minutes
    python benchmarks/slow_start.py --before /tmp/old --rounds 3 --answer-after 0.5

Results go to ``--out`` + ``.md`` (default ``benchmarks/results/slow-start``).

Everything runs under ``tests/slow_resolver.py --answer-after S``: every reverse lookup is
answered S seconds late. c10d looks up the peer's address of every new store connection
at both ends, and the server does it on the one thread that answers every client.

* **stall**: one process hosts a store, a thread makes ``set``/``get`` round trips on a
  connection opened before, and the main thread opens ``--clones`` new connections
  (``TCPStore.clone()``) one after another: each clone's time, and the slowest round trip
  of the other connection while they opened. Two servers: c10d's own listener (a
  dual-stack IPv6 socket: a loopback client arrives as ``::ffff:127.0.0.1``, which
  ``/etc/hosts`` does not name) and ``tether._core.stores.serve`` (an IPv4 socket of
  tether's, given to c10d: the client arrives as ``127.0.0.1``, named there).
* **start**: ``_startup_job.py`` (``startup.py``'s jobs: every rank joins a gloo group,
  passes one barrier, exits) for ``torch.multiprocessing.spawn`` + ``init_process_group``
  and ``tether.spawn``, at 2 and 4 ranks, round-robin; ``--before DIR`` adds
  ``tether.spawn`` from ``DIR/src`` (``git archive <commit> src | tar -x -C DIR``).
  Figure: *launch*, the seconds from just before the launch call to its return.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from slow_wakes import late_resolver  # noqa: E402
from startup import run_job  # noqa: E402

_STALL = """
import datetime, json, sys, threading, time
import torch.distributed as dist
from tether._core.stores import serve
timeout = datetime.timedelta(seconds=60)
if sys.argv[1] == "c10d":
    server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timeout, wait_for_workers=False)
else:
    server = serve("127.0.0.1", 0, 1, timeout)
other = server.clone()
stop, worst = threading.Event(), [0.0]
def trips():
    while not stop.is_set():
        t0 = time.perf_counter(); other.set("k", "v"); other.get("k")
        worst[0] = max(worst[0], time.perf_counter() - t0)
thread = threading.Thread(target=trips); thread.start()
clones = []
for _ in range(int(sys.argv[2])):
    t0 = time.perf_counter(); server.clone(); clones.append(time.perf_counter() - t0)
stop.set(); thread.join()
print("STALL " + json.dumps({"clones": clones, "worst_trip": worst[0]}), flush=True)
"""


def stall(listener: str, clones: int, answer_after: float) -> dict[str, object]:
    import _proc

    done = _proc.run([*late_resolver(answer_after), sys.executable, "-c", _STALL, listener, str(clones)], 300.0)
    lines = [line for line in done.stdout.splitlines() if line.startswith("STALL ")]
    if done.returncode != 0 or not lines:
        tail = (done.stdout + done.stderr)[-3000:]
        raise SystemExit(f"stall probe ({listener}) failed, exit {done.returncode}:\n{tail}")
    return dict(json.loads(lines[-1][6:]))


def start(contender: str, world: int, answer_after: float, src: Path | None) -> float:
    env = {"PYTHONPATH": str(src)} if src is not None else None
    launch, _ = run_job(contender, world, late_resolver(answer_after), env, bound=300.0)
    return launch


def main() -> None:
    import _proc

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--answer-after", type=float, default=0.2, help="the resolver's delay, seconds (default 0.2)")
    parser.add_argument("--clones", type=int, default=5, help="new connections in the stall probe (default 5)")
    parser.add_argument("--rounds", type=int, default=3, help="jobs of each contender and size (default 3)")
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--before", type=Path, help="a tree with an older src/tether, measured beside this one")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "slow-start", help="markdown copy")
    parser.add_argument("--note", default="", help="a sentence for the setup line (what --before holds)")
    args = parser.parse_args()
    library = [_proc.library_state()]
    rows = ["| server | each new connection (s) | slowest round trip meanwhile (s) |", "|---|---|---|"]
    for listener, label in (("c10d", "c10d's own listener (IPv6, dual-stack)"), ("tether", "`stores.serve` (IPv4)")):
        got = stall(listener, args.clones, args.answer_after)
        cells = ", ".join(f"{t:.3f}" for t in got["clones"])  # type: ignore[attr-defined]
        rows.append(f"| {label} | {cells} | {got['worst_trip']:.3f} |")
    contenders: list[tuple[str, str, Path | None]] = [
        ("torch", "torch.multiprocessing.spawn + init_process_group", None),
        ("tether", "tether.spawn (this tree)", None),
    ]
    if args.before is not None:
        contenders.append(("tether", f"tether.spawn ({args.before})", args.before / "src"))
    launches: dict[tuple[int, str], list[float]] = {}
    for world in args.worlds:
        for r in range(args.rounds):
            for name, label, src in contenders[r % len(contenders) :] + contenders[: r % len(contenders)]:
                launches.setdefault((world, label), []).append(start(name, world, args.answer_after, src))
            sys.stderr.write(f"[{world} ranks: round {r + 1} of {args.rounds} done]\n")
    starts = ["| ranks | contender | launch, each job (s) | median |", "|---|---|---|---|"]
    for (world, label), took in launches.items():
        starts.append(f"| {world} | {label} | {', '.join(f'{t:.2f}' for t in took)} | {statistics.median(took):.2f} |")
    library.append(_proc.library_state())
    setup = (
        f"everything under `tests/slow_resolver.py --answer-after {args.answer_after:g}` (each reverse lookup "
        f"answered {args.answer_after:g} s late)." + (f" {args.note}" if args.note else "")
    )
    body = [
        f"## A store's stall while {args.clones} clients connect, one after another\n\n" + "\n".join(rows),
        f"## A job's start, {args.rounds} rounds, round-robin\n\n" + "\n".join(starts),
    ]
    _proc.report(args.out, "A job's start when reverse lookups are slow", setup, library, body)


if __name__ == "__main__":
    main()
