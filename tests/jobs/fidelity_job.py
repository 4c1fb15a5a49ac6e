"""ignite's semantics in a real job: precision, in place, dtypes, groups, messages.

argv: LAUNCHER NPROC (see core_common.py; NPROC >= 3). Each rank runs every check,
collects what differed instead of stopping at the first, and prints one ``FIDELITY
{"rank": r, "count": n, "errors": [...]}`` line. Messages are checked with
``pytest.raises``/``pytest.warns`` and the very regular expressions of ignite 0.5.5's
own tests (``tests/ignite/distributed/utils/__init__.py``, ``test_auto.py``). Rank 0
then calls ``show_config()``; the test checks that its lines, and only rank 0's, reach
stderr.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from core_common import emit, launch, parse_params
from torch.utils.data import BatchSampler, DistributedSampler, SequentialSampler

import tether as idist

DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
]


class Checks:
    def __init__(self) -> None:
        self.count = 0
        self.errors: list[str] = []

    def eq(self, name: str, got: Any, expected: Any, kind: type | None = None) -> None:
        """``got == expected`` exactly: same type (``kind``), and for tensors same dtype, shape, device."""
        self.count += 1
        if isinstance(expected, torch.Tensor):
            ok = (
                isinstance(got, torch.Tensor)
                and got.dtype == expected.dtype
                and got.shape == expected.shape
                and got.device == expected.device
                and bool(torch.equal(got, expected))
            )
        else:
            ok = got == expected and (kind is None or type(got) is kind)
        if not ok:
            self.errors.append(f"{name}: got {got!r} ({type(got).__name__}), expected {expected!r}")

    def true(self, name: str, ok: bool) -> None:
        self.count += 1
        if not ok:
            self.errors.append(f"{name}: false")

    @contextmanager
    def expect(self, name: str, guard: AbstractContextManager[Any]) -> Iterator[None]:
        """Run the block under ``pytest.raises``/``pytest.warns``; record a miss instead of stopping."""
        self.count += 1
        try:
            with guard:
                yield
        except pytest.fail.Exception as miss:  # pytest.raises/warns saw no (matching) exception or warning
            self.errors.append(f"{name}: {str(miss).splitlines()[0]}")
        except Exception as exc:  # an exception of another type than expected
            self.errors.append(f"{name}: raised {type(exc).__name__}: {exc}")


def precision(c: Checks, r: int, w: int) -> None:
    """Python numbers keep type and precision: int as int64, float as float64."""
    third = 1 / 3
    # values whose float64 result does not depend on the order of the reduction
    c.eq("all_reduce(0.1) SUM", idist.all_reduce(0.1), sum([0.1] * w), float)
    c.eq("all_reduce(1/3 on rank 0) SUM", idist.all_reduce(third if r == 0 else 0.0), third, float)
    c.eq("all_reduce(1/3) MAX", idist.all_reduce(third * (r == 1), "MAX"), third, float)
    c.eq("all_reduce(-1/3) MIN", idist.all_reduce(-third * (r == 2), "MIN"), -third, float)
    expected = third
    for _ in range(w - 1):
        expected *= third
    c.eq("all_reduce(1/3) PRODUCT", idist.all_reduce(third, "PRODUCT"), expected, float)
    big = 2**53 + 1  # not a float64
    c.eq("all_reduce(2**53 + 1) SUM", idist.all_reduce(big), w * big, int)
    c.eq("all_reduce(2**62 + r) MAX", idist.all_reduce(2**62 + r, "MAX"), 2**62 + w - 1, int)
    c.eq("all_reduce(-2**62 - r) MIN", idist.all_reduce(-(2**62) - r, "MIN"), -(2**62) - (w - 1), int)
    c.eq("all_reduce(True) SUM", idist.all_reduce(True), True, bool)
    c.eq("all_reduce(1j/3 on rank 0) SUM", idist.all_reduce(1j * third if r == 0 else 0j), 1j * third, complex)
    c.eq("all_gather(0.1)", idist.all_gather(0.1), [0.1] * w)
    c.eq("all_gather((r+1)/3)", idist.all_gather((r + 1) / 3), [(i + 1) / 3 for i in range(w)])
    c.eq("all_gather((r+1)/3) types", {type(x) for x in idist.all_gather((r + 1) / 3)}, {float})
    c.eq("all_gather(2**53 + r + 1)", idist.all_gather(2**53 + r + 1), [2**53 + i + 1 for i in range(w)])
    c.eq("all_gather(int) types", {type(x) for x in idist.all_gather(2**53 + r)}, {int})
    c.eq("all_gather(bool)", idist.all_gather(r % 2 == 0), [i % 2 == 0 for i in range(w)])
    c.eq("broadcast(1/3)", idist.broadcast(third if r == 0 else 0.0, src=0), third, float)
    c.eq("broadcast(2**63 - 1)", idist.broadcast(2**63 - 1 if r == 1 else 0, src=1), 2**63 - 1, int)
    c.eq("broadcast(1/3) safe_mode", idist.broadcast(third if r == 0 else None, safe_mode=True), third, float)
    c.eq("broadcast(complex)", idist.broadcast(1 / 3 + 2j if r == 0 else 0j), 1 / 3 + 2j, complex)


def in_place(c: Checks, r: int, w: int) -> None:
    """A tensor is reduced or received in place, and the very object comes back."""
    src = w - 1
    sent = torch.tensor([1 / 3, 2**0.5, -7.25], dtype=torch.float64)
    mine = sent.clone() if r == src else torch.zeros(3, dtype=torch.float64)
    out = idist.broadcast(mine, src=src)
    c.true("broadcast returns the caller's tensor", out is mine)
    c.eq("broadcast fills the caller's tensor", mine, sent)

    base = torch.zeros(2, 3)  # a non-contiguous view: sent through a copy, then filled
    view = base.t()
    if r == 0:
        view.copy_(torch.arange(6.0).view(3, 2))
    out = idist.broadcast(view, src=0)
    c.true("broadcast of a view returns the view", out is view)
    c.eq("broadcast fills a view (and its base)", base, torch.arange(6.0).view(3, 2).t().contiguous())

    placeholder = torch.zeros(2, 2, dtype=torch.int32)  # safe_mode: filled when shape and dtype fit
    value = torch.tensor([[1, 2], [3, 2**30]], dtype=torch.int32)
    out = idist.broadcast(value if r == 0 else placeholder, safe_mode=True)
    c.true("broadcast safe_mode fills a fitting placeholder", r == 0 or out is placeholder)
    c.eq("broadcast safe_mode value", out, value)
    out = idist.broadcast(value if r == 0 else None, safe_mode=True)
    c.eq("broadcast safe_mode without placeholder", out, value)

    t = torch.tensor([r + 1, 2], dtype=torch.int64)
    out = idist.all_reduce(t)
    c.true("all_reduce returns the caller's tensor", out is t)
    c.eq("all_reduce reduces in place", t, torch.tensor([w * (w + 1) // 2, 2 * w]))


def dtypes(c: Checks, r: int, w: int) -> None:
    """Every dtype gloo has keeps its dtype and device through every collective."""
    for dtype in DTYPES:
        name = str(dtype).removeprefix("torch.")
        one = torch.ones(2, dtype=dtype)
        got = idist.all_gather(one)
        c.eq(f"all_gather {name}", got, torch.ones(2 * w, dtype=dtype))
        if dtype is not torch.bool:
            t = torch.full((2,), r + 1).to(dtype)
            out = idist.all_reduce(t, "SUM")
            c.eq(f"all_reduce {name}", out, torch.full((2,), w * (w + 1) // 2).to(dtype))
        three = torch.full((2,), 3).to(dtype)
        received = idist.broadcast(three if r == 0 else torch.zeros(2, dtype=dtype), src=0)
        c.eq(f"broadcast {name}", received, three)
        sent = torch.arange(r + 1).to(dtype)
        pieces = idist.all_gather_tensors_with_shapes(sent, [[i + 1] for i in range(w)])
        c.eq(f"all_gather_tensors_with_shapes {name}", pieces[-1], torch.arange(w).to(dtype))
    flag = torch.tensor([r == 0, True])
    c.eq("all_reduce bool MAX", idist.all_reduce(flag, "MAX"), torch.tensor([True, True]))
    c.eq(
        "device",
        idist.device(),
        torch.device(f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"),
    )


def groups(c: Checks, r: int, w: int) -> None:
    """ignite's group semantics (``_test_distrib_group``, ``_test_distrib_all_gather_group``)."""
    ranks = sorted(range(w - 1, 0, -1))  # ignite's [1, ..., w-1]
    g = idist.new_group(ranks)
    if r in ranks:
        c.eq("new_group rank mapping", g.rank(), ranks.index(r))
    t = torch.tensor([r])
    out = idist.all_gather(t, group=g)
    if r in ranks:
        c.eq("all_gather group=new_group", out, torch.tensor(ranks))
    else:
        c.true("all_gather outside the group returns the input", out is t)
    out = idist.all_gather(torch.tensor([r]), group=ranks)
    c.eq("all_gather group=list", out, torch.tensor(ranks) if r in ranks else torch.tensor([r]))
    if r in ranks:
        c.eq("all_reduce group=list", idist.all_reduce(torch.tensor([r]), group=ranks), torch.tensor([sum(ranks)]))
    empty = idist.new_group([])
    c.true("new_group([]) has no member", empty == dist.GroupMember.NON_GROUP_MEMBER)
    c.eq("all_reduce group=[] returns the input", idist.all_reduce(5, group=[]), 5, int)
    c.eq("all_gather group=new_group([]) returns the input", idist.all_gather(7, group=empty), 7, int)
    model = idist.registered_computation_models[1].create_from_context()
    c.true("native model from context", model is not None and model.name == "native-dist")
    if model is not None:
        c.eq("native model rank", model.topology.rank, r)
        c.eq("native model world size", model.topology.world_size, w)
    c.true("gloo is an available backend", "gloo" in idist.available_backends())


