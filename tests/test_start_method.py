"""How ``tether.spawn`` starts its workers: from a forkserver that imported tether and torch
once (the default where the platform has one), or with "spawn" when asked.

Either way a worker sees the launcher's environment of the moment it starts, also in a
second job of the same launcher, where the forkserver started for the first one forks it.
"""

from __future__ import annotations

import json
import multiprocessing

import pytest

from _harness import python

BOUND = 60.0

pytestmark = pytest.mark.timeout(BOUND + 30)


def workers(stdout: str) -> list[dict[str, object]]:
    return sorted(
        (json.loads(line[len("WORKER ") :]) for line in stdout.splitlines() if line.startswith("WORKER ")),
        key=lambda w: (w["job"], w["rank"]),  # type: ignore[arg-type,return-value]
    )


@pytest.mark.skipif("forkserver" not in multiprocessing.get_all_start_methods(), reason="no forkserver here")
def test_workers_fork_from_a_server_with_torch_imported_and_see_the_launchers_environment_of_each_job() -> None:
    res = python("spawn_env.py", bound=BOUND)
    assert res.returncode == 0, res.output[-3000:]
    assert workers(res.stdout) == [
        {"job": job, "rank": rank, "value": value, "parent_is_launcher": False, "torch_preloaded": True}
        for job, value in enumerate(["first", "second"])
        for rank in (0, 1)
    ], res.output[-3000:]
    assert res.leftovers == []


def test_spawn_when_asked_starts_each_worker_afresh_from_the_launcher() -> None:
    res = python("spawn_env.py", "spawn", bound=BOUND)
    assert res.returncode == 0, res.output[-3000:]
    assert workers(res.stdout) == [
        {"job": job, "rank": rank, "value": value, "parent_is_launcher": True, "torch_preloaded": False}
        for job, value in enumerate(["first", "second"])
        for rank in (0, 1)
    ], res.output[-3000:]
    assert res.leftovers == []
