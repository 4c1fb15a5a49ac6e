"""What a person sees when a job fails (issue 11): the real output of each launcher, counted.

Each test runs a real job (``jobs/output_failure.py``: rank 1 raises inside
``one_rank_first``, called from ``main`` through ``prepare``) and counts what reached the
terminal: how often the root cause's message appears, how many tracebacks, no warning
lines, the launcher's exit code and every rank's. Plus the four asserts of every failure
test: in bound, the survivors stopped with the documented error, the root cause named,
nothing left. One test (``jobs/output_host_gone.py``) checks that a rank whose store host
has gone ends without a word to the closed store; one (``jobs/output_killed.py``) that the
survivors of a rank killed mid-collective end at once, without a warning; one
(``jobs/output_stop_in_finalize.py``) that a launcher's stop in ``finalize()`` after a
failure ends the rank with the failure's code; one (``jobs/output_stop_in_start.py``)
that a rank still in ``initialize`` when its peer fails ends as any victim does.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from _core import lc_events
from _harness import Result, free_port, python, torchrun
from _torchrun_report import blamed, other_failures, root_cause
from tether import ExitCode

BOUND = 90.0
ROOT = "RuntimeError: download failed 0.1 on rank 1"

pytestmark = pytest.mark.timeout(BOUND + 60)


def assert_quiet(res: Result) -> None:
    """No warnings of any kind (NumPy, c10d sockets, Python's) in the job's output."""
    noisy = [line for line in res.output.splitlines() if "warning" in line.lower()]
    assert noisy == [], noisy


def assert_users_frames_first(traceback: str) -> None:
    """The root cause's traceback reads from the user's ``main`` down to the raise."""
    frames = re.findall(r'File "[^"]*output_failure\.py", line \d+, in (\w+)', traceback)
    assert frames[-2:] == ["main", "prepare"], traceback
    assert "contextlib.py" not in traceback and "/tether/" not in traceback, traceback


@pytest.mark.parametrize("nproc", [pytest.param(2, marks=pytest.mark.full), 4])
def test_a_failing_parallel_job_prints_one_report_and_exits_7(nproc: int) -> None:
    res = python("output_failure.py", "spawn", str(nproc), bound=BOUND)
    assert res.returncode == int(ExitCode.LAUNCH_FAILED), res.output[-3000:]
    assert res.stdout == ""
    err = res.stderr
    assert err.count(ROOT) == 4  # headline, the traceback's last line, rank 1's line, the summary line
    assert err.count("Traceback (most recent call last)") == 1, err
    assert_users_frames_first(err)
    ranks = dict(re.findall(r"^  rank (\d+): (.*)$", err, re.M))
    assert ranks.pop("1") == f"ROOT CAUSE: {ROOT} (exited with code 1)"
    assert ranks == {str(r): "stopped: PEER_FAILED (exited with code 3)" for r in range(nproc) if r != 1}
    assert err.rstrip().splitlines()[-1] == f"tether.JobFailed: job failed: rank 1 failed: {ROOT} (exit code 7)"
    assert_quiet(res)
    assert res.leftovers == []


def test_the_same_bad_argument_on_every_rank_is_reported_once_without_a_culprit() -> None:
    res = python("report_bad_argument.py", bound=BOUND)
    assert res.returncode == int(ExitCode.LAUNCH_FAILED), res.output[-3000:]
    err = res.stderr
    message = "ValueError: rank should be between 0 and 1, but given 5 (one_rank_first)"
    assert f"tether: job failed. Every rank raised {message}\n" in err, err
    assert "Root cause" not in err and "ROOT CAUSE" not in err and "Consequences" not in err, err
    assert err.count("Traceback (most recent call last)") == 1, err
    assert re.findall(r"^  rank (\d+): (.*)$", err, re.M) == [
        ("0", "raised it (exited with code 1)"),
        ("1", "raised it (exited with code 1)"),
    ]
    assert err.rstrip().splitlines()[-1] == f"tether.JobFailed: job failed: every rank raised {message} (exit code 7)"
    assert_quiet(res)
    assert res.leftovers == []


@pytest.mark.parametrize("nproc", [pytest.param(2, marks=pytest.mark.full), 4])
def test_a_failing_torchrun_job_shows_the_traceback_once_and_one_line_per_victim(nproc: int) -> None:
    res = torchrun("output_failure.py", "torchrun", nproc=nproc, bound=BOUND, env={"OMP_NUM_THREADS": "1"})
    assert res.returncode == 1, res.output[-3000:]  # torchrun's own code for a failed job
    err = res.stderr
    ours = [line for line in err.splitlines() if line.startswith("[rank ")]
    assert sorted(ours) == sorted(
        [f"[rank 1] failed: {ROOT} (its traceback is in torchrun's Root Cause report)"]
        + [
            f"[rank {r}] stopped: PeerFailure: rank 1 failed: {ROOT} (in one_rank_first(rank=1, local=False) #1, "
            f"at {res_path()}:{gate_line()} in prepare)"
            for r in range(nproc)
            if r != 1
        ]
    ), err
    # two tracebacks: torchrun's own ChildFailedError, and rank 1's inside its Root Cause section
    assert err.count("Traceback (most recent call last)") == 2, err
    root = root_cause(err)
    assert (root.rank, root.exitcode) == (1, 1), root.text
    assert_users_frames_first(root.traceback)
    others = other_failures(err)
    assert {r: e.exitcode for r, e in others.items()} == {r: int(ExitCode.PEER_FAILED) for r in range(nproc) if r != 1}
    assert all(e.traceback.startswith("PeerFailure: rank 1 failed: " + ROOT) for e in others.values()), err
    # the root message: once per rank's line, once per victim's summary entry, twice in the root's traceback
    assert err.count(ROOT) == nproc + (nproc - 1) + 1, err
    assert_quiet(res)
    assert res.leftovers == []


def test_a_victim_still_in_its_atexit_when_torchrun_sends_sigterm_exits_with_its_own_code() -> None:
    res = torchrun(
        "output_failure.py", "torchrun", nproc=2, bound=BOUND, env={"OMP_NUM_THREADS": "1", "OUTPUT_SLOW_ATEXIT": "20"}
    )
    ended = time.time()
    assert res.returncode == 1, res.output[-3000:]
    (started,) = (float(line.split()[1]) for line in res.stdout.splitlines() if line.startswith("SLOW_ATEXIT "))
    # the SIGTERM ended the 20 s atexit: torchrun did not wait for SIGKILL (from the atexit's
    # start, not the job's: a resolver that never answers adds 10 s per store connection)
    assert ended - started < 10, ended - started
    root, others = root_cause(res.stderr), other_failures(res.stderr)
    assert (root.rank, root.exitcode) == (1, 1) and list(others) == [0], res.stderr
    assert others[0].exitcode == int(ExitCode.PEER_FAILED), res.stderr
    assert others[0].traceback.startswith("PeerFailure: rank 1 failed: " + ROOT), res.stderr
    assert "[rank 0] stopped: PeerFailure: rank 1 failed: " + ROOT in res.stderr
    assert res.leftovers == []


def test_survivors_of_a_rank_killed_in_a_collective_end_at_once_under_torchrun_without_a_warning() -> None:
    # Each survivor learns of rank 0's death itself (torchrun polls every 5 s here, so its
    # SIGTERM mostly comes after), with its all_reduce left pending on the dead rank, and
    # ends through tether's excepthook: exit functions, then os._exit. tether's exit
    # function used to wait lent.SETTLE (2 s) there for the pending work, which no teardown
    # followed, and print a SIGABRT warning on every survivor (seen with examples/train.py).
    for _ in range(2):  # a poll of torchrun's before any survivor's notice shows nothing: once more
        res = torchrun(
            "output_killed.py", nproc=4, bound=BOUND, env={"OMP_NUM_THREADS": "1"}, launcher=("--monitor_interval", "5")
        )
        lines = re.findall(r"^(EXITFUNCS|EXITING) (\d) ([\d.]+)$", res.stdout, re.M)
        said = {(what, int(rank)): float(t) for what, rank, t in lines}
        started = {r: said[("EXITFUNCS", r)] for r in (1, 2, 3) if ("EXITFUNCS", r) in said}
        if started:
            break
    assert res.returncode == 1, res.output[-3000:]  # torchrun's code for a failed job
    lost = "PeerLost: rank 0 failed: Lost: its process ended without a word"
    for rank in (1, 2, 3):
        assert f"[rank {rank}] stopped: {lost}" in res.stderr, res.output[-3000:]
    # rank 0, killed, is the root cause, or the victim torchrun saw first names it
    root, others = root_cause(res.stderr), other_failures(res.stderr)
    codes = {root.rank: root.exitcode} | {r: e.exitcode for r, e in others.items()}
    assert blamed(root) == 0 and codes == {0: -9, **dict.fromkeys((1, 2, 3), int(ExitCode.PEER_FAILED))}, res.stderr
    assert started, f"no survivor ran its exit functions (all stopped by torchrun's SIGTERM?)\n{res.output[-3000:]}"
    # in tether's exit function: 2 s before the fix (or until torchrun's SIGTERM ended it there), ms now
    took = {r: said.get(("EXITING", r), float("inf")) - t for r, t in started.items()}
    assert all(t < 1.0 for t in took.values()), took
    assert "still hold" not in res.stderr, res.stderr[-3000:]
    assert_quiet(res)
    assert res.leftovers == []


@pytest.mark.parametrize("where", ["watchdog", "uninstalled"])
def test_a_stop_that_lands_in_finalize_after_a_failure_ends_the_rank_with_the_failures_code(where: str) -> None:
    env = {"OMP_NUM_THREADS": "1", "STOP_AT": where}
    res = torchrun("output_stop_in_finalize.py", nproc=2, bound=BOUND, env=env)
    assert res.returncode == 1, res.output[-3000:]  # torchrun's code for a failed job
    root, others = root_cause(res.stderr), other_failures(res.stderr)
    assert (root.rank, root.exitcode) == (1, 1) and ROOT in root.traceback, res.stderr
    # rank 0: the peer's failure, with its code (before: -15 both ways here; 143 through
    # Python's teardown in the fault matrix, where the handler's Terminated cut the retire short)
    assert list(others) == [0] and others[0].exitcode == int(ExitCode.PEER_FAILED), res.stderr
    assert others[0].traceback.startswith("PeerFailure: rank 1 failed: " + ROOT), res.stderr
    said = [line for line in res.stderr.splitlines() if line.startswith("[rank 0] stopped: ")]
    assert len(said) == 1 and said[0].startswith("[rank 0] stopped: PeerFailure: rank 1 failed: " + ROOT), res.stderr
    assert "teardown may abort" not in res.stderr, res.stderr[-3000:]
    assert res.leftovers == []


@pytest.mark.parametrize("where", ["stopped", pytest.param("raised", marks=pytest.mark.full)])
def test_a_rank_still_in_initialize_when_its_peer_fails_ends_with_the_peers_failure(where: str) -> None:
    env = {"OMP_NUM_THREADS": "1", "STOP_AT": where}
    start = time.monotonic()
    res = torchrun("output_stop_in_start.py", nproc=2, bound=BOUND, env=env)
    assert time.monotonic() - start < BOUND
    assert res.returncode == 1, res.output[-3000:]  # torchrun's code for a failed job
    root, others = root_cause(res.stderr), other_failures(res.stderr)
    assert (root.rank, root.exitcode) == (1, 1) and ROOT in root.traceback, res.stderr
    # rank 0: the peer's failure, with its code (before: -15 without a word when torchrun's
    # SIGTERM came first, else Python's traceback of the PeerFailure and exit code 1)
    assert list(others) == [0] and others[0].exitcode == int(ExitCode.PEER_FAILED), res.stderr
    said = [line for line in res.stderr.splitlines() if line.startswith("[rank 0] ")]
    assert len(said) == 1 and said[0].startswith("[rank 0] stopped: PeerFailure: rank 1 failed: " + ROOT), res.stderr
    assert "tether.PeerFailure" not in res.stderr, res.stderr[-3000:]  # no traceback of it
    assert res.leftovers == []


def res_path() -> str:
    from _harness import JOBS

    return str(JOBS / "output_failure.py")


def gate_line() -> int:
    """The line a victim's error points at: where rank 1 leaves ``one_rank_first`` (its raise)."""
    lines = Path(res_path()).read_text().splitlines()
    return next(n for n, line in enumerate(lines, 1) if "raise RuntimeError" in line)


def test_a_stalled_rank_whose_store_host_has_gone_ends_without_writing_to_the_closed_store() -> None:
    res = python("output_host_gone.py", str(free_port()), bound=BOUND)
    assert res.returncode is not None and res.elapsed < BOUND, res.output[-3000:]
    raised = {e["rank"]: e for e in lc_events(res, "raised")}
    assert raised[0]["exc"] == "SyncTimeout" and "rank(s) [1] did not arrive" in raised[0]["msg"], raised
    assert "ProcessRaisedException" in res.stderr and "did not arrive" in res.stderr  # mp.spawn's report
    assert 1 in raised and raised[1]["exc"] == "Terminated", res.output[-3000:]  # mp.spawn's SIGTERM, in user code
    assert "could not post" not in res.output, res.output[-3000:]
    assert "sendBytes failed" not in res.output and "frame #" not in res.output, res.output[-3000:]
    assert res.returncode != 0
    assert res.leftovers == []
