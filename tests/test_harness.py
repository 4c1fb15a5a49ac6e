"""The harness starts a job's first process as ``python`` would: forked from the zygote, that
has imported torch once for every job, or as a fresh interpreter (``TETHER_TEST_FRESH=1``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from _harness import python, run

BOUND = 60.0


@pytest.mark.parametrize(("how", "code"), [("raise", 1), ("exit-3", 3), ("sigterm", -15)])
def test_a_job_forked_from_the_zygote_starts_and_ends_as_a_fresh_interpreter_would(
    how: str, code: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TETHER_TEST_FRESH", raising=False)  # a run with it set checks this too
    forked = python("harness_probe.py", how, "a b", bound=BOUND)
    monkeypatch.setenv("TETHER_TEST_FRESH", "1")
    fresh = python("harness_probe.py", how, "a b", bound=BOUND)
    seen, expected = json.loads(forked.stdout), json.loads(fresh.stdout)
    # the one difference, which shows that the first job was forked
    assert (seen.pop("torch_imported"), expected.pop("torch_imported")) == (True, False)
    assert seen == expected
    assert seen["argv"][1:] == [how, "a b"] and seen["tagged"] and seen["own_session"]
    assert forked.stderr == fresh.stderr  # the traceback too: no frame of the zygote's
    assert forked.returncode == fresh.returncode == code
    assert forked.leftovers == fresh.leftovers == []


def test_a_module_run_with_dash_m_forked_from_the_zygote_starts_and_ends_as_a_fresh_interpreter_would(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As torchrun's launcher is run: ``python -m torch.distributed.run``."""
    command = [sys.executable, "-m", "tests.jobs.harness_probe", "raise", "a b"]
    monkeypatch.delenv("TETHER_TEST_FRESH", raising=False)
    forked = run(command, bound=BOUND)
    monkeypatch.setenv("TETHER_TEST_FRESH", "1")
    fresh = run(command, bound=BOUND)
    seen, expected = json.loads(forked.stdout), json.loads(fresh.stdout)
    assert (seen.pop("torch_imported"), expected.pop("torch_imported")) == (True, False)
    assert seen == expected and seen["argv"][1:] == ["raise", "a b"]
    assert forked.stderr == fresh.stderr and "ValueError: the probe's error 0.1 (raise)" in fresh.stderr
    assert forked.returncode == fresh.returncode == 1


def test_a_job_that_sets_a_variable_read_when_python_starts_gets_a_fresh_interpreter() -> None:
    res = python("harness_probe.py", "exit-3", bound=BOUND, env={"PYTHONHASHSEED": "7"})
    assert res.returncode == 3
    assert json.loads(res.stdout)["torch_imported"] is False


def test_a_port_drawn_for_one_job_is_not_drawn_again_for_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from _harness import _jobs_common

    common = _jobs_common()
    monkeypatch.setattr(common, "_DRAWN", str(tmp_path))
    first = common.free_port()
    draws = iter([first, first, first + 1 if first + 1 < 32768 else first - 1])
    monkeypatch.setattr(common._DRAW, "randrange", lambda *_: next(draws))
    # the same number drawn twice: the second draw (another test's, in its own process,
    # where the file is all they share) goes on to the next
    assert common.free_port() != first