def messages(c: Checks, r: int, w: int) -> None:
    """The messages ignite's tests match, with their exception types."""
    t = torch.tensor([r])
    with c.expect("all_reduce('abc')", pytest.raises(TypeError, match=r"Unhandled input type")):
        idist.all_reduce("abc")  # type: ignore[arg-type]
    with c.expect("all_reduce(op='ABC')", pytest.raises(ValueError, match=r"Unsupported reduction operation")):
        idist.all_reduce(10, op="ABC")
    with c.expect(
        "all_reduce(group='abc')",
        pytest.raises(ValueError, match=r"Argument group should be list of int or ProcessGroup"),
    ):
        idist.all_reduce(t, group="abc")
    with c.expect("all_gather(group='abc')", pytest.raises(ValueError, match=r"Argument group should be list of int")):
        idist.all_gather(t, group="abc")
    with c.expect("broadcast([0, 1, 2])", pytest.raises(TypeError, match=r"Unhandled input type")):
        idist.broadcast([0, 1, 2], src=0)  # type: ignore[arg-type]
    msg = "Source data can not be None" if r == 0 else "Argument safe_mode should be True"
    with c.expect("broadcast(None)", pytest.raises(ValueError, match=msg)):
        idist.broadcast(None, src=0)
    ranks_message = "Argument ranks should be list of int"
    with c.expect("new_group(['a', 'b', 'c'])", pytest.raises(ValueError, match=ranks_message)):
        idist.new_group(["a", "b", "c"])  # type: ignore[list-item]
    with c.expect("new_group(1)", pytest.raises(ValueError, match=ranks_message)):
        idist.new_group(1)  # type: ignore[arg-type]
    out_of_range = f"rank should be between 0 and {idist.get_world_size() - 1}, but given 100"
    with c.expect("one_rank_first(100)", pytest.raises(ValueError, match=out_of_range)), idist.one_rank_first(100):
        pass
    # ignite's tests/ignite/distributed/test_auto.py
    data = list(range(10))
    batches = BatchSampler(SequentialSampler(range(10)), batch_size=3, drop_last=False)
    with c.expect("batch_sampler", pytest.warns(UserWarning, match=r"Found batch_sampler in provided kwargs")):
        idist.auto_dataloader(data, batch_sampler=batches)
    wrong = (r + 1) % w
    expected = f"Found distributed sampler with rank={wrong}, but process rank is {r}"
    with c.expect("sampler rank", pytest.warns(UserWarning, match=expected)):
        idist.auto_dataloader(data, sampler=DistributedSampler(data, num_replicas=w, rank=wrong))
    expected = f"Found distributed sampler with num_replicas={w + 1}, but world size is {w}"
    with c.expect("sampler num_replicas", pytest.warns(UserWarning, match=expected)):
        idist.auto_dataloader(data, sampler=DistributedSampler(data, num_replicas=w + 1, rank=r))
    with c.expect(
        "auto_model(sync_bn=True) on CPU",
        pytest.raises((AssertionError, ValueError), match=r"SyncBatchNorm layers only work with (GPU|CUDA) modules"),
    ):
        idist.auto_model(torch.nn.Sequential(torch.nn.Linear(20, 100), torch.nn.BatchNorm1d(100)), sync_bn=True)


