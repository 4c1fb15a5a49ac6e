"""Shared pytest set-up: the ``--full`` flag for the whole fault matrix; SIGINT taken, as from a terminal."""

from __future__ import annotations

import signal

import pytest


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
