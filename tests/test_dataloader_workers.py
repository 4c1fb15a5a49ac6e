"""A rank's DataLoader worker processes end with the job, whatever ended the rank.

Real processes: ``tether.spawn``, 2 ranks on gloo, each reading through a
``DataLoader(num_workers=2)``; rank 1 raises or is SIGKILLed mid-epoch
(``jobs/dataloader_workers.py`` tells why this once left processes running forever).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from _core import lc_events as events
from _core import tail
from _harness import python
from tether import ExitCode

BOUND = 60.0
# torch's DataLoader workers check every 5 s whether the process that started them is alive
# (``MP_STATUS_CHECK_INTERVAL``): the workers of a SIGKILLed rank, which nothing can end for it
WORKERS_NOTICE = 5.0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["raise", "kill"])
def test_a_failed_job_leaves_no_dataloader_worker_behind(how: str, tmp_path: Path) -> None:
    res = python("dataloader_workers.py", how, str(tmp_path), bound=BOUND, settle=WORKERS_NOTICE + 2.0)
    # 1. bounded, and a failure
    assert res.returncode == int(ExitCode.LAUNCH_FAILED), tail(res)
    workers = {e["rank"]: e for e in events(res, "workers")}
    assert sorted(workers) == [0, 1], tail(res)
    # the start method the launcher has (the platform's default here), as under torchrun
    assert {e["start_method"] for e in workers.values()} == {"fork"}, workers
    # a worker, forked from its rank, has Python's hooks, not tether's, and the rank's rank
    hooks = sorted(events(res, "worker hooks"), key=lambda e: e["rank"])
    assert [e["rank"] for e in hooks] == [0, 1], hooks
    assert not any(str(m).startswith("tether") for e in hooks for m in e["modules"]), hooks
    # 2. the survivor raised the documented error, naming rank 1
    survivor = {e["rank"]: e for e in events(res, "raised")}[0]
    expected = "PeerFailure" if how == "raise" else "PeerLost"
    assert (survivor["exc"], survivor["failing"]) == (expected, 1), survivor
    # 3. the root cause, once
    root = "ValueError: injected failure 0.1 on rank 1" if how == "raise" else "SIGKILL"
    assert res.stderr.count("Root cause: rank 1 failed: ") == 1 and root in res.stderr, tail(res)
    # 4. nothing left: not the ranks, not their workers, not a multiprocessing server;
    # a rank that tether ended took its workers with it (1 s after the launcher's spawn
    # returned); a SIGKILLed one's end themselves within torch's check
    (left,) = events(res, "left")
    if how == "raise":
        assert left["workers"] == [], left
    assert res.leftovers == [], f"left: {res.leftovers}\n{tail(res)}"


@pytest.mark.timeout(120)
def test_a_dataloader_worker_ending_with_a_thread_running_does_not_end_its_rank() -> None:
    # 075f8a3's hook for the end of the main thread ran in the forked worker too, and
    # recorded its rank's exit: rank 0 raised PeerFinished naming rank 1 in the next barrier
    res = python("dataloader_thread.py", bound=BOUND)
    assert res.returncode == 0, tail(res)
    done = {e["rank"]: e["total"] for e in events(res, "done")}
    assert done == {0: 960.0, 1: 960.0}, done  # 2 epochs x (0 + ... + 15) x 2 features x 2 ranks summed
    assert res.leftovers == []
