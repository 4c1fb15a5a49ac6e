"""What tether's gate before a group's creation costs: ``dist.new_group`` with and without it.

Usage::

    python benchmarks/group_gate.py                  # 2 and 4 ranks, ~1-2 minutes
    python benchmarks/group_gate.py --ranks 2 --rounds 5

One torchrun job per world size; each rank calls ``tether.initialize("gloo")``. While tether
runs, ``dist.new_group`` is its wrapper: the members' store gate (``_core/making.py``),
then torch's function, named as a raw call (``rawcalls.py``). Contenders, in the same
processes, each making ``--per`` groups of every rank in a row per round:

* ``torch``: torch's own ``new_group`` (``rawcalls._originals``) over torch's own
  ``_new_group_with_tag`` (tether gates that one too: it is put back for the call), as
  without tether;
* ``tether``: ``dist.new_group``, the wrapper;
* ``gate alone``: the gate the wrapper passes first (``making.arrive``), without a creation.

Each round runs them in an order shuffled the same way on every rank, each behind an
untimed ``dist.barrier()``; the groups made are destroyed after their batch, untimed. A
batch's figure is the slowest rank's time divided by ``--per``; the table gives the median
over rounds with its interquartile range, and the ratio tether/torch is the median of the
per-round ratios with their quartiles. Writes ``--out`` (default
``benchmarks/results/group-gate.md``).
"""

from __future__ import annotations

import inspect
import json
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

CONTENDERS = ("torch", "tether", "gate alone")


def worker(rounds: int, per: int) -> None:
    import torch
    import torch.distributed as dist

    import tether
    from tether._core import making, rawcalls

    torch.set_num_threads(1)
    tether.initialize("gloo")
    rank, everyone = tether.get_rank(), list(range(tether.get_world_size()))
    original = rawcalls._originals["new_group"]
    signature = inspect.signature(original)
    c10d = dist.distributed_c10d
    gated, inner = c10d._new_group_with_tag, rawcalls._originals["_new_group_with_tag"]
    made: list[object] = []

    def plain() -> None:
        # torch's new_group calls c10d._new_group_with_tag, which tether gates too (for the
        # groups torch's own modules make): the baseline calls torch's, as without tether
        c10d._new_group_with_tag = inner
        try:
            made.append(original(everyone))
        finally:
            c10d._new_group_with_tag = gated

    run = {
        "torch": plain,
        "tether": lambda: made.append(dist.new_group(everyone)),
        "gate alone": lambda: making.arrive("new_group", signature, (everyone,), {}),
    }
    for name in CONTENDERS:  # warm-up: one of each
        run[name]()
    ms: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    order = list(CONTENDERS)
    shuffle = random.Random(0)  # the same order on every rank
    for _ in range(rounds):
        shuffle.shuffle(order)
        for name in order:
            dist.barrier()
            start = time.perf_counter()
            for _ in range(per):
                run[name]()
            took = time.perf_counter() - start
            slowest = max(tether.all_gather(took))
            ms[name].append(slowest / per * 1e3)
            for group in made:
                dist.destroy_process_group(group)
            made.clear()
    if rank == 0:
        print("RESULT " + json.dumps({"world": len(everyone), "ms": ms}), flush=True)
    tether.finalize()


def body(results: list[dict[str, object]], rounds: int, per: int) -> list[str]:
    import _proc

    lines = [
        f"ms per group of every rank made, median of {rounds} rounds of {per} in a row (slowest rank per "
        "round; IQR = interquartile range in % of the median); ratio = median of the per-round ratios to "
        "torch's, with their quartiles.",
        "",
        "| contender | " + " | ".join(f"{r['world']} ranks ms (IQR %) | ratio (IQR)" for r in results) + " |",
        "|---|" + "---|---|" * len(results),
    ]
    for name in CONTENDERS:
        cells = []
        for res in results:
            ms: dict[str, list[float]] = res["ms"]  # type: ignore[assignment]
            cells.append(_proc.ratio_cells(ms[name], ms["torch"], 2, name == "torch"))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    import _proc

    _proc.rounds_main(
        __doc__,
        __file__,
        "The gate before a group's creation: benchmark",
        (10, "groups made in a row per contender and round"),
        HERE / "results" / "group-gate.md",
        worker,
        body,
        lambda rounds, per: 120 + 2 * rounds * per,
    )


if __name__ == "__main__":
    main()
