"""Printing once and logging with the rank in front (issue 11's helpers), in a real job."""

from __future__ import annotations

import pytest

import tether
from _harness import python


@pytest.mark.timeout(120)
def test_rank_print_and_get_logger_write_on_the_ranks_they_say() -> None:
    res = python("output_job.py", bound=60)
    assert res.returncode == 0, res.output[-3000:]
    out = res.stdout.splitlines()
    assert out.count("once 0.1") == 1
    assert sorted(line for line in out if line.endswith("from every rank")) == [
        f"[rank {r}] from every rank" for r in range(3)
    ]
    assert out.count("only rank 2") == 1
    assert sorted(line for line in out if "logged everywhere" in line) == [
        f"[rank {r}] logged everywhere" for r in range(3)
    ]
    assert res.stderr.splitlines().count("[rank 0] INFO logged on rank 0") == 1, res.stderr[-2000:]
    assert "logged on rank 0" not in res.stdout
    assert res.leftovers == []


def test_rank_print_refuses_a_rank_that_is_not_an_int() -> None:
    with pytest.raises(TypeError, match=r"^rank_print: rank must be an int or None, got '0'$"):
        tether.rank_print("x", rank="0")  # type: ignore[arg-type]
