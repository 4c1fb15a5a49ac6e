"""SIGINT and SIGTERM are honoured within 0.5 s wherever tether waits (issue 7, part 5).

Rank 0 waits in ``tether.barrier()`` that rank 1 never joins; rank 1 sends the signal to
rank 0's process and measures how long rank 0 took to raise KeyboardInterrupt/SystemExit
(or to be gone). Then rank 1 enters a barrier itself and must raise PeerFailure naming
rank 0. Launchers: ``tether.spawn`` (signal to the rank process), torchrun (to the worker),
and plain ``tether.initialize`` in 2 processes that the job script starts.

Job: ``tests/jobs/lifecycle_signals.py``. Each test asserts the bound, the exceptions of
both ranks, the root cause (rank 0, the signal) in the output, and that no process is left.

torchrun's own SIGTERM to a victim (0.1 s after a worker exited) must not cost it its
error file or its exit code, wherever it lands: inside the post of its failure
(``torchrun_stop_in_post.py``), or in user code while a thread is inside torch
(``torchrun_stop_in_user_code.py``: Python's teardown would abort the process). There the
root cause is rank 1's error, and rank 0 must exit 3 with an error file that says it.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from _core import lc_events as events
from _core import tail
from _harness import Result, python, torchrun
from _torchrun_report import blamed, other_failures, root_cause

BOUND = 90.0
LATENCY = 0.5
SPAWN_REPORT = "tether: job failed. Root cause: "
full = pytest.mark.full


def names_signal(text: str, signame: str) -> bool:
    return signame in text or (signame == "SIGINT" and "KeyboardInterrupt" in text)


def run_job(launcher: str, signame: str, out: Path) -> Result:
    if launcher == "torchrun":
        return torchrun("lifecycle_signals.py", "torchrun", signame, str(out), nproc=2, bound=BOUND)
    return python("lifecycle_signals.py", launcher, signame, str(out), bound=BOUND)


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    ("launcher", "signame"),
    [
        ("spawn", "SIGTERM"),
        pytest.param("spawn", "SIGINT", marks=full),
        ("torchrun", "SIGTERM"),
        pytest.param("torchrun", "SIGINT", marks=full),
        ("plain", "SIGINT"),
        pytest.param("plain", "SIGTERM", marks=full),
    ],
)
def test_a_signal_to_a_rank_waiting_in_barrier_is_honoured_within_half_a_second(
    launcher: str, signame: str, tmp_path: Path
) -> None:
    res = run_job(launcher, signame, tmp_path)
    # 1. bounded, and a failure
    assert res.returncode is not None, f"the job did not end within {BOUND} s\n{tail(res)}"
    assert res.returncode != 0, f"a job whose rank was stopped by {signame} must not exit 0\n{tail(res)}"
    assert events(res, "sent"), f"rank 1 never sent {signame}\n{tail(res)}"
    passed = events(res, "passed")
    assert not any(e["rank"] == 0 for e in passed), f"rank 0's barrier passed: {signame} was not honoured\n{tail(res)}"
    observed = events(res, "observed")
    assert observed, f"rank 1 reported no observation\n{tail(res)}"
    latency = observed[0]["latency"]
    assert latency is not None, f"rank 0 neither raised nor exited within 3 s of {signame}\n{tail(res)}"
    assert latency < LATENCY, f"rank 0 honoured {signame} after {latency:.3f} s (bound {LATENCY})\n{tail(res)}"
    # 2. rank 0 raised KeyboardInterrupt/SystemExit (or is gone); rank 1 raised PeerFailure naming it
    raised = {e["rank"]: e for e in events(res, "raised")}
    if 0 in raised:
        assert raised[0]["interrupt"], f"rank 0 raised {raised[0]['exc']}: {raised[0]['msg']}\n{tail(res)}"
    assert 1 in raised, f"rank 1 reported no exception from its barrier\n{tail(res)}"
    r1 = raised[1]
    assert r1["peer_failure"] and r1["failing"] == 0, f"rank 1 raised {r1['exc']}: {r1['msg']}\n{tail(res)}"
    # 3. the root cause: rank 0, stopped by the signal
    story = f"{r1['orig_type']}: {r1['orig_msg']}"
    assert names_signal(story, signame), f"rank 1's PeerFailure does not name {signame}: {r1['msg']}\n{tail(res)}"
    if launcher == "spawn":
        roots = re.findall(rf"^{re.escape(SPAWN_REPORT)}rank (\d+) failed: (.*)$", res.stderr, re.M)
        assert len(roots) == 1 and roots[0][0] == "0", f"root cause lines: {roots}\n{tail(res)}"
        assert names_signal(roots[0][1], signame), roots
        lead = events(res, "launcher")
        assert lead and lead[0]["exc"] == "JobFailed" and lead[0]["root_rank"] == 0, lead
    elif launcher == "torchrun":
        root = blamed(root_cause(res.stderr))
        assert root == 0, f"torchrun's root cause names rank {root}, expected 0\n{tail(res)}"
        if signame == "SIGINT":  # one line, no traceback, and no word of a report torchrun may not print
            assert "[rank 0] interrupted: KeyboardInterrupt" in res.stderr, tail(res)
    else:
        codes = {e["name"]: e["code"] for e in events(res, "exit")}
        assert codes.get("0") not in (0, None) and codes.get("1") not in (0, None), f"exit codes {codes}\n{tail(res)}"
    # 4. nothing left
    assert res.leftovers == [], f"processes left: {res.leftovers}\n{tail(res)}"


@pytest.mark.timeout(180)
def test_a_launchers_stop_during_a_victims_post_leaves_its_error_file_and_exit_code() -> None:
    res = torchrun("torchrun_stop_in_post.py", nproc=2, bound=120.0)
    assert res.returncode is not None, f"the job did not end within its bound\n{tail(res)}"
    assert res.returncode == 1, tail(res)
    assert events(res, "stop sent"), f"rank 0 never reached its post\n{tail(res)}"
    victim = {e["rank"]: e for e in events(res, "raised")}.get(0)
    assert victim is not None, tail(res)
    assert (victim["exc"], victim["failing"], victim["orig_msg"]) == ("PeerFailure", 1, "boom from rank 1"), victim
    root, others = root_cause(res.stderr), other_failures(res.stderr)
    assert root.rank == 1 and "RuntimeError: boom from rank 1" in root.traceback, root.text
    # rank 0 ended with its failure's code and its own error file, not as the stop's 143
    assert list(others) == [0] and others[0].exitcode == 3, res.stderr
    assert others[0].traceback.startswith("PeerFailure: rank 1 failed: RuntimeError: boom from rank 1"), others
    # and its one line, as every victim says (it ended in the post, before the excepthook)
    said = [line for line in res.stderr.splitlines() if line.startswith("[rank 0] stopped: ")]
    assert len(said) == 1, tail(res)
    assert said[0].startswith("[rank 0] stopped: PeerFailure: rank 1 failed: RuntimeError: boom from rank 1"), said
    assert res.leftovers == [], tail(res)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", ["finalize", "exit"])
def test_a_launchers_stop_in_user_code_ends_the_rank_with_the_peers_failure_not_an_abort(how: str) -> None:
    res = torchrun("torchrun_stop_in_user_code.py", how, nproc=2, bound=120.0)
    assert res.returncode is not None, f"the job did not end within its bound\n{tail(res)}"
    assert res.returncode == 1, tail(res)
    assert events(res, "in user code") and not events(res, "never stopped"), tail(res)
    # rank 0 was stopped in its own code: Terminated (a SystemExit), not a tether error
    victim = {e["rank"]: e for e in events(res, "raised")}.get(0)
    assert victim is not None and victim["exc"] == "Terminated", tail(res)
    root, others = root_cause(res.stderr), other_failures(res.stderr)
    assert root.rank == 1 and "RuntimeError: boom from rank 1" in root.traceback, root.text
    # it ended with the code of the failure behind the stop, its error file says that
    # failure, and it did not abort in Python's teardown (SIGABRT, exit -6)
    assert list(others) == [0] and others[0].exitcode == 3, res.stderr
    assert others[0].traceback.startswith("PeerFailure: rank 1 failed: RuntimeError: boom from rank 1"), others
    assert "terminate called" not in res.stderr, tail(res)
    assert res.leftovers == [], tail(res)


@pytest.mark.timeout(120)
def test_a_users_own_handler_that_returns_leaves_every_tether_wait_to_complete() -> None:
    # a SIGTERM handler that sets a flag ("save at the end of this step", a preemption's
    # usual answer) during a barrier: the keeper's wake wrote "abort" into the gate's key,
    # and both ranks ended, "BackendError: sync ended with status 'abort'" (53a2784); in an
    # all_reduce the wake made the wait return before the work, unguarded
    res = python("user_signal.py", bound=90)
    assert res.returncode == 0, tail(res)
    done = {e["rank"]: e for e in events(res, "done")}
    assert (done[0]["handled"], done[0]["other"], done[1]["handled"], done[1]["other"]) == (3, 3, 0, 0), done
    assert all(done[r]["results"] == [None, r, pytest.approx(1.2)] for r in (0, 1)), done  # all_reduce: 0.1 + 1.1
    waited = {(e["rank"], e["kind"]): e["seconds"] for e in events(res, "waited")}
    assert all(waited[0, kind] > 0.5 for kind in ("barrier", "one_rank_first", "all_reduce")), waited
    assert res.leftovers == []


def test_a_signal_while_a_rank_retires_writes_nothing_into_a_file_the_rank_just_opened() -> None:
    # the watchdog closed its signal pipe before the hooks took the interpreter's wakeup fd
    # off it: the signal's number (0x0a, SIGUSR1) went into the third file, which had taken
    # the pipe's write end's fd; with no file there, Python printed "Exception ignored when
    # trying to write to the signal wakeup fd" (a fresh-clone run of test_start_method)
    res = python("signal_in_retire.py", bound=60)
    assert res.returncode == 0, tail(res)
    retired = {e["rank"]: e for e in events(res, "retired")}
    assert sorted(retired) == [0, 1], tail(res)
    for e in retired.values():
        assert e["written"] == ["", "", "", ""], e
        assert e["caught"] == [signal.SIGUSR1], e  # the user's handler still ran
    assert "wakeup fd" not in res.output, tail(res)
    assert res.leftovers == []


@pytest.mark.timeout(120)
def test_a_preemption_the_users_code_takes_gracefully_ends_the_job_as_it_would_have_ended() -> None:
    # tether.spawn's launcher, SIGTERMed, raises SystemExit(143) when its ranks stopped on
    # it (343b07d): here every rank took the SIGTERM as a flag and returned, and the job
    # must end as it would have, without a restart
    res = python("graceful_stop.py", bound=90)
    assert res.returncode == 0, tail(res)
    stopped = {e["rank"]: e["step"] for e in events(res, "stopped")}
    assert sorted(stopped) == [0, 1] and stopped[0] == stopped[1] >= 20, stopped
    assert events(res, "launcher returned"), tail(res)
    assert "tether: job stopped (SIGTERM); every rank finished" in res.stderr, tail(res)
    assert "starting every worker again" not in res.stderr, tail(res)
    assert res.leftovers == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("signame", ["SIGINT", pytest.param("SIGTERM", marks=full)])
def test_a_stop_to_the_process_group_while_spawns_workers_start_ends_the_job_with_one_line(signame: str) -> None:
    res = python("spawn_stopped_early.py", signame, bound=BOUND)
    assert res.returncode is not None and res.elapsed < 30, tail(res)
    # before: the forkserver died of it (a Ctrl-C: a traceback of its import of torch) and
    # the launcher's start of a worker raised "EOFError: unexpected EOF"
    assert "Traceback" not in res.output and "EOFError" not in res.output, tail(res)
    if signame == "SIGINT":
        assert "LAUNCHER KeyboardInterrupt" in res.stdout, tail(res)
        line = "tether: job interrupted (SIGINT); every rank stopped ("
    else:
        assert res.returncode == 143 and "LAUNCHER Terminated" in res.stdout, tail(res)
        line = "tether: job stopped (SIGTERM); every rank stopped ("
    assert res.stderr.count(line) == 1, tail(res)
    assert res.leftovers == [], tail(res)
