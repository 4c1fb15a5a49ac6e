"""A rank that finishes is not waited for (issue 8, item 6): real jobs of ``jobs/finish_early.py``.

Rank 1 finishes (returns, ``sys.exit(0)``, ``finalize()``) while rank 0 waits for it in a
barrier or an all_reduce. Rank 0 raises ``PeerFinished`` saying how rank 1 finished and
where rank 0 waits, within the bound: the first check comes 0.5 s into a wait
(``waits.LEFT_CHECK_AFTER``), then every keeper period (0.5 s). Last, the victim's wait
for a finished peer's exit (``hooks.after_finished_peer``) against a real child process.
"""

from __future__ import annotations

import re

import pytest

from _core import lc_events
from _harness import Result, python, torchrun

BOUND = 90.0
NOTICE_S = 3.0  # 0.5 s before the first check + a keeper period, with slack for a loaded machine

pytestmark = pytest.mark.timeout(BOUND + 60)


def check(res: Result, how: str, where: str) -> None:
    (finish,) = lc_events(res, "finish")
    (e,) = lc_events(res, "raised")
    # rank 0's wait begins when rank 1 finished, or (exit2) once rank 1's exit functions ran
    began = max(float(w["time"]) for w in [finish, *lc_events(res, "waits")])
    assert (e["rank"], e["exc"], e["failing"]) == (0, "PeerFinished", 1), e
    message = f"rank 1 failed: Finished: it {how} while rank 0 waits in {where}"
    assert e["msg"] == message, e
    assert "PeerFailure" in e["mro"], e  # code that catches PeerFailure catches it too
    assert float(e["time"]) - began < NOTICE_S
    assert message in res.stderr, res.stderr[-3000:]
    assert res.leftovers == []


@pytest.mark.parametrize(
    ("how", "args", "story", "where"),
    [
        ("return", (), "returned from the function", "barrier #2"),
        pytest.param(
            "exit0", ("--collective",), "called sys.exit(0)", "all_reduce(SUM, float64[]) #2", marks=pytest.mark.full
        ),
    ],
)
def test_a_rank_that_finishes_under_spawn_is_not_waited_for(
    how: str, args: tuple[str, ...], story: str, where: str
) -> None:
    res = python("finish_early.py", "spawn", how, *args, bound=BOUND)
    assert res.returncode == 7, res.output[-3000:]
    check(res, story, where)
    (launcher,) = lc_events(res, "launcher")
    assert launcher["exit_codes"] == {"0": 3, "1": 0}
    assert "  rank 1: finished" in res.stderr and "  rank 0: stopped: PEER_FAILED (exited with code 3)" in res.stderr


@pytest.mark.parametrize(
    ("args", "where"),
    [((), "barrier #2"), pytest.param(("--collective",), "all_reduce(SUM, float64[]) #2", marks=pytest.mark.full)],
)
def test_a_rank_that_finishes_under_torchrun_is_not_waited_for(args: tuple[str, ...], where: str) -> None:
    res = torchrun("finish_early.py", "torchrun", "finalize", *args, nproc=2, bound=BOUND)
    assert res.returncode == 1, res.output[-3000:]
    check(res, "called finalize()", where)
    assert "PeerLost" not in res.output  # not "its process stopped answering": it finished


@pytest.mark.parametrize(
    ("how", "story", "code", "slow"),
    [
        # torchrun's SIGTERM (it follows rank 1's exit 2) reaches rank 0 about when its first
        # check of finished ranks would; the SIGTERM came first and rank 0 blamed itself,
        # "Terminated: stopped by SIGTERM", naming no rank 1 (before this test)
        ("exit2", "exited without finalize()", 2, 0.0),
        # rank 1's teardown outlasts rank 0's notice and exit: torchrun SIGTERMed rank 1 in
        # it, and its report said "exitcode: -15" for rank 1 (on 7b2730f's src; now and then
        # in a suite's run without the slow teardown)
        ("exit2", "exited without finalize()", 2, 1.5),
        # rank 1's process lives on in its non-daemon thread: rank 0 waited for good (before this test)
        (
            "exit-thread",
            "ended its main thread without finalize() (its process waits for thread(s) logger)",
            128 + 15,  # torchrun's SIGTERM ends it, as it would without tether
            0.0,
        ),
    ],
    ids=["exit2", "exit2-slow-teardown", "exit-thread"],
)
def test_a_rank_whose_sys_exit_reaches_the_top_under_torchrun_is_not_waited_for(
    how: str, story: str, code: int, slow: float
) -> None:
    env = {"FINISH_EARLY_SLOW_EXIT": str(slow)}
    res = torchrun("finish_early.py", "torchrun", how, nproc=2, bound=BOUND, env=env)
    assert res.returncode == 1, res.output[-3000:]
    assert res.elapsed < BOUND
    check(res, story, "barrier #2")
    assert re.search(rf"rank\s*: 1 \(local_rank: 1\)\n\s*exitcode\s*: {code} ", res.output), res.output[-3000:]
    assert re.search(r"rank\s*: 0 \(local_rank: 0\)\n\s*exitcode\s*: 3 ", res.output), res.output[-3000:]
    assert "Terminated" not in res.output, res.output[-3000:]  # no rank tells of its own stop


