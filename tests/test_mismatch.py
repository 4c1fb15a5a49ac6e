"""Mismatched collectives are an error, not corruption (issue 8, item 5): ``check_collectives=True``.

Real 2-rank jobs (``jobs/mismatch_job.py``): rank 0 and rank 1 pass tensors of different
shapes or dtypes, or numbers of different kinds. With the switch on, both ranks raise
``SyncMismatch`` listing what each passed, and no rank crashes or returns data. The switch
is off by default (it costs an all-gather per collective: ``benchmarks/results/sync.md``);
without it gloo may abort a rank or fill a buffer with garbage, which is why it exists.
"""

from __future__ import annotations

import pytest

from _core import lc_events
from _harness import python, torchrun
from _torchrun_report import root_cause
from tether import ExitCode, spawn

BOUND = 60.0

CASES = {
    "gather_shape": ("all_gather(float32[2])", "all_gather(float32[3])"),
    "gather_dtype": ("all_gather(float32[2])", "all_gather(int64[2])"),
    "broadcast_shape": ("broadcast(src=0, float32[2])", "broadcast(src=0, float32[3])"),
    "reduce_shape": ("all_reduce(SUM, float32[2])", "all_reduce(SUM, float32[3])"),
    "reduce_kind": ("all_reduce(SUM, int64[])", "all_reduce(SUM, float64[])"),
    "cross_kind": ("broadcast(src=0, float32[2])", "all_reduce(SUM, float32[2])"),
}


@pytest.mark.timeout(BOUND + 30)
@pytest.mark.parametrize(
    "kind",
    [k if k in ("gather_shape", "reduce_kind") else pytest.param(k, marks=pytest.mark.full) for k in sorted(CASES)],
)
def test_mismatched_collectives_raise_sync_mismatch_on_every_rank(kind: str) -> None:
    res = python("mismatch_job.py", kind, "--check", bound=BOUND)
    assert res.returncode == int(ExitCode.LAUNCH_FAILED), res.output[-3000:]
    first, second = CASES[kind]
    message = f"ranks entered different syncs: rank 0: {first}; rank 1: {second}"
    caught = {e["rank"]: e for e in lc_events(res, "raised")}
    assert sorted(caught) == [0, 1], res.output[-3000:]
    for e in caught.values():
        assert (e["exc"], e["msg"]) == ("SyncMismatch", message), e
    assert lc_events(res, "got") == []  # nobody returned data
    assert res.stderr.count(f"Root cause: rank 0 failed: SyncMismatch: {message}") == 1, res.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank}: " in res.stderr and "killed by" not in res.stderr  # no rank crashed
    assert res.leftovers == []


def work(local_rank: int) -> None:  # never runs: the option is refused before any process starts
    raise AssertionError("spawned")


def test_check_collectives_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match=r"^check_collectives must be a bool, got str 'yes'$"):
        spawn("gloo", work, (), nproc_per_node=2, check_collectives="yes")


@pytest.mark.timeout(BOUND + 30)
def test_a_raw_collective_in_a_failed_ranks_finally_is_a_mismatch_not_a_wait_forever() -> None:
    # crossed.py: rank 1 raises and its finally waits in dist.barrier while the others wait for
    # it in tether's all_reduce #11; before, the job waited until the harness killed it
    res = torchrun("crossed_finally.py", nproc=3, bound=BOUND, env={"OMP_NUM_THREADS": "1"})
    assert res.returncode is not None and res.elapsed < BOUND, res.output[-3000:]
    assert res.returncode != 0
    out = {(e["rank"], e["where"]): e for e in lc_events(res, "raised")}
    assert out[1, "loop"]["exc"] == "ValueError", out
    crossed = "rank 1: dist.barrier (outside tether), while handling ValueError: injected failure 0.1 on rank 1"
    for rank in (0, 1, 2):  # every rank, rank 1 out of its finally's barrier
        e = out[rank, "finally"]
        assert e["exc"] == "SyncMismatch" and crossed in str(e["msg"]), e
        assert "rank 0: all_reduce(SUM, float64[]) #11" in str(e["msg"]), e
    assert crossed in root_cause(res.stderr).traceback, res.stderr[-3000:]
    assert res.leftovers == []
