"""The code stays ruff- and mypy-clean: the checks run with the suite."""

from __future__ import annotations

import subprocess
import sys

import pytest

from _harness import ROOT


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "command",
    [
        ["-m", "ruff", "check", "src", "tests", "benchmarks", "examples"],
        ["-m", "ruff", "format", "--check", "src", "tests", "benchmarks", "examples"],
        ["-m", "mypy"],
    ],
    ids=["ruff-check", "ruff-format", "mypy"],
)
def test_code_is_lint_and_type_clean(command: list[str]) -> None:
    done = subprocess.run([sys.executable, *command], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
