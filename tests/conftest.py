"""Shared pytest set-up: the ``--full`` flag for the whole fault matrix, and mypy started early.

mypy takes ~45 s of CPU here, most of it reading torch. ``test_lint`` would spend that
in line with the rest; instead, once the run is collected, mypy starts in the background
at the lowest CPU priority (nice 19), so it runs in the idle time of jobs that wait on
timeouts and barely slows the others, and the mypy test collects its verdict.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from _harness import ROOT

MYPY_TEST = "test_lint.py::test_code_is_lint_and_type_clean[mypy]"
mypy_key = pytest.StashKey[tuple[subprocess.Popen[bytes], "tempfile._TemporaryFileWrapper[bytes]"]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--full", action="store_true", default=False, help="run the whole fault matrix")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--full"):
        return
    skip = pytest.mark.skip(reason="part of the full matrix: run with --full")
    for item in items:
        if "full" in item.keywords:
            item.add_marker(skip)


def pytest_collection_finish(session: pytest.Session) -> None:
    if len(session.items) > 1 and any(item.nodeid.endswith(MYPY_TEST) for item in session.items):
        out = tempfile.NamedTemporaryFile(prefix="tether-mypy-", suffix=".txt")  # noqa: SIM115 (closed at the end)
        command = [sys.executable, "-m", "mypy"]
        proc = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, preexec_fn=lambda: os.nice(19))
        session.config.stash[mypy_key] = (proc, out)


def pytest_sessionfinish(session: pytest.Session) -> None:
    started = session.config.stash.get(mypy_key, None)
    if started is not None:
        proc, out = started
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out.close()


def mypy_verdict(config: pytest.Config, timeout: float) -> tuple[int, str]:
    """mypy's exit code and output: from the background run if one started, else run now."""
    started = config.stash.get(mypy_key, None)
    if started is None:
        done = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        return done.returncode, done.stdout + done.stderr
    proc, out = started
    code = proc.wait(timeout=timeout)
    return code, Path(out.name).read_text(errors="replace")
