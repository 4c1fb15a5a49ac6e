"""``examples/train.py``, the README's example, run the way its docstring tells a user to.

The emergency checkpoint and resume (issue 12) through the example's own flags: a rank
killed in its 5th training step, a survivor's save, every worker started again, and the
run's end bitwise equal to that of a run nobody interrupted (the example saves its model
at the end): under ``tether.spawn`` (``--max-restarts``) and under torchrun's own restarts.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from _harness import ROOT, Result, free_port, run

BOUND = 120.0
pytestmark = pytest.mark.timeout(3 * BOUND)
EXAMPLE = str(ROOT / "examples" / "train.py")
FAULT = ("--fail-kind", "kill", "--fail-rank", "1", "--fail-at", "train")


def example(tmp: Path, name: str, *args: str, torchrun: bool = False) -> Result:
    """The example on 2 ranks for one epoch, its data, model and checkpoints under ``tmp``."""
    own = (
        "--epochs",
        "1",
        "--data-dir",
        str(tmp / "data"),
        "--out-dir",
        str(tmp / name),
        "--resume",
        str(tmp / f"{name}-ckpt"),
    )
    if torchrun:
        launcher = ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1"]
        launcher += ["--master_port", str(free_port()), "--monitor_interval", "0.1", "--max-restarts", "1"]
        return run([sys.executable, *launcher, EXAMPLE, *own, *args], BOUND)
    return run([sys.executable, EXAMPLE, "--nproc", "2", *own, *args], BOUND)


def weights(path: Path) -> dict[str, torch.Tensor]:
    """The model's parameters in the example's final save, and the optimizer's tensors."""
    saved = torch.load(path, map_location="cpu", weights_only=True)
    found = {f"model.{k}": v for k, v in saved["model"].items()}
    for i, state in saved["optimizer"]["state"].items():
        found.update({f"optimizer.{i}.{k}": v for k, v in state.items() if isinstance(v, torch.Tensor)})
    return found


def losses(res: Result) -> list[str]:
    return re.findall(r"^epoch 1/1  step +\d+/\d+  loss \S+$", res.stdout, re.M)


def assert_resumed_where_it_left(res: Result, plain: Result, tmp: Path, name: str) -> None:
    assert res.returncode == 0, res.output[-4000:]
    assert res.elapsed < BOUND
    assert res.leftovers == []
    saved = re.findall(r"rank 0 saved an emergency checkpoint of step (\d+) to ", res.stderr)
    assert saved, res.stderr[-4000:]
    resumed = re.findall(r"^tether: resumed from the emergency checkpoint of step (\d+) ", res.stderr, re.M)
    assert resumed == [saved[0]], res.stderr[-4000:]  # one line, by rank 0, of the step saved
    assert losses(res) and losses(res) == losses(plain), (losses(res), losses(plain))
    ours, theirs = weights(tmp / name / "model.pt"), weights(tmp / "plain" / "model.pt")
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours), "the resumed run's weights differ from the plain run's"


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Result]:
    tmp = tmp_path_factory.mktemp("train-example")
    res = example(tmp, "plain")
    assert res.returncode == 0, res.stderr[-4000:]
    assert res.leftovers == []
    return tmp, res


def test_a_rank_killed_in_training_costs_no_progress_under_spawn_with_max_restarts(plain: tuple[Path, Result]) -> None:
    tmp, first = plain
    res = example(tmp, "spawn", "--max-restarts", "1", *FAULT)
    assert "Root cause: rank 1 failed: SIGKILL: process killed by SIGKILL" in res.stderr, res.stderr[-4000:]
    assert "  rank 0: stopped: PEER_FAILED (exited with code 3)" in res.stderr, res.stderr[-4000:]  # the survivor
    assert res.stderr.count("tether: starting every worker again (restart 1 of 1)") == 1, res.stderr[-4000:]
    assert_resumed_where_it_left(res, first, tmp, "spawn")


@pytest.mark.full
def test_a_rank_killed_in_training_costs_no_progress_under_torchrun_max_restarts(plain: tuple[Path, Result]) -> None:
    tmp, first = plain
    res = example(tmp, "torchrun", *FAULT, torchrun=True)
    assert re.search(r"\[rank 0\] stopped: PeerLost: rank 1 failed", res.output), res.output[-4000:]
    assert_resumed_where_it_left(res, first, tmp, "torchrun")


def test_a_rank_stalled_in_training_costs_no_progress_under_spawn_with_max_restarts(
    plain: tuple[Path, Result],
) -> None:
    # "stalls (SyncTimeout) and mismatches follow the same rule" (issue 12): the survivor
    # that timed out on the stalled rank saves, and the restart resumes from its save
    tmp, first = plain
    fault = ("--fail-kind", "stall", "--fail-rank", "1", "--fail-at", "train", "--sync-timeout", "3")
    res = example(tmp, "stalled", "--max-restarts", "1", *fault)
    root = "Root cause: rank 1 failed: SyncTimeout: all_reduce(SUM, float32[]) #7 timed out after 3 s: rank(s) [1] "
    assert root in res.stderr, res.stderr[-4000:]
    assert "  rank 0: stopped: TIMEOUT (exited with code 4)" in res.stderr, res.stderr[-4000:]  # the survivor
    saved = r"rank 0 saved an emergency checkpoint of step \d+ to \S+ \(SyncTimeout stopped training\)"
    assert re.search(saved, res.stderr), res.stderr[-4000:]
    assert res.stderr.count("tether: starting every worker again (restart 1 of 1)") == 1, res.stderr[-4000:]
    assert_resumed_where_it_left(res, first, tmp, "stalled")
