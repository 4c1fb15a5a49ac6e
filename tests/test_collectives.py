"""Round trips of every collective and type, distributed (gloo) and serial (no process group).

The distributed checks run in one job per world size (``tests/jobs/core_collectives.py``):
every rank runs every check and reports its mismatches, so one job covers them all. The
serial answers are checked in this process, which never initializes a process group.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import tether as idist
from _core import JOB_BOUND, TEST_TIMEOUT, assert_ended, assert_no_leftovers, lc_events, lines, results, tail
from _harness import python, torchrun


@pytest.mark.timeout(TEST_TIMEOUT)
@pytest.mark.parametrize(
    ("launcher", "world", "check"),
    [
        ("spawn", 4, False),
        pytest.param("init", 2, False, marks=pytest.mark.full),
        pytest.param("spawn", 4, True, marks=pytest.mark.full),
        ("init", 2, True),
    ],
)
def test_every_collective_round_trips_every_type_on_gloo(launcher: str, world: int, check: bool) -> None:
    """``check``: with ``check_collectives``, whose frames carry calls of up to 4 KiB a rank themselves."""
    args = (launcher, str(world), f"check={str(check).lower()}")
    if launcher == "init":
        res = torchrun("core_collectives.py", *args, nproc=world, bound=JOB_BOUND)
    else:
        res = python("core_collectives.py", *args, bound=JOB_BOUND)
    assert_ended(res)
    assert res.returncode == 0, tail(res)
    checks = {d["rank"]: d for d in lines(res, "CHECKS")}
    assert sorted(checks) == list(range(world)), tail(res)
    for rank, d in checks.items():
        assert d["errors"] == [], f"rank {rank}: " + "\n".join(d["errors"])
    counts = {d["count"] for d in checks.values()}
    assert len(counts) == 1 and counts.pop() > 50, checks  # every rank ran every check
    assert all(d["exc"] is None for d in results(res).values()), tail(res)
    assert_no_leftovers(res)


@pytest.mark.timeout(TEST_TIMEOUT)
def test_a_collective_that_skips_the_5_ms_timed_wait_still_raises_a_peers_failure() -> None:
    # a gloo collective whose last run outlived the 5 ms wait in C++ waits on the event at
    # once (an expired timed wait is a C++ error, which costs CPU: ``waits.run_work``); a
    # run within 5 ms gives the slice back
    res = python("outlived_slice.py", bound=JOB_BOUND)
    assert_ended(res)
    assert res.returncode == 7, tail(res)
    rounds = [(e["late"], e["outlived"]) for e in lc_events(res, "round") if e["rank"] == 0]
    signature = ["all_reduce(SUM, float32[4])"]
    assert rounds == [(True, signature), (False, []), (True, signature)], tail(res)
    (fault,) = lc_events(res, "fault")
    (e,) = (e for e in lc_events(res, "raised") if e["rank"] == 0)
    assert e["outlived"] == signature, e  # the failing call skipped the slice
    expected = ("PeerFailure", 1, "ValueError", "rank 1 failed 0.1 into a long all_reduce")
    assert (e["exc"], e["failing"], e["orig_type"], e["orig_msg"]) == expected, e
    assert float(e["time"]) - float(fault["time"]) < 2.0, (e, fault)  # type: ignore[arg-type]
    root = "Root cause: rank 1 failed: ValueError: rank 1 failed 0.1 into a long all_reduce"
    assert res.stderr.count(root) + res.stdout.count(root) == 1, tail(res)
    assert_no_leftovers(res)


# --- serial: no process group, every call answers for one process ---------------------


@pytest.fixture(autouse=True)
def serial() -> None:
    assert not torch.distributed.is_initialized()


def test_serial_getters_answer_for_one_process() -> None:
    assert idist.get_rank() == 0
    assert idist.get_local_rank() == 0
    assert idist.get_world_size() == 1
    assert idist.get_nproc_per_node() == 1
    assert idist.get_nnodes() == 1
    assert idist.get_node_rank() == 0
    assert idist.backend() is None
    assert idist.model_name() == "serial"
    assert idist.device().type in ("cpu", "cuda")
    assert isinstance(idist.hostname(), str) and idist.hostname()
    assert "gloo" in idist.available_backends()


def test_serial_all_reduce_returns_its_input() -> None:
    assert idist.all_reduce(3) == 3
    assert idist.all_reduce(2.5, "MAX") == 2.5
    t = torch.tensor([1.0, 2.0])
    out = idist.all_reduce(t, "PRODUCT")
    assert out is t and t.tolist() == [1.0, 2.0]
    assert idist.all_reduce(7, group=[0]) == 7


def test_serial_all_gather_wraps_its_input() -> None:
    assert idist.all_gather(3) == [3]
    assert idist.all_gather(0.5) == [0.5]
    assert idist.all_gather("abc") == ["abc"]
    assert idist.all_gather({"a": 1}) == [{"a": 1}]
    t = torch.tensor([1, 2])
    assert torch.equal(idist.all_gather(t), t)
    pieces = idist.all_gather_tensors_with_shapes(t, [[2]])
    assert len(pieces) == 1 and torch.equal(pieces[0], t)


def test_serial_broadcast_returns_its_input() -> None:
    assert idist.broadcast(2**60 + 1) == 2**60 + 1
    assert idist.broadcast(0.25) == 0.25
    assert idist.broadcast("x") == "x"
    assert idist.broadcast(Path("a/b")) == Path("a/b")
    t = torch.tensor([3.0])
    assert torch.equal(idist.broadcast(t), t)


def test_serial_syncs_run_the_block_and_return() -> None:
    idist.barrier()
    idist.barrier(timeout=1)
    ran = []
    with idist.one_rank_first():
        ran.append("first")
    with idist.one_rank_first(rank=0, local=True):
        ran.append("local")

    @idist.one_rank_only(with_barrier=True)
    def only() -> str:
        ran.append("only")
        return "done"

    assert only() == "done"
    assert ran == ["first", "local", "only"]
    assert idist.new_group([0]) == [0]


def test_serial_one_rank_first_lets_the_blocks_exception_through() -> None:
    with pytest.raises(ValueError, match="boom"), idist.one_rank_first():
        raise ValueError("boom")
    idist.barrier()  # nothing recorded: the serial context stays usable