def test_a_rank_that_calls_os_exit_0_under_torchrun_is_not_waited_for() -> None:
    res = torchrun("finish_early.py", "torchrun", "os-exit0", nproc=2, bound=BOUND)
    assert res.returncode == 1, res.output[-3000:]
    check(res, "called os._exit(0)", "barrier #2")


def test_a_rank_that_calls_os_exit_0_is_not_lost_while_the_others_work_on() -> None:
    # os._exit(0) after the last collective skips a teardown that may hang; a peer still at
    # work (a final save on rank 0) needs it no more. It ran no exit function, so nothing
    # recorded its leave: rank 0's judge found its process gone "without a word", and the
    # ladder ended rank 0, 5 s into its work, with exit 6 (before this test)
    res = torchrun("finish_early.py", "torchrun", "os-exit0", nproc=2, bound=BOUND, env={"FINISH_EARLY_WORK": "8"})
    assert res.returncode == 0, res.output[-3000:]
    (worked,) = lc_events(res, "worked")
    assert worked["rank"] == 0 and worked["seconds"] >= 8.0, worked
    assert "PeerLost" not in res.output and "ended without a word" not in res.output, res.output[-3000:]
    assert res.leftovers == []


def test_uneven_data_under_join_trains_in_step_and_ends_without_a_warning() -> None:
    # the remedy the migration guide gives: each Join forward's async all-reduce, which DDP's
    # reducer waits for in C++ and keeps, looked in flight at exit: every rank waited 2 s and
    # warned "the backend's threads still hold 1 tensor(s) ... may abort this process"
    res = python("join_uneven.py", bound=BOUND)
    assert res.returncode == 0, res.output[-3000:]
    weights = {e["rank"]: e for e in lc_events(res, "weights")}
    assert (weights[0]["steps"], weights[1]["steps"]) == (5, 8)
    assert weights[0]["weights"] == weights[1]["weights"]  # rank 0 shadowed rank 1's last steps
    assert "tether:" not in res.stderr, res.stderr[-3000:]
    assert res.leftovers == []


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("pidns", "waits"), [("ours", True), ("pid:[1]", False)])
def test_a_victim_waits_for_a_finished_peers_exit_only_in_its_own_pid_namespace(pidns: str, waits: bool) -> None:
    # A victim of a peer that finished on its host waits (up to hooks.FINISHING, 5 s) for
    # the peer's process to end before it exits. The peer's pid names that process only in
    # its own pid namespace: a pod sharing the host's name (hostNetwork) has another, where
    # the pid names some other process or none. Matched by host name alone, the victim
    # waited for an unrelated process here (this test's second case, before the fix).
    import socket
    import subprocess
    import sys
    import time

    from tether._core.hooks import after_finished_peer
    from tether._core.liveness import pid_namespace
    from tether._core.record import KIND_FINISHED, error_from_record, lost_record

    ours = pid_namespace()
    if not ours:
        pytest.skip("/proc does not name this process's pid namespace")
    peer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    try:
        record = lost_record(
            1, "it returned", 0, kind=KIND_FINISHED, exc_type="Finished", pid=peer.pid, host=socket.gethostname()
        )
        record.detail["pidns"] = ours if pidns == "ours" else pidns
        started = time.monotonic()
        after_finished_peer(error_from_record(record))
        waited = time.monotonic() - started
    finally:
        peer.wait()
    assert (waited >= 0.3) if waits else (waited < 0.2), waited
