"""Shared pytest set-up: the ``--full`` flag for the whole fault matrix."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--full", action="store_true", default=False, help="run the whole fault matrix")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--full"):
        return
    skip = pytest.mark.skip(reason="part of the full matrix: run with --full")
    for item in items:
        if "full" in item.keywords:
            item.add_marker(skip)
