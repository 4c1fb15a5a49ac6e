"""What a small exchange between two DDP steps costs the next step: the C library's heap trim.

Usage::

    python benchmarks/between_steps.py                 # 2 ranks, both tables, ~15 minutes
    python benchmarks/between_steps.py --tables loops --out /tmp/between

Results go to ``--out`` + ``.md`` (default ``benchmarks/results/between-steps``).

Found while reading ``checkpoint_step.py``'s cost on 2 ranks: the step after a periodic save
took ~20 ms more, and not for the save. With the save itself made a no-op, the step after
the save step still cost that much, and so did an ``all_gather`` of a small object alone
between two steps. A step of the ~100 MB model under tether's DDP guard reuses its memory
(no minor page fault in a step: the ``none`` rows); after a few small allocations
between the steps, glibc's ``free`` can give the ~100 MB freed at the
top of its heap back to the system (its trim threshold), and the next step faults those
pages in again. "No fault" holds for the median step of some jobs, not every step nor
every job: with nothing exchanged, 30-82 of 130 guarded steps faulted 4 MiB or more, and
in some jobs the median step too (the second table; ``results/between-steps-loops*.md``).

Each job is torchrun, 2 ranks, gloo, one thread per rank: the model of ``checkpoint_step.py``
(six ``Linear(2048, 2048)``, 25.2M float32 parameters) under ``tether.auto_model``, SGD,
150 steps; after every 10th step's ``optimizer.step()`` the rank makes one exchange:

* ``none``: nothing;
* ``state``: it only reads its random states, a bool and its pid into a tuple (the
  object the next two exchange; a few small allocations);
* ``all_gather``: ``tether.all_gather`` of this process's random states, a bool and its
  pid, what ``Checkpointer`` gathers before a periodic save;
* ``store``: the same object through the job's store (each rank sets it, then gets every
  rank's): no collective at all;
* ``barrier``: ``tether.barrier()`` (a store gate).

Rank 0 times each step's forward and backward and counts the process's minor page faults
in them (``getrusage``); the figures are medians over the steps after the first 20: the
steps right after an exchange against all other steps but the exchange's own. Every
variant runs twice: with glibc's defaults, and with ``MALLOC_MMAP_THRESHOLD_=33554432
MALLOC_TRIM_THRESHOLD_=1073741824`` in the ranks' environment (large blocks from the heap,
and no trim: the process keeps the memory it freed), a setting of the user's process,
not tether's.

The second table (``--tables loops``) exchanges nothing and varies the loop instead: the
one above, one that keeps its loss and reads ``loss.item()`` after the optimizer step (a
loop that logs), and that with each batch from a shuffled ``DataLoader``; each under
tether's guard and under plain ``DistributedDataParallel``. It reads whether a real loop's
own allocations between steps already undo the guard's reuse of its memory.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import resource
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

MODES = ("none", "state", "all_gather", "store", "barrier")
LOOPS = ("fixed", "loss kept", "loader")
FAULTING = 1024  # minor faults in one step's forward and backward: 4 MiB of pages
NO_TRIM = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "1073741824"}
STEPS, EVERY, SKIP = 150, 10, 20


def worker(mode: str, loop: str = "fixed", ddp: str = "guard") -> None:
    import torch
    import torch.distributed as dist

    import _proc
    import tether
    from tether import _randomness

    torch.set_num_threads(1)
    tether.initialize("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()
    torch.manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(6)])
    model = tether.auto_model(net) if ddp == "guard" else torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    batches = _proc.batches(loop == "loader")

    def exchange(step: int) -> None:
        if mode in ("none", "barrier"):
            if mode == "barrier":
                tether.barrier()
            return
        mine = (_randomness.state(), True, os.getpid())
        if mode == "all_gather":
            tether.all_gather(mine)
        elif mode == "store":
            store.set(f"between/{step}/{rank}", pickle.dumps(mine))
            [pickle.loads(store.get(f"between/{step}/{r}")) for r in range(world)]

    steps = []
    for step in range(STEPS):
        x = next(batches)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        if loop == "fixed":
            model(x).square().mean().backward()
        else:
            loss = model(x).square().mean()
            loss.backward()
        took = time.perf_counter() - start
        steps.append((step, took * 1e3, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults))
        opt.step()
        opt.zero_grad()
        if loop != "fixed":
            loss.item()  # what a loop that logs its loss reads
        if step % EVERY == 0:
            exchange(step)
    if rank == 0:
        after = [s for s in steps[SKIP:] if s[0] % EVERY == 1]
        other = [s for s in steps[SKIP:] if s[0] % EVERY not in (0, 1)]
        result = {
            "after_ms": statistics.median(s[1] for s in after),
            "other_ms": statistics.median(s[1] for s in other),
            "after_faults": statistics.median(s[2] for s in after),
            "other_faults": statistics.median(s[2] for s in other),
            "all_ms": statistics.median(s[1] for s in steps[SKIP:]),
            "all_faults": statistics.median(s[2] for s in steps[SKIP:]),
            "faulting": sum(1 for s in steps[SKIP:] if s[2] >= FAULTING),
        }
        print("RESULT " + json.dumps(result), flush=True)
    tether.finalize()


def job(mode: str, env: dict[str, str], loop: str = "fixed", ddp: str = "guard") -> dict[str, float]:
    import _proc

    return _proc.rank_job(2, __file__, [mode, "--loop", loop, "--ddp", ddp], 180.0, env=env)


def exchanges_table(jobs: int) -> list[str]:
    """Each exchange after every 10th step, with glibc's defaults and with no trim."""
    rows = [
        "ms of rank 0's forward and backward, and the process's minor page faults in them (medians over "
        f"steps {SKIP}-{STEPS - 1}): the steps right after an exchange against the other steps.",
        "",
        "| allocator | exchange | job | fwd+bwd after (ms) | others (ms) | difference (ms) | faults after | others |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for setting, env in (("glibc defaults", {}), ("no trim", NO_TRIM)):
        for mode in MODES:
            for k in range(jobs):
                r = job(mode, env)
                rows.append(
                    f"| {setting} | {mode} | {k + 1} | {r['after_ms']:.1f} | {r['other_ms']:.1f} | "
                    f"{r['after_ms'] - r['other_ms']:+.1f} | {r['after_faults']:.0f} | {r['other_faults']:.0f} |"
                )
    return rows


def loops_table(jobs: int) -> list[str]:
    """With nothing exchanged: how often a step faults, by the loop's shape, guarded and plain."""
    rows = [
        f"With nothing between the steps, by the loop's shape (glibc defaults): rank 0's forward and backward, "
        f"median ms and minor page faults over steps {SKIP}-{STEPS - 1}, and how many of those "
        f"{STEPS - SKIP} steps took {FAULTING} faults or more (4 MiB of pages). *fixed*: the loop above; "
        "*loss kept*: `loss = ...; loss.backward()`, and `loss.item()` after the optimizer step, as a loop "
        "that logs does; *loader*: that, each step's batch from a shuffled `DataLoader` (8 rows of a 32 MiB "
        "dataset). *guard*: `tether.auto_model`; *plain*: `DistributedDataParallel` with no hook.",
        "",
        "| loop | DDP | job | ms | faults | steps faulting |",
        "|---|---|---|---|---|---|",
    ]
    for loop in LOOPS:
        for ddp in ("guard", "plain"):
            for k in range(jobs):
                r = job("none", {}, loop, ddp)
                rows.append(
                    f"| {loop} | {ddp} | {k + 1} | {r['all_ms']:.1f} | {r['all_faults']:.0f} | "
                    f"{r['faulting']} of {STEPS - SKIP} |"
                )
    return rows


def main() -> None:
    import _proc

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="jobs a row of either table (default 2)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "between-steps", help="markdown copy")
    _proc.add_driver_options(parser, each="run")
    parser.add_argument(
        "--tables", choices=("exchanges", "loops", "both"), default="both", help="which tables to measure"
    )
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--loop", default="fixed", help=argparse.SUPPRESS)
    parser.add_argument("--ddp", default="guard", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.loop, args.ddp)
        return
    _proc.exit_on_sigterm(ignore=args.ignore_sigterm)
    library = [_proc.library_state()]
    quiet = _proc.wait_for_load(args.wait_load, up_to=args.wait_max, what="the run")
    tables = [exchanges_table(args.jobs)] if args.tables != "loops" else []
    if args.tables != "exchanges":
        tables.append(loops_table(args.jobs))
    library.append(_proc.library_state())
    setup = f"torchrun, 2 ranks, gloo, one thread per rank. Load before the run: {quiet.describe()}."
    body = [*([args.note] if args.note else []), *("\n".join(rows) for rows in tables)]
    _proc.report(args.out, "A small exchange between DDP steps, and the next step", setup, library, body)


if __name__ == "__main__":
    main()
