"""Bad input inside a job: every rank must raise the same error, before any wait.

argv: LAUNCHER NPROC (see core_common.py). Each rank makes every bad call of ``CASES``,
catches what it raises, and prints ``BAD {"rank": r, "errors": [[name, type, message],
...], "sum": all_reduce(1)}``: the final all_reduce proves that no rank diverged into a
wait. Then every rank calls ``one_rank_first(rank=7)`` (out of range at 4 ranks) without
catching it, so the job fails with that ValueError on every rank.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
from core_common import emit, launch, parse_params

import tether as idist


def first(**kw: Any) -> None:
    with idist.one_rank_first(**kw):
        pass


def only(rank: int) -> None:
    idist.one_rank_only(rank=rank, with_barrier=True)(lambda: None)()


CASES: list[tuple[str, Callable[[], Any]]] = [
    ("one_rank_first(rank=7)", lambda: first(rank=7)),
    ("one_rank_first(rank=-1)", lambda: first(rank=-1)),
    ("one_rank_first(rank='0')", lambda: first(rank="0")),
    ("one_rank_first(rank=1.0)", lambda: first(rank=1.0)),
    ("one_rank_first(rank=4, local=True)", lambda: first(rank=4, local=True)),
    ("one_rank_first(timeout=0)", lambda: first(timeout=0)),
    ("one_rank_only(rank=4)", lambda: only(4)),
    ("barrier(timeout=-1)", lambda: idist.barrier(timeout=-1)),
    ("barrier(group=[0, 7])", lambda: idist.barrier(group=[0, 7])),
    ("all_reduce('abc')", lambda: idist.all_reduce("abc")),  # type: ignore[arg-type]
    ("all_reduce(op='MEAN')", lambda: idist.all_reduce(1, op="MEAN")),
    ("all_reduce(group='abc')", lambda: idist.all_reduce(1, group="abc")),
    ("all_reduce(timeout=0)", lambda: idist.all_reduce(1, timeout=0)),
    ("all_gather(group=[9])", lambda: idist.all_gather(1, group=[9])),
    (
        "all_gather_tensors_with_shapes(3 shapes)",
        lambda: idist.all_gather_tensors_with_shapes(torch.zeros(1), [[1]] * 3),
    ),
    ("all_gather_tensors_with_shapes(list)", lambda: idist.all_gather_tensors_with_shapes([1], [[1]] * 4)),  # type: ignore[arg-type]
    ("broadcast([1, 2])", lambda: idist.broadcast([1, 2])),  # type: ignore[arg-type]
    ("broadcast(src=4)", lambda: idist.broadcast(1, src=4)),
    ("broadcast(src='0')", lambda: idist.broadcast(1, src="0")),  # type: ignore[arg-type]
    ("new_group([0, 9])", lambda: idist.new_group([0, 9])),
]


def body(local_rank: int, params: dict[str, Any]) -> None:
    state = params["_state"]
    errors = []
    for name, call in CASES:
        state["phase"] = name
        try:
            call()
        except Exception as exc:
            errors.append([name, type(exc).__name__, str(exc)])
        else:
            errors.append([name, None, "no error"])
    state["phase"] = "all_reduce"
    total = idist.all_reduce(1)
    emit("BAD", {"rank": idist.get_rank(), "errors": errors, "sum": total})
    idist.barrier()  # every rank has reported before any raises below (else a slow rank's sync sees it first)
    state["phase"] = "one_rank_first(rank=7) uncaught"
    with idist.one_rank_first(rank=7):
        state["phase"] = "block"


if __name__ == "__main__":
    launcher, nproc, params = parse_params(sys.argv[1:])
    launch(launcher, nproc, params)
