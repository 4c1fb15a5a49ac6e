"""The periodic save's writer process (``tether/_ckpt_writer.py``), in this process (a job of one).

What a save through shared memory must keep: every tensor's values, dtype and shape
(non-contiguous, zero-sized, 0-d, bool, bfloat16 included), the containers around them
and their attributes; and a writer that dies is reported and replaced, never waited on.
The job-level proofs (a rank killed while its writer writes, no writer left behind) are in
``test_resume.py``.
"""

from __future__ import annotations

import collections
import logging
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

import tether
from tether import _ckpt_writer

pytestmark = pytest.mark.skipif(not _ckpt_writer.available(), reason="the writer process is Linux-only")


class Holder:
    """An object whose state is whatever the test gives it."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def state_dict(self) -> dict[str, Any]:
        return self.state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state = state


def saved(dirname: Path, step: int) -> dict[str, Any]:
    return torch.load(dirname / f"step-{step:08d}" / "state.pt", weights_only=False)["objects"]["h"]


def test_a_save_through_the_writer_process_keeps_every_tensor_and_container(tmp_path: Path) -> None:
    wide = torch.arange(12, dtype=torch.float64).reshape(3, 4) * 0.1
    metadata = collections.OrderedDict(w=torch.full((2,), 0.1))
    metadata._metadata = {"": {"version": 3}}  # type: ignore[attr-defined]  # as a module's state_dict has
    state = {
        "transposed": wide.t(),  # non-contiguous: its values, not its memory order
        "every_other": torch.arange(10, dtype=torch.int64)[::2],
        "empty": torch.empty(0, 5),
        "scalar": torch.tensor(0.1, dtype=torch.float32),
        "mask": torch.tensor([True, False, True]),
        "half": torch.tensor([0.1, 0.2, 0.3], dtype=torch.bfloat16),
        "nested": [torch.ones(2, dtype=torch.int8), (torch.zeros(3), "label", 7)],
        "module": metadata,
        "plain": {"lr": 0.1, "name": "sgd"},
    }
    ckpt = tether.Checkpointer({"h": Holder(state)}, tmp_path, every=1)
    with ckpt.step(0, 0):
        pass
    ckpt.wait()
    got = saved(tmp_path, 1)
    for name in ("transposed", "every_other", "empty", "scalar", "mask", "half"):
        assert got[name].dtype == state[name].dtype and got[name].shape == state[name].shape, name
        assert torch.equal(got[name], state[name]), name
    assert torch.equal(got["nested"][0], state["nested"][0]) and got["nested"][1][1:] == ("label", 7)
    assert torch.equal(got["nested"][1][0], torch.zeros(3))
    assert type(got["module"]) is collections.OrderedDict and got["module"]._metadata == {"": {"version": 3}}
    assert torch.equal(got["module"]["w"], torch.full((2,), 0.1))
    assert got["plain"] == {"lr": 0.1, "name": "sgd"}


def test_each_save_holds_the_state_of_its_own_step_while_training_goes_on(tmp_path: Path) -> None:
    # the snapshot is taken when the step ends: changing the tensor after it does not reach the file
    weight = torch.zeros(1000)
    ckpt = tether.Checkpointer({"h": Holder({"w": weight})}, tmp_path, every=1)
    for i in range(3):
        with ckpt.step(0, i):
            weight.add_(0.1)
        weight.add_(100.0)  # after the step's snapshot, while the writer writes it
    ckpt.wait()
    for step in (1, 2, 3):
        expected = torch.zeros(1000)
        for _ in range(step - 1):
            expected.add_(0.1).add_(100.0)
        assert torch.equal(saved(tmp_path, step)["w"], expected.add_(0.1)), step


def test_a_state_that_grows_gets_a_larger_shared_file(tmp_path: Path) -> None:
    state: dict[str, Any] = {"w": torch.full((10,), 0.1)}
    ckpt = tether.Checkpointer({"h": Holder(state)}, tmp_path, every=1)
    with ckpt.step(0, 0):
        pass
    state["more"] = torch.full((100_000,), 0.2)  # an optimizer's state appears after its first step
    with ckpt.step(0, 1):
        pass
    ckpt.wait()
    assert torch.equal(saved(tmp_path, 2)["more"], torch.full((100_000,), 0.2))
    assert torch.equal(saved(tmp_path, 2)["w"], torch.full((10,), 0.1))


def test_a_writer_killed_before_it_saved_is_reported_and_the_next_save_starts_another(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ckpt = tether.Checkpointer({"h": Holder({"w": torch.full((4,), 0.1)})}, tmp_path, every=1)
    writer = ckpt._behind
    assert writer is not None
    with ckpt.step(0, 0):
        pass  # the child is started by the step and still imports torch when the save is sent
    proc = writer._child.proc
    assert proc is not None
    os.kill(proc.pid, signal.SIGKILL)
    with caplog.at_level(logging.WARNING, logger="tether"):
        ckpt.wait()
    assert "the checkpoint writer ended (exit -9) before it saved step 1" in caplog.text
    assert not (tmp_path / "step-00000001").exists()
    with ckpt.step(0, 1):
        pass
    ckpt.wait()
    assert writer._child.proc is not None and writer._child.proc.pid != proc.pid
    assert torch.equal(saved(tmp_path, 2)["w"], torch.full((4,), 0.1))


def test_the_writer_ends_when_its_checkpointer_is_collected(tmp_path: Path) -> None:
    ckpt = tether.Checkpointer({"h": Holder({"w": torch.full((4,), 0.1)})}, tmp_path, every=1)
    with ckpt.step(0, 0):
        pass
    assert ckpt._behind is not None and ckpt._behind._child.proc is not None
    proc = ckpt._behind._child.proc
    del ckpt  # the save in progress is finished first
    assert proc.poll() is not None and proc.returncode == 0
    assert (tmp_path / "step-00000001" / "manifest.json").exists()


def test_without_a_writer_process_a_thread_writes_the_saves(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.executable", str(tmp_path / "no-such-python"))  # the child cannot start
    ckpt = tether.Checkpointer({"h": Holder({"w": torch.full((4,), 0.1)})}, tmp_path / "ckpt", every=1)
    with caplog.at_level(logging.WARNING, logger="tether"):
        with ckpt.step(0, 0):
            pass
        ckpt.wait()
    assert "no checkpoint writer process" in caplog.text and "a thread writes the periodic saves" in caplog.text
    assert ckpt._behind is None
    assert torch.equal(saved(tmp_path / "ckpt", 1)["w"], torch.full((4,), 0.1))
