"""What tether's wrapper of the functional collectives' wait costs: ``funcol.wait_tensor`` with and without it.

Usage::

    python benchmarks/funcol_wait.py                  # 2 and 4 ranks
    python benchmarks/funcol_wait.py --ranks 2 --rounds 5

One torchrun job per world size; each rank calls ``tether.initialize("gloo")`` and uses
one torch thread. While tether runs, the module global ``wait_tensor`` of
``torch.distributed._functional_collectives`` ("funcol"), where DTensor's ops and every
``AsyncCollectiveTensor`` wait, is tether's wrapper (``_core/funcol.py``): this rank's
whereabouts named, then torch's function (``wait_tensor.__wrapped__``). Contenders, in
the same processes, each making ``--per`` calls of ``funcol.all_reduce(t, "sum",
dist.group.WORLD).wait()`` in a row per round, on a 1-element and on a 1 MiB (262144
values) float32 tensor:

* ``torch``: the module's ``wait_tensor`` put back to torch's own for the batch, as
  without tether;
* ``tether``: the wrapper in place.

A third pair times ``funcol.wait_tensor`` alone on a tensor whose all-reduce finished
(torch returns at once): the wrapper's own cost per wait, which the collectives' noise
hides.

Each round runs the four batches (2 contenders x 2 sizes) in an order shuffled the same
way on every rank, each behind an untimed ``dist.barrier()``, after one untimed call of
each. A batch's figure is the slowest rank's time divided by ``--per``, in µs per call
(the all-reduce's issue and its wait); the table gives the median over rounds with its
interquartile range, and the ratio tether/torch is the median of the per-round ratios
(same size, same round) with their quartiles. Writes ``--out`` (default
``benchmarks/results/funcol-wait.md``).
"""

from __future__ import annotations

import contextlib
import json
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

CONTENDERS = ("torch", "tether")
SIZES = {"1 element": 1, "1 MiB": 262144}  # float32 values
WAIT_ONLY = "none: the wait alone"  # funcol.wait_tensor on a tensor whose collective finished: the wrapper's own cost
ROWS = (*SIZES, WAIT_ONLY)


def row(name: str, size: str) -> str:
    return f"{name}, {size}"


def worker(rounds: int, per: int) -> None:
    import torch
    import torch.distributed as dist

    import tether
    from tether._core import funcol as wrapping

    torch.set_num_threads(1)
    tether.initialize("gloo")
    import torch.distributed._functional_collectives as funcol  # imported after the start: wrapped on import

    wrapper = funcol.wait_tensor
    if wrapper not in wrapping._wrappers:
        raise SystemExit(f"funcol.wait_tensor is not tether's wrapper: {wrapper!r}")
    original = wrapper.__wrapped__  # type: ignore[attr-defined]  # functools.wraps sets it
    group = dist.group.WORLD
    assert isinstance(group, dist.ProcessGroup)
    rank, world = tether.get_rank(), tether.get_world_size()
    tensors = {size: torch.ones(values, dtype=torch.float32) for size, values in SIZES.items()}
    tensors[WAIT_ONLY] = funcol.all_reduce(torch.ones(1), "sum", group).wait()

    @contextlib.contextmanager
    def waiting(name: str) -> Iterator[None]:
        """The module's ``wait_tensor`` as ``name`` has it, for the batch."""
        if name == "torch":
            funcol.wait_tensor = original
        try:
            yield
        finally:
            funcol.wait_tensor = wrapper

    def batch(t: torch.Tensor, calls: int) -> None:
        if t is tensors[WAIT_ONLY]:
            for _ in range(calls):
                funcol.wait_tensor(t)
            return
        for _ in range(calls):
            funcol.all_reduce(t, "sum", group).wait()

    for size in ROWS:  # warm-up: one of each
        for name in CONTENDERS:
            with waiting(name):
                batch(tensors[size], 1)
    us: dict[str, list[float]] = {row(name, size): [] for size in ROWS for name in CONTENDERS}
    order = [(name, size) for size in ROWS for name in CONTENDERS]
    shuffle = random.Random(0)  # the same order on every rank
    for _ in range(rounds):
        shuffle.shuffle(order)
        for name, size in order:
            with waiting(name):
                dist.barrier()
                start = time.perf_counter()
                batch(tensors[size], per)
                took = time.perf_counter() - start
            slowest = max(tether.all_gather(took))
            us[row(name, size)].append(slowest / per * 1e6)
    if funcol.wait_tensor is not wrapper:
        raise SystemExit("funcol.wait_tensor was not put back")
    if rank == 0:
        print("RESULT " + json.dumps({"world": world, "us": us}), flush=True)
    tether.finalize()


def body(results: list[dict[str, Any]], rounds: int, per: int) -> list[str]:
    import _proc

    lines = [
        f'µs per `funcol.all_reduce(t, "sum", dist.group.WORLD).wait()`, median of {rounds} rounds of {per} in '
        "a row (slowest rank per round; IQR = interquartile range in % of the median); ratio = median of the "
        "per-round ratios to torch's at the same size, with their quartiles.",
        "",
        "| contender | tensor | " + " | ".join(f"{r['world']} ranks µs (IQR %) | ratio (IQR)" for r in results) + " |",
        "|---|---|" + "---|---|" * len(results),
    ]
    for size in ROWS:
        for name in CONTENDERS:
            cells = []
            for res in results:
                us: dict[str, list[float]] = res["us"]
                digits = 2 if size == WAIT_ONLY else 1
                cells.append(_proc.ratio_cells(us[row(name, size)], us[row("torch", size)], digits, name == "torch"))
            lines.append(f"| {name} | {size} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    import _proc

    _proc.rounds_main(
        __doc__,
        __file__,
        "tether's wrapper of the functional collectives' wait: benchmark",
        (200, "calls in a row per contender, size and round"),
        HERE / "results" / "funcol-wait.md",
        worker,
        body,
        lambda rounds, per: 120 + rounds * per * 0.05,
    )


if __name__ == "__main__":
    main()