def point_to_point(c: Checks, r: int, w: int) -> None:
    """torch's send and recv return what torch's do through tether's wrappers (``sync_timeout`` is set)."""
    if r == 0:
        dist.send(torch.tensor([0.1, 0.2]), 1)
        dist.send(torch.tensor([0.3]), dst=2)
        dist.send_object_list([{"a": 0.1}], dst=1)
        got = torch.zeros(1)
        c.eq("recv from any rank returns the sender", dist.recv(got), 1, int)
        c.eq("recv from any rank fills the tensor", got, torch.tensor([7.0]))
        with c.expect("send to itself", pytest.raises(ValueError, match=r"destination rank should not be the same")):
            dist.send(torch.zeros(1), 0)
    elif r == 1:
        got = torch.zeros(2)
        c.eq("recv(src=0) returns 0", dist.recv(got, 0), 0, int)
        c.eq("recv(src=0) fills the tensor", got, torch.tensor([0.1, 0.2]))
        objects: list[Any] = [None]
        dist.recv_object_list(objects, src=0)
        c.eq("recv_object_list", objects, [{"a": 0.1}])
        dist.send(torch.tensor([7.0]), 0)
    elif r == 2:
        got = torch.zeros(1)
        c.eq("recv(group_src=0) returns the global rank", dist.recv(got, group_src=0), 0, int)
        c.eq("recv(group_src=0) fills the tensor", got, torch.tensor([0.3]))


STEPS: list[tuple[str, Callable[[Checks, int, int], None]]] = [
    ("precision", precision),
    ("in_place", in_place),
    ("dtypes", dtypes),
    ("groups", groups),
    ("messages", messages),
    ("point_to_point", point_to_point),
]


def body(local_rank: int, params: dict[str, Any]) -> None:
    state = params["_state"]
    c = Checks()
    r, w = idist.get_rank(), idist.get_world_size()
    for name, step in STEPS:
        state["phase"] = name
        step(c, r, w)
        c.eq(f"in step after {name}", idist.all_reduce(1), w, int)  # no rank diverged into a wait
    emit("FIDELITY", {"rank": r, "count": c.count, "errors": c.errors, "path": str(Path(__file__).name)})
    state["phase"] = "show_config"
    idist.barrier()
    idist.show_config()
    idist.barrier()
    state["phase"] = "done"


if __name__ == "__main__":
    launcher, nproc, params = parse_params(sys.argv[1:])
    launch(launcher, nproc, params, sync_timeout=60)  # raw calls take tether's bounded paths
