"""How ``tether.spawn`` starts its workers: from a forkserver that imported tether and torch
once (the default where the platform has one), or with "spawn" when asked.

Either way a worker sees the launcher's environment of the moment it starts, also in a
second job of the same launcher, where the forkserver started for the first one forks it.
And a launcher's stop ends the workers alike, whatever the start method ("fork" too).
"""

from __future__ import annotations

import json
import multiprocessing
import re

import pytest

from _harness import python

BOUND = 60.0

pytestmark = pytest.mark.timeout(BOUND + 30)


def workers(stdout: str) -> list[dict[str, object]]:
    return sorted(
        (json.loads(line[len("WORKER ") :]) for line in stdout.splitlines() if line.startswith("WORKER ")),
        key=lambda w: (w["job"], w["rank"]),  # type: ignore[arg-type,return-value]
    )


no_forkserver = pytest.mark.skipif("forkserver" not in multiprocessing.get_all_start_methods(), reason="none here")


@pytest.mark.parametrize(
    ("args", "forked_from_server"),
    [
        pytest.param((), True, marks=no_forkserver, id="default-forkserver"),
        pytest.param(("spawn",), False, id="spawn", marks=pytest.mark.full),
    ],
)
def test_each_worker_sees_the_launchers_environment_of_its_job_and_torch_comes_preloaded_only_from_the_server(
    args: tuple[str, ...], forked_from_server: bool
) -> None:
    res = python("spawn_env.py", *args, bound=BOUND)
    assert res.returncode == 0, res.output[-3000:]
    expected = {"parent_is_launcher": not forked_from_server, "torch_preloaded": forked_from_server}
    assert workers(res.stdout) == [
        {"job": job, "rank": rank, "value": value, **expected}
        for job, value in enumerate(["first", "second"])
        for rank in (0, 1)
    ], res.output[-3000:]
    assert res.leftovers == []


@pytest.mark.parametrize(
    ("method", "where"),
    [
        pytest.param("forkserver", "barrier", marks=no_forkserver),
        pytest.param("spawn", "barrier", marks=pytest.mark.full),
        ("fork", "barrier"),
        pytest.param("forkserver", "finalize", marks=no_forkserver),
    ],
)
def test_a_stopped_launcher_stops_its_workers_alike_whatever_the_start_method(method: str, where: str) -> None:
    res = python("spawn_stop.py", method, where, bound=BOUND)
    assert res.returncode == 143 and res.elapsed < 30, res.output[-3000:]
    stopped = re.findall(r"^tether: job stopped \(SIGTERM\); every rank stopped \((.*)\)$", res.stderr, re.M)
    assert len(stopped) == 1, res.output[-3000:]
    # the stop, or a peer's; or SIGTERM's default action, for a rank whose function had returned
    # and whose clean exit had put tether's handler back (seen once under load: "rank 0: killed
    # by SIGTERM", baa74aa and later)
    codes = dict(re.findall(r"rank (\d): (?:exited with code |killed by )(\d+|SIGTERM)", stopped[0]))
    assert set(codes) == {"0", "1"} and set(codes.values()) <= {"3", "143", "SIGTERM"}, stopped[0]
    assert "Traceback" not in res.output and "RecursionError" not in res.output, res.output[-3000:]
    assert res.leftovers == []


@no_forkserver
def test_a_process_the_launcher_starts_from_its_forkserver_after_spawn_can_be_terminated() -> None:
    res = python("spawn_then_process.py", bound=BOUND)
    assert res.returncode == 0, res.output[-3000:]
    # tether's server keeps SIGTERM blocked; a process that inherited that ran on (None)
    assert "TERMINATED -15" in res.stdout, res.output[-3000:]
    assert res.leftovers == []
