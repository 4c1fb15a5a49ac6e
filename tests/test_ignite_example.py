"""ignite's own internals through tether (issue 8, item 4): ``examples/ignite_trainer.py``, for real.

An ignite ``Engine`` with ``Accuracy``/``Loss``, ``Checkpoint``, ``ProgressBar`` and DDP from ``auto_model``,
2 ranks under ``tether.Parallel``. A raise in training and a stall in evaluation (where
the wait is ignite's metric reduction, which calls ``ignite.distributed``) must end
every other rank with tether's error, in bound, the root cause printed once.
"""

from __future__ import annotations

import re
import sys
import tempfile

import pytest

from _harness import ROOT, Result, run

BOUND = 120.0
pytestmark = pytest.mark.timeout(BOUND + 60)


def example(*args: str) -> Result:
    with tempfile.TemporaryDirectory(prefix="tether-ignite-test-") as out:
        return run([sys.executable, str(ROOT / "examples" / "ignite_trainer.py"), "--out-dir", out, *args], BOUND)


def ranks(res: Result) -> dict[str, str]:
    return dict(re.findall(r"^  rank (\d+): (.*)$", res.stderr, re.M))


@pytest.mark.full
def test_the_ignite_example_trains_and_checkpoints() -> None:
    res = example("--epochs", "1")
    assert res.returncode == 0, res.output[-3000:]
    assert re.search(r"^epoch 1: \{'accuracy': 0\.\d+, 'loss': \d\.\d+\}$", res.stdout, re.M), res.stdout
    assert res.leftovers == []


def test_a_raise_in_ignites_training_loop_stops_the_other_rank_with_peer_failure() -> None:
    # with ignite's ProgressBar on rank 0 (tqdm, the test extra's): the bar drew, and the report is whole
    res = example("--fail-kind", "raise", "--fail-rank", "1", "--fail-at", "train", "--progress")
    assert re.search(r"Epoch \[1/2\]: \[\d+/\d+\]", res.stderr), res.stderr[-3000:]
    assert res.returncode == 1, res.output[-3000:]
    root = "rank 1 failed: RuntimeError: injected failure in train"
    assert res.stderr.count(f"tether: job failed. Root cause: {root}") == 1, res.stderr[-3000:]
    assert ranks(res)["0"] == "stopped: PEER_FAILED (exited with code 3)", res.stderr[-3000:]
    assert res.leftovers == []


def test_a_stall_in_ignites_metric_reduction_is_a_sync_timeout_naming_the_stalled_rank() -> None:
    res = example("--fail-kind", "stall", "--fail-rank", "1", "--fail-at", "eval", "--sync-timeout", "4")
    assert res.returncode == 1, res.output[-3000:]
    # rank 0 waits in Accuracy's all-reduce: ignite's call, tether's collective
    assert "Engine run is terminating due to exception: all_reduce(" in res.stderr, res.stderr[-3000:]
    root = re.search(r"Root cause: rank 1 failed: SyncTimeout: (.*) timed out after 4 s: rank\(s\) \[1\]", res.stderr)
    assert root is not None, res.stderr[-3000:]
    assert ranks(res)["0"] == "stopped: TIMEOUT (exited with code 4)", res.stderr[-3000:]
    # the waiting rank posted the timeout; the launcher knows where its child, the staller, ran
    assert re.search(r"\n  on host \S+, pid [1-9]\d*, in user code\n", res.stderr), res.stderr[-3000:]
    # the staller's stack, in the error's text, is printed once: in its own notice, not again
    # there nor in each of ignite's "terminating" lines on rank 0 (4: two engines, two lines each)
    assert res.stderr.count(", in inject\n") == 1, res.stderr[-6000:]
    assert res.elapsed < BOUND
    assert res.leftovers == []
