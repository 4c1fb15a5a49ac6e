"""Every code of the exit-code table (``tether.ExitCode``, README) is produced where it says.

One real 2-rank ``tether.spawn`` job per row (``jobs/exit_codes.py``); the launcher's own
exit code and every worker's exit status are read from the job's output. The launcher's
Ctrl-C (130) is in ``test_report.py``.
"""

from __future__ import annotations

import ast

import pytest

from _harness import python
from tether import ExitCode

BOUND = 60.0

CASES = {
    # case: (worker exit statuses, launcher's code, the root cause's headline in the report)
    "ok": ({0: ExitCode.OK, 1: ExitCode.OK}, ExitCode.OK, None),
    "raised": (
        {0: ExitCode.PEER_FAILED, 1: ExitCode.RAISED},
        ExitCode.LAUNCH_FAILED,
        "rank 1 failed: RuntimeError: raised 0.1 on rank 1",
    ),
    "timeout": (
        {0: ExitCode.TIMEOUT, 1: ExitCode.WATCHDOG},
        ExitCode.LAUNCH_FAILED,
        "SyncTimeout: barrier #2 timed out after 1 s: rank(s) [1] did not arrive",
    ),
    "mismatch": (
        {0: ExitCode.MISMATCH, 1: ExitCode.MISMATCH},
        ExitCode.LAUNCH_FAILED,
        "SyncMismatch: ranks entered different syncs: rank 0: barrier #2; rank 1: all_reduce(SUM, float64[])",
    ),
    "watchdog": (
        {0: ExitCode.WATCHDOG, 1: ExitCode.RAISED},
        ExitCode.LAUNCH_FAILED,
        "rank 1 failed: RuntimeError: raised 0.1 on rank 1",
    ),
    "signal": (
        {0: ExitCode.PEER_FAILED, 1: -9},
        ExitCode.LAUNCH_FAILED,
        "rank 1 failed: SIGKILL: process killed by SIGKILL",
    ),
}


@pytest.mark.timeout(BOUND + 30)
@pytest.mark.parametrize("case", sorted(CASES))
def test_each_exit_code_of_the_table_is_produced_where_it_says(case: str) -> None:
    ranks, launcher, root = CASES[case]
    res = python("exit_codes.py", case, bound=BOUND)
    assert res.returncode == int(launcher), res.output[-3000:]
    (line,) = [line for line in res.stdout.splitlines() if line.startswith("CODES ")]
    assert dict(ast.literal_eval(line[len("CODES ") :])) == {r: int(c) for r, c in ranks.items()}, res.output[-3000:]
    if root is None:
        assert "job failed" not in res.stderr
    else:
        (headline,) = [line for line in res.stderr.splitlines() if line.startswith("tether: job failed. Root cause: ")]
        assert headline.endswith(root), res.stderr  # a timeout's or a mismatch's is posted by whoever saw it
        names = {int(c): c.name for c in ExitCode}
        for rank, code in ranks.items():
            if (
                code in names
                and code not in (ExitCode.RAISED, ExitCode.OK)
                and not res.stderr.count(f"rank {rank}: ROOT CAUSE")
            ):
                assert f"rank {rank}: stopped: {names[int(code)]} (exited with code {int(code)})" in res.stderr
    assert "warning" not in res.output.lower(), res.output[-3000:]  # no c10d socket warnings on a timeout
    assert res.leftovers == []
