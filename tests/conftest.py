"""Shared pytest set-up: the ``--full`` flag for the whole fault matrix; SIGINT taken, as from a
terminal; tether's bytecode written once."""

from __future__ import annotations

import compileall
import signal
from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    """Every job starts with SIGINT taken, as from a terminal, wherever pytest was started.

    A shell starts a background command (``pytest &``, ``nohup``, a CI step run that way)
    with SIGINT ignored, and every process started from it inherits that. tether leaves an
    ignored SIGINT ignored, as Python does, so the fault rows that send a rank SIGINT saw
    nothing happen: F8-sigint-waiting-spawn-4r ran on and exited 0 in 2 of 2 runs started
    in the background, and passed in 29 of 29 under ``timeout`` (which takes SIGINT itself,
    so its command starts with the default). A handler here (set in each xdist worker too)
    makes every job's interpreter start with Python's default, ``KeyboardInterrupt``.
    """
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if not hasattr(config, "workerinput"):  # once, in the process that starts pytest's workers
        _write_bytecode()


def _write_bytecode() -> None:
    """Write the bytecode of tether's modules and of the jobs' helpers before any job starts.

    Where ``PYTHONDONTWRITEBYTECODE`` is set (this machine's environment sets it), Python
    caches no bytecode for an editable install, and every process of a job compiled tether
    again: about 0.14 s of CPU each (``-X importtime``, tether's own modules: 131-203 ms
    without the cache, 36-66 ms with it), in a default run of some 650 processes on 2 cores
    where the CPU is the limit. A file changed later is compiled from its source again (its
    bytecode is stamped with the source's time), as without the cache.
    """
    for folder, depth in ((_TESTS.parent / "src" / "tether", 1), (_TESTS / "jobs", 0)):
        if folder.is_dir():  # tether installed from a wheel has its bytecode already
            compileall.compile_dir(folder, maxlevels=depth, quiet=2, workers=1)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--full", action="store_true", default=False, help="run the whole fault matrix")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--full"):
        return
    skip = pytest.mark.skip(reason="part of the full matrix: run with --full")
    for item in items:
        # the marker, not ``item.keywords``: those hold every parent node's name too, and a
        # checkout in a directory named "full" (the session's name) skipped every test
        if item.get_closest_marker("full") is not None:
            item.add_marker(skip)
