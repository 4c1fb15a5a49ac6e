"""Every collective and type, one round trip each, in one job.

argv: LAUNCHER NPROC [check=true] (see core_common.py; ``check=true``: with
``check_collectives``, every call's data travels with or after the check). Each rank
runs every check, collects the mismatches instead of stopping at the first, and prints
one RESULT line with ``checks`` (how many ran) and ``errors`` (what differed: name, got,
expected).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import torch
from core_common import emit, launch, parse_params

import tether as idist


class Checks:
    def __init__(self) -> None:
        self.count = 0
        self.errors: list[str] = []

    def eq(self, name: str, got: Any, expected: Any, kind: type | None = None) -> None:
        self.count += 1
        if isinstance(expected, torch.Tensor):
            ok = (
                isinstance(got, torch.Tensor)
                and got.dtype == expected.dtype
                and got.shape == expected.shape
                and bool(torch.equal(got, expected))
            )
        else:
            ok = got == expected and (kind is None or type(got) is kind)
        if not ok:
            self.errors.append(f"{name}: got {got!r} ({type(got).__name__}), expected {expected!r}")


def body(local_rank: int, params: dict[str, Any]) -> None:
    state = params["_state"]
    c = Checks()
    r, w = idist.get_rank(), idist.get_world_size()
    state["phase"] = "info"
    c.eq("local_rank", local_rank, idist.get_local_rank())
    c.eq("nproc_per_node", idist.get_nproc_per_node(), w)
    c.eq("nnodes", idist.get_nnodes(), 1)
    c.eq("node_rank", idist.get_node_rank(), 0)
    c.eq("backend", idist.backend(), "gloo")
    c.eq("model_name", idist.model_name(), "native-dist")
    c.eq("device", idist.device(), torch.device("cpu"))

    state["phase"] = "all_reduce"
    t = torch.tensor([r + 1.0, 2.0])
    out = idist.all_reduce(t)
    c.eq("all_reduce tensor SUM", out, torch.tensor([w * (w + 1) / 2, 2.0 * w]))
    c.eq("all_reduce tensor in place", out is t, True)
    c.eq("all_reduce int SUM", idist.all_reduce(r + 1), w * (w + 1) // 2, int)
    c.eq("all_reduce float SUM", idist.all_reduce(0.5 * (r + 1)), 0.5 * w * (w + 1) / 2, float)
    c.eq("all_reduce int PRODUCT", idist.all_reduce(r + 1, "PRODUCT"), math.factorial(w), int)
    c.eq("all_reduce float PRODUCT", idist.all_reduce(2.0, "PRODUCT"), 2.0**w, float)
    c.eq("all_reduce int MIN", idist.all_reduce(r + 5, "MIN"), 5, int)
    c.eq("all_reduce int MAX", idist.all_reduce(r, "MAX"), w - 1, int)
    c.eq("all_reduce float MIN", idist.all_reduce(r - 0.25, "MIN"), -0.25, float)
    c.eq("all_reduce float MAX", idist.all_reduce(r + 0.75, "MAX"), w - 0.25, float)
    c.eq("all_reduce tensor MAX", idist.all_reduce(torch.tensor([r, -r]), "MAX"), torch.tensor([w - 1, 0]))
    c.eq("all_reduce tensor MIN", idist.all_reduce(torch.tensor([r, -r]), "MIN"), torch.tensor([0, -(w - 1)]))
    bits = 0b110000 | (1 << r)
    c.eq("all_reduce int AND", idist.all_reduce(bits, "AND"), 0b110000, int)
    c.eq("all_reduce int OR", idist.all_reduce(bits, "OR"), 0b110000 | ((1 << w) - 1), int)
    c.eq(
        "all_reduce tensor AND",
        idist.all_reduce(torch.tensor([bits, 0b1111]), "AND"),
        torch.tensor([0b110000, 0b1111]),
    )
    c.eq(
        "all_reduce tensor OR",
        idist.all_reduce(torch.tensor([bits, 0]), "OR"),
        torch.tensor([0b110000 | ((1 << w) - 1), 0]),
    )
    c.eq(
        "all_reduce float64 tensor",
        idist.all_reduce(torch.tensor([0.1], dtype=torch.float64)),
        torch.tensor([0.1 * w], dtype=torch.float64),
    )
    # groups: a list of ranks, and a ProcessGroup from new_group (every rank calls it)
    pair = [0, w - 1]
    expected = (0 + 1) + (w - 1 + 1) if r in pair else r + 1
    c.eq("all_reduce int SUM group=list", idist.all_reduce(r + 1, group=pair), expected, int)
    pg = idist.new_group(pair)
    c.eq("all_reduce int SUM group=new_group", idist.all_reduce(r + 1, group=pg), expected, int)
    got = idist.all_reduce(torch.tensor([float(r)]), "MAX", group=pair)
    c.eq("all_reduce tensor MAX group=list", got, torch.tensor([float(w - 1 if r in pair else r)]))
    first = list(range(w - 1))  # every rank but the last
    c.eq("all_reduce SUM group=first ranks", idist.all_reduce(1, group=first), w - 1 if r in first else 1, int)

    state["phase"] = "all_gather"
    c.eq(
        "all_gather tensor",
        idist.all_gather(torch.tensor([r, 10 * r])),
        torch.tensor([x for i in range(w) for x in (i, 10 * i)]),
    )
    c.eq("all_gather 0-d tensor", idist.all_gather(torch.tensor(float(r))), torch.arange(w, dtype=torch.float32))
    c.eq(
        "all_gather 2-d tensor",
        idist.all_gather(torch.full((1, 3), r)),
        torch.arange(w).repeat_interleave(3).reshape(w, 3),
    )
    # on both sides of the 4 KiB a check_collectives frame carries (1,024 vs 1,025 float32)
    for n in (1024, 1025):
        c.eq(
            f"all_gather {n} x float32",
            idist.all_gather(torch.full((n,), 0.1 * (r + 1))),
            torch.cat([torch.full((n,), 0.1 * (i + 1)) for i in range(w)]),
        )
    c.eq(
        "all_gather bool tensor",
        idist.all_gather(torch.tensor([r % 2 == 0])),
        torch.tensor([i % 2 == 0 for i in range(w)]),
    )
    c.eq("all_gather empty tensor", idist.all_gather(torch.zeros(0, 3)), torch.zeros(0, 3))
    c.eq("all_gather int", idist.all_gather(r), list(range(w)))
    c.eq("all_gather big int", idist.all_gather(2**60 + r), [2**60 + i for i in range(w)])
    c.eq("all_gather float", idist.all_gather(r + 0.5), [i + 0.5 for i in range(w)])
    c.eq("all_gather str", idist.all_gather("é" * r), ["é" * i for i in range(w)])
    # strs and objects travel in frames of min(16 KiB, 64 KiB / world) bytes (8 of them the
    # length): one collective when every rank's bytes fit, two when one rank's do not
    room = min(16384, 65536 // w) - 8
    c.eq(
        "all_gather str filling the frame", idist.all_gather(chr(97 + r) * room), [chr(97 + i) * room for i in range(w)]
    )
    over = [room + (i == 1) for i in range(w)]  # rank 1's is one byte too long for its frame
    c.eq(
        "all_gather str one byte over",
        idist.all_gather(chr(97 + r) * over[r]),
        [chr(97 + i) * over[i] for i in range(w)],
    )
    c.eq("all_gather big object", idist.all_gather(list(range(3000 * r))), [list(range(3000 * i)) for i in range(w)])
    c.eq(
        "all_gather dict",
        idist.all_gather({"rank": r, "name": f"n{r}"}),
        [{"rank": i, "name": f"n{i}"} for i in range(w)],
    )
    c.eq(
        "all_gather int group=list",
        idist.all_gather(r, group=pair),
        pair if r in pair else r,
    )
    c.eq(
        "all_gather tensor group=new_group",
        idist.all_gather(torch.tensor([r]), group=pg),
        torch.tensor(pair) if r in pair else torch.tensor([r]),
    )
    shapes = [[i + 1, 2] for i in range(w)]
    pieces = idist.all_gather_tensors_with_shapes(torch.full((r + 1, 2), r), shapes)
    c.eq("all_gather_tensors_with_shapes count", len(pieces), w)
    for i, piece in enumerate(pieces):
        c.eq(f"all_gather_tensors_with_shapes[{i}]", piece, torch.full((i + 1, 2), i))
    # every rank calls a sync with group=list (tether makes the group on first use, and
    # torch's new_group needs every rank); a rank outside the group gets its input back
    mine = torch.full((r + 1,), float(r))
    sub = idist.all_gather_tensors_with_shapes(mine, [[1], [w]], group=pair)
    expected_sub = [[0.0], [float(w - 1)] * w] if r in pair else [mine.tolist()]
    c.eq("all_gather_tensors_with_shapes group=list", [p.tolist() for p in sub], expected_sub)

    state["phase"] = "broadcast"
    src = w - 1
    is_src = r == src
    c.eq(
        "broadcast tensor",
        idist.broadcast(torch.tensor([1.5, 2.5]) if is_src else torch.zeros(2), src=src),
        torch.tensor([1.5, 2.5]),
    )
    c.eq(
        "broadcast int64 tensor",
        idist.broadcast(torch.tensor([2**60 + 1]) if r == 0 else torch.zeros(1, dtype=torch.int64)),
        torch.tensor([2**60 + 1]),
    )
    for n in (1024, 1025):
        c.eq(
            f"broadcast {n} x float32",
            idist.broadcast(torch.full((n,), 0.1) if is_src else torch.zeros(n), src=src),
            torch.full((n,), 0.1),
        )
    c.eq(
        "broadcast complex 0-d tensor",
        idist.broadcast(torch.tensor(0.1 + 0.2j) if is_src else torch.tensor(0j), src=src),
        torch.tensor(0.1 + 0.2j),
    )
    c.eq("broadcast big int", idist.broadcast(2**60 + 1 if r == 0 else 0), 2**60 + 1, int)
    c.eq("broadcast negative int", idist.broadcast(-7 if is_src else 0, src=src), -7, int)
    c.eq("broadcast float", idist.broadcast(0.1 + 0.2 if r == 0 else 0.0), 0.1 + 0.2, float)
    c.eq("broadcast str", idist.broadcast("héllo wörld" if r == 0 else ""), "héllo wörld", str)
    c.eq("broadcast empty str", idist.broadcast("" if r == 0 else "xyz"), "", str)
    for n in (16384 - 8, 16384 - 7):  # a broadcast's frame: 16 KiB, 8 bytes of them the length
        c.eq(
            f"broadcast str of {n} bytes",
            idist.broadcast("é" * (n // 2) + "x" * (n % 2) if r == 0 else "y"),
            "é" * (n // 2) + "x" * (n % 2),
            str,
        )
        long = "z" * n
        c.eq(
            f"broadcast safe_mode str of {n} bytes",
            idist.broadcast(long if is_src else None, src=src, safe_mode=True),
            long,
            str,
        )
    c.eq(
        "broadcast Path",
        idist.broadcast(Path("/tmp/a b/c.txt") if is_src else Path("."), src=src),
        Path("/tmp/a b/c.txt"),
    )
    c.eq(
        "broadcast safe_mode tensor",
        idist.broadcast(torch.arange(6).reshape(2, 3) if r == 0 else None, safe_mode=True),
        torch.arange(6).reshape(2, 3),
    )
    c.eq("broadcast safe_mode int", idist.broadcast(2**60 + 1 if r == 0 else None, safe_mode=True), 2**60 + 1, int)
    c.eq("broadcast safe_mode float", idist.broadcast(1.25 if is_src else None, src=src, safe_mode=True), 1.25, float)
    c.eq("broadcast safe_mode str", idist.broadcast("abc" if r == 0 else None, safe_mode=True), "abc", str)
    c.eq("broadcast safe_mode Path", idist.broadcast(Path("x/y") if r == 0 else None, safe_mode=True), Path("x/y"))
    c.eq(
        "broadcast group=list", idist.broadcast(42 if is_src else -1, src=src, group=pair), 42 if r in pair else -1, int
    )
    got = idist.broadcast("pg" if r == 0 else "", src=0, group=pg)
    c.eq("broadcast group=new_group", got, "pg" if r in pair else "", str)

    state["phase"] = "barrier"
    idist.barrier()
    idist.barrier(group=pair)
    idist.barrier(group=pg)
    idist.barrier(timeout=60)
    c.eq("after barriers", idist.all_reduce(1), w, int)

    state["phase"] = "done"
    emit("CHECKS", {"rank": r, "count": c.count, "errors": c.errors})


if __name__ == "__main__":
    launcher, nproc, params = parse_params(sys.argv[1:])
    launch(launcher, nproc, params, check_collectives=bool(params.get("check", False)))
