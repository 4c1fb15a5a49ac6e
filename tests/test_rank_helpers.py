"""The processes a rank starts end with it when it fails (``tether/_core/descendants.py``).

Real processes: 2 ranks on gloo under ``tether.spawn`` and under torchrun, each with a
helper, a shell's grandchild and a detached helper (``jobs/rank_helpers.py``); rank 1
raises. A detached helper (a session of its own) is left running, as asked.
"""

from __future__ import annotations

import os

import pytest

from _core import lc_events as events
from _core import tail
from _harness import python, torchrun

BOUND = 60.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.timeout(120)
@pytest.mark.parametrize("launcher", ["spawn", "torchrun"])
def test_a_failed_ranks_helper_processes_end_with_it_and_a_detached_one_is_left(launcher: str) -> None:
    if launcher == "spawn":
        res = python("rank_helpers.py", "spawn", bound=BOUND)
    else:
        res = torchrun("rank_helpers.py", "torchrun", nproc=2, bound=BOUND)
    # 1. bounded: before, the helpers held the job's stdout open past the bound
    assert res.returncode is not None and res.elapsed < BOUND, tail(res)
    assert res.returncode != 0, tail(res)
    helpers = {e["rank"]: e for e in events(res, "helpers")}
    assert sorted(helpers) == [0, 1], tail(res)
    # 2. the survivor raised the documented error, naming rank 1
    survivor = {e["rank"]: e for e in events(res, "raised")}[0]
    assert (survivor["exc"], survivor["failing"]) == ("PeerFailure", 1), survivor
    # 3. the root cause
    assert "ValueError: injected failure 0.1 on rank 1" in res.stderr, tail(res)
    # 4. nothing of the job's left but what was detached on purpose (the harness ends those)
    detached = sorted(int(e["detached"]) for e in helpers.values())
    assert res.leftovers == detached, f"left: {res.leftovers}, detached: {detached}\n{tail(res)}"
    assert not any(_alive(pid) for e in helpers.values() for pid in e["ours"]), helpers
