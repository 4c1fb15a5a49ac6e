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
from pathlib import Path

import pytest
import torch

from _harness import ROOT, Result, run

BOUND = 120.0
pytestmark = pytest.mark.timeout(2 * BOUND + 60)
EXAMPLE = str(ROOT / "examples" / "ignite_trainer.py")
KILL = ("--fail-kind", "kill", "--fail-rank", "1", "--fail-at", "train")


def example(*args: str) -> Result:
    with tempfile.TemporaryDirectory(prefix="tether-ignite-test-") as out:
        return run([sys.executable, EXAMPLE, "--out-dir", out, *args], BOUND)


def ranks(res: Result) -> dict[str, str]:
    return dict(re.findall(r"^  rank (\d+): (.*)$", res.stderr, re.M))


def metrics(res: Result) -> list[str]:
    return re.findall(r"^epoch \d: \{'accuracy': .*\}$", res.stdout, re.M)


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


@pytest.mark.full  # default: tests/test_resume.py's Engine, resumed bitwise
def test_a_rank_killed_in_ignites_training_loop_costs_no_progress_with_the_checkpointer_attached(
    tmp_path: Path,
) -> None:
    # --resume attaches a tether.Checkpointer to the trainer; the job, restarted once,
    # resumes the engine from rank 0's emergency save of step 3 (rank 1 was killed after
    # its 3rd iteration). ignite's Checkpoint handler, beside it, saves at each epoch's end:
    # the last one, model and engine state, is that of a run nobody interrupted
    runs = {}
    for name, flags in (("plain", ()), ("killed", ("--max-restarts", "1", *KILL))):
        runs[name] = run(
            [
                sys.executable,
                EXAMPLE,
                "--out-dir",
                str(tmp_path / name),
                "--resume",
                str(tmp_path / f"{name}-ckpt"),
                *flags,
            ],
            BOUND,
        )
        assert runs[name].returncode == 0, runs[name].output[-3000:]
        assert runs[name].elapsed < BOUND
        assert runs[name].leftovers == []
    res = runs["killed"]
    root = "rank 1 failed: SIGKILL: process killed by SIGKILL"
    assert res.stderr.count(f"tether: job failed. Root cause: {root}") == 1, res.stderr[-3000:]
    assert ranks(res)["0"] == "stopped: PEER_FAILED (exited with code 3)", res.stderr[-3000:]
    saved = "tether: rank 0 saved an emergency checkpoint of step 3 to "
    assert res.stderr.count(saved) == 1, res.stderr[-3000:]
    assert res.stderr.count("tether: resumed from the emergency checkpoint of step 3 ") == 1, res.stderr[-3000:]
    assert metrics(res) == metrics(runs["plain"]) and len(metrics(res)) == 2, res.stdout
    ours, theirs = (torch.load(tmp_path / name / "checkpoint_64.pt", weights_only=True) for name in ("killed", "plain"))
    assert ours["trainer"] == theirs["trainer"] == {"epoch_length": 32, "iteration": 64, "max_epochs": 2}
    assert all(torch.equal(ours["model"][k], theirs["model"][k]) for k in theirs["model"])
