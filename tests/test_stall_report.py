"""A wait without timeout logs one stall report, naming who is missing and where, and goes on."""

from __future__ import annotations

import re

import pytest

from _harness import python


@pytest.mark.timeout(200)
def test_a_long_wait_without_timeout_logs_one_stall_report_and_completes() -> None:
    res = python("stall_report.py", bound=150)
    assert res.returncode == 0, res.output[-3000:]
    assert res.leftovers == []
    assert sorted(re.findall(r"RESULT rank=(\d) passed the barrier", res.stdout)) == ["0", "1"]
    reports = re.findall(r"tether: rank 0 has waited \d+ s in barrier #\d+:", res.stderr)
    assert len(reports) == 1, res.stderr[-3000:]
    assert re.search(r"rank 1: in user code\n(.|\n)*in slow_preprocessing", res.stderr), res.stderr[-3000:]
    assert res.stderr.count("in slow_preprocessing") == 1, res.stderr[-3000:]  # the stalled stack, once
    # the user's frames, from their function in: multiprocessing's and tether's are counted, not shown
    stack = res.stderr.split("rank 1: in user code\n", 1)[1].split("RESULT", 1)[0]
    files = re.findall(r'File "([^"]+)", line \d+, in (\w+)', stack)
    assert [name for _, name in files] == ["main", "slow_preprocessing"], stack
    assert re.match(r"  \[\d+ frame\(s\) of tether, contextlib or multiprocessing not shown\]\n", stack), stack
    assert "warning" not in res.output.lower(), res.output[-3000:]  # no c10d socket warnings from the wait


@pytest.mark.timeout(200)
def test_waits_outside_tether_log_one_stall_report_each_and_complete() -> None:
    # a raw collective and a wait on a store: each names itself and the rank it waits for
    res = python("stall_report.py", "raw", bound=150)
    assert res.returncode == 0, res.output[-3000:]
    assert res.leftovers == []
    assert sorted(re.findall(r"RESULT rank=(\d) passed the raw waits", res.stdout)) == ["0", "1"]
    reports = re.findall(r"tether: rank 0 has waited \d+ s in (.*):\n  rank 1: in user code\n", res.stderr)
    assert reports == ["dist.all_reduce (outside tether)", "store.get('ready') (outside tether)"], res.stderr[-3000:]
    assert res.stderr.count("in slow_preprocessing") == 2, res.stderr[-3000:]  # rank 1's stack in each
    assert "warning" not in res.output.lower(), res.output[-3000:]  # no c10d socket warnings from the waits
