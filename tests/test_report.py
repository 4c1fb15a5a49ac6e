"""The failure record (versioned JSON, never pickle) and the one root-cause report, in-process."""

from __future__ import annotations

import json
import pickle
import signal
import sys
from typing import Any

import pytest

from tether import ExitCode, JobFailed, PeerFailure, PeerLost, SyncMismatch, SyncTimeout
from tether._core.record import (
    KIND_EXCEPTION,
    KIND_EXIT,
    KIND_LOST,
    KIND_MISMATCH,
    KIND_SIGNAL,
    KIND_TIMEOUT,
    RECORD_VERSION,
    FailureRecord,
    describe_exit,
    error_from_record,
    first_line,
    format_traceback,
    record_from_exception,
)
from tether.report import RankOutcome, render_report


def record(rank: int = 2, seq: int = 1, **kw: object) -> FailureRecord:
    fields: dict[str, object] = {
        "rank": rank,
        "kind": KIND_EXCEPTION,
        "exc_type": "ValueError",
        "message": f"bad thing on rank {rank}",
        "traceback": "Traceback (most recent call last):\n  ...\nValueError: bad thing\n",
        "host": "node7",
        "pid": 4242,
        "time": 1700000000.5,
        "where": "one_rank_first(rank=2, local=False)",
        "frame": "train.py:12 in main",
        "seq": seq,
        "reporter": rank,
    }
    fields.update(kw)
    return FailureRecord(**fields)  # type: ignore[arg-type]


# --- the record ---------------------------------------------------------------------


def test_record_round_trips_through_json_unchanged() -> None:
    rec = record(detail={"missing": [1, 3], "whereabouts": {"1": "in barrier"}})
    text = rec.to_json()
    assert json.loads(text)["version"] == RECORD_VERSION
    assert FailureRecord.from_json(text) == rec
    assert FailureRecord.from_json(text.encode()) == rec  # the store hands back bytes


def test_record_from_json_ignores_fields_it_does_not_know() -> None:
    data = json.loads(record().to_json())
    data["added_in_a_later_release"] = {"x": 1}
    assert FailureRecord.from_json(json.dumps(data)) == record()


@pytest.mark.parametrize(
    "text",
    [
        json.dumps({**json.loads(record().to_json()), "version": RECORD_VERSION + 1}),
        json.dumps({k: v for k, v in json.loads(record().to_json()).items() if k != "version"}),
        json.dumps([1, 2, 3]),
        json.dumps("rank 0 failed"),
    ],
    ids=["newer-version", "no-version", "a-list", "a-string"],
)
def test_record_from_json_rejects_other_versions_and_shapes(text: str) -> None:
    with pytest.raises(ValueError, match=f"not a tether failure record of version {RECORD_VERSION}"):
        FailureRecord.from_json(text)


def test_record_from_json_rejects_non_json() -> None:
    with pytest.raises(ValueError):
        FailureRecord.from_json(pickle.dumps(record()))


def test_record_headline_and_seq() -> None:
    rec = record(rank=3, seq=0)
    assert rec.headline == "rank 3 failed: ValueError: bad thing on rank 3"
    assert rec.with_seq(5).seq == 5 and rec.seq == 0


def test_record_from_exception_describes_the_exception_and_the_users_frame() -> None:
    def user_code() -> None:
        raise KeyError("missing shard")

    try:
        user_code()
    except KeyError as exc:
        rec = record_from_exception(1, exc, "user code")
    assert (rec.rank, rec.kind, rec.exc_type, rec.reporter) == (1, KIND_EXCEPTION, "KeyError", 1)
    assert rec.message == "'missing shard'"
    assert "KeyError: 'missing shard'" in rec.traceback
    assert rec.frame.endswith("in user_code") and "test_report.py" in rec.frame
    assert rec.pid > 0 and rec.host and rec.time > 0
    assert FailureRecord.from_json(rec.to_json()) == rec


def test_record_from_system_exit_is_an_exit() -> None:
    try:
        raise SystemExit(3)
    except SystemExit as exc:
        rec = record_from_exception(0, exc, "user code")
    assert (rec.kind, rec.exc_type, rec.message) == (KIND_EXIT, "SystemExit", "exit code 3")


def test_a_system_exit_with_a_message_is_described_by_its_message_as_python_prints_it() -> None:
    # sys.exit("text") prints the text and exits 1: "exit code fatal: ..." before
    try:
        sys.exit("fatal: no config in /etc/job.yaml")
    except SystemExit as exc:
        rec = record_from_exception(2, exc, "user code")
    assert (rec.kind, rec.message) == (KIND_EXIT, "fatal: no config in /etc/job.yaml")
    assert rec.headline == "rank 2 failed: SystemExit: fatal: no config in /etc/job.yaml"


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise ValueError("no")


@pytest.mark.parametrize(
    ("exc", "headline", "first"),
    [
        (RuntimeError(), "rank 1 failed: RuntimeError", "RuntimeError"),
        (KeyboardInterrupt(), "rank 1 failed: KeyboardInterrupt", "KeyboardInterrupt"),
        # a DataLoader worker's error carries the worker's traceback: the report printed all of it
        # on the root cause's line, on its rank's line, and on JobFailed's
        (
            ValueError("Caught ValueError in DataLoader worker process 0.\nOriginal Traceback (most recent..."),
            "rank 1 failed: ValueError: Caught ValueError in DataLoader worker process 0.",
            "ValueError: Caught ValueError in DataLoader worker process 0.",
        ),
        (
            RuntimeError("\nafter a blank line\nmore"),
            "rank 1 failed: RuntimeError: after a blank line",
            "RuntimeError: after a blank line",
        ),
        (
            _Unprintable(),
            "rank 1 failed: _Unprintable: <message could not be rendered: ValueError>",
            "_Unprintable: <message could not be rendered: ValueError>",
        ),
    ],
)
def test_an_exception_is_named_as_python_names_it_whatever_its_message(
    exc: BaseException, headline: str, first: str
) -> None:
    # an empty message printed "RuntimeError: " (a dangling colon) in every line of the report
    rec = record_from_exception(1, exc, "user code")
    assert rec.headline == headline
    assert render_report([rec]).splitlines()[1] == f"tether: job failed. Root cause: {headline}"
    assert first_line(exc) == first  # a rank's own "[rank N] failed: ..." line
    assert str(PeerFailure(rec)) == f"{headline} (in user code)"  # never raised: no frame
    assert isinstance(exc, _Unprintable) or rec.message == str(exc)  # whole, as it travels


def test_the_hidden_frames_note_heads_the_outermost_traceback_whatever_the_message_holds() -> None:
    # the note went under the last "Traceback (most recent call last):" in the text: one in
    # a DataLoader worker's message, after the frames it counts
    namespace: dict[str, Any] = {}
    exec(compile("def call(f):\n    return f()\n", "/site-packages/tether/_fake.py", "exec"), namespace)

    def load() -> None:
        raise ValueError("Caught ValueError.\nOriginal Traceback (most recent call last):\nValueError: sample 37")

    try:
        namespace["call"](load)
    except ValueError as exc:
        text = format_traceback(exc)
    lines = text.splitlines()
    assert lines[:2] == [
        "Traceback (most recent call last):",
        "  [1 frame(s) of tether, contextlib or multiprocessing not shown]",
    ]
    assert text.count("not shown") == 1 and "_fake.py" not in text
    assert text.endswith("Original Traceback (most recent call last):\nValueError: sample 37\n"), text


# --- what a survivor raises -----------------------------------------------------------


def test_error_from_record_picks_the_documented_exception() -> None:
    err = error_from_record(record())
    assert type(err) is PeerFailure
    assert str(err).startswith("rank 2 failed: ValueError: bad thing on rank 2")
    assert (err.rank, err.host, err.pid, err.exc_type, err.message) == (
        2,
        "node7",
        4242,
        "ValueError",
        "bad thing on rank 2",
    )
    assert err.traceback.endswith("ValueError: bad thing\n")
    assert err.where == "one_rank_first(rank=2, local=False)"
    assert type(error_from_record(record(kind=KIND_LOST, exc_type="Lost"))) is PeerLost
    assert type(error_from_record(record(kind=KIND_SIGNAL, exc_type="SIGKILL"))) is PeerLost
    timeout = error_from_record(
        record(
            kind=KIND_TIMEOUT,
            detail={"call": "barrier #3", "timeout": 5, "missing": [3], "whereabouts": {"3": "in user code"}},
        )
    )
    assert isinstance(timeout, SyncTimeout)
    assert (timeout.call, timeout.timeout, timeout.missing, timeout.whereabouts) == (
        "barrier #3",
        5.0,
        [3],
        {3: "in user code"},
    )
    mismatch = error_from_record(record(kind=KIND_MISMATCH, detail={"calls": {"0": "barrier", "1": "all_reduce"}}))
    assert isinstance(mismatch, SyncMismatch) and mismatch.calls == {0: "barrier", 1: "all_reduce"}


def test_tether_errors_survive_pickling() -> None:
    for err in (
        error_from_record(record()),
        error_from_record(record(kind=KIND_LOST)),
        SyncTimeout("barrier", 2.0, [1], {1: "in user code"}),
        SyncTimeout("barrier", 2.0, [0, 1], {0: "in dist.all_reduce", 1: "in user code"}, waiting=[0]),
        SyncMismatch({0: "barrier", 1: "all_reduce"}),
        JobFailed(record(), {0: 1, 1: 3}, "report"),
    ):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and str(back) == str(err)


def test_a_timeout_names_the_stalled_ranks_apart_from_those_waiting_in_other_calls() -> None:
    where = {0: "in dist.all_reduce (outside tether)", 1: "in user code"}
    err = SyncTimeout("barrier #1", 5.0, [0, 1], where, waiting=[0])
    assert (err.missing, err.stalled, err.waiting) == ([0, 1], [1], [0])
    head = str(err).splitlines()[0]
    assert (
        head
        == "barrier #1 timed out after 5 s: rank(s) [1] did not arrive (nor did rank(s) [0], waiting in other calls)"
    )
    plain = SyncTimeout("barrier #1", 5.0, [1], {1: "in user code"})
    assert str(plain).splitlines()[0] == "barrier #1 timed out after 5 s: rank(s) [1] did not arrive"
    nobody = SyncTimeout("dist.all_reduce", 5.0, [], {})
    assert str(nobody) == "dist.all_reduce timed out after 5 s, although every rank was in it"
    back = error_from_record(
        record(
            kind=KIND_TIMEOUT,
            detail={"call": "barrier #1", "timeout": 5, "missing": [0, 1], "whereabouts": where, "waiting": [0]},
        )
    )
    assert isinstance(back, SyncTimeout) and (back.stalled, back.waiting) == ([1], [0])


def test_a_timeout_every_rank_had_reached_by_the_verdict_names_the_last_to_arrive_and_survives_the_record() -> None:
    where = {2: "in barrier #4"}
    err = SyncTimeout("barrier #4", 0.1, [], where, late=[2])
    assert (err.missing, err.late, err.stalled) == ([], [2], [2])
    assert str(err).splitlines()[0] == "barrier #4 timed out after 0.1 s: rank(s) [2] arrived only after it expired"
    detail = {"call": "barrier #4", "timeout": 0.1, "missing": [], "whereabouts": where, "late": [2]}
    back = error_from_record(record(kind=KIND_TIMEOUT, detail=detail))
    assert isinstance(back, SyncTimeout) and (back.late, back.stalled, str(back)) == ([2], [2], str(err))
    again = pickle.loads(pickle.dumps(err))
    assert (again.late, again.stalled, str(again)) == ([2], [2], str(err))


# --- the report -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (-9, "killed by SIGKILL"),
        (-signal.SIGTERM, "killed by SIGTERM"),
        (-11, "killed by SIGSEGV"),
        (-200, "killed by signal 200"),
        (0, "exited with code 0"),
        (3, "exited with code 3"),
        (None, "still running"),
    ],
)
def test_describe_exit(code: int | None, text: str) -> None:
    assert describe_exit(code) == text


def test_report_puts_the_root_cause_first_then_consequences_in_order_then_ranks() -> None:
    root = record(rank=2, seq=1)
    later = [
        record(rank=0, seq=2, kind=KIND_LOST, exc_type="Lost", message="no heartbeat", reporter=1),
        record(rank=3, seq=3, exc_type="SyncTimeout", message="barrier timed out"),
    ]
    outcomes = {r: RankOutcome(r, c) for r, c in {3: 3, 0: -9, 2: 1, 1: 0}.items()}
    outcomes[2] = RankOutcome(2, 1, "ROOT CAUSE: ValueError: bad thing on rank 2 (exited with code 1)")
    text = render_report([root, *later], outcomes)
    lines = text.splitlines()
    assert lines[0] == lines[-1] == "=" * 72
    assert lines[1] == "tether: job failed. Root cause: rank 2 failed: ValueError: bad thing on rank 2"
    assert lines[2] == "  on host node7, pid 4242, in one_rank_first(rank=2, local=False), at train.py:12 in main"
    assert "ValueError: bad thing" in text
    i = lines.index("Consequences, in order:")
    assert lines[i + 1 : i + 3] == [
        "  #2 rank 0 failed: Lost: no heartbeat",
        "  #3 rank 3 failed: SyncTimeout: barrier timed out",
    ]
    j = lines.index("Ranks:")
    assert j > i
    assert lines[j + 1 : j + 5] == [
        "  rank 0: killed by SIGKILL",
        "  rank 1: exited with code 0",
        "  rank 2: ROOT CAUSE: ValueError: bad thing on rank 2 (exited with code 1)",
        "  rank 3: exited with code 3",
    ]
    assert text.count("Root cause") == 1  # the root cause is named once


def test_report_names_who_noticed_a_death_without_record() -> None:
    killed = record(
        rank=1,
        kind=KIND_SIGNAL,
        exc_type="SIGKILL",
        message="process killed by SIGKILL",
        reporter=-1,
        traceback="",
        where="",
        frame="",
    )
    text = render_report([killed])
    assert "Root cause: rank 1 failed: SIGKILL: process killed by SIGKILL" in text
    assert "(noticed and posted by the launcher)" in text
    assert "Consequences" not in text and "Ranks:" not in text
    lost = record(rank=1, kind=KIND_LOST, exc_type="Lost", message="silent", reporter=0)
    assert "(noticed and posted by rank 0)" in render_report([lost])


def test_report_is_empty_without_records() -> None:
    assert render_report([]) == ""
    assert render_report([], {0: RankOutcome(0, 1)}) == ""


@pytest.mark.timeout(120)
def test_an_uncaught_job_failure_ends_the_launcher_with_the_report_one_line_and_code_7() -> None:
    from _harness import python

    res = python("report_plain.py", bound=60)
    assert res.returncode == int(ExitCode.LAUNCH_FAILED), res.output[-3000:]
    assert res.stderr.count("tether: job failed. Root cause: rank 1 failed: RuntimeError: boom 0.1 from rank 1") == 1
    assert res.stderr.count("Traceback") == 1, res.stderr  # the root cause's own, inside the report
    lines = res.stderr.rstrip().splitlines()
    assert lines[-1] == "tether.JobFailed: job failed: rank 1 failed: RuntimeError: boom 0.1 from rank 1 (exit code 7)"
    assert res.leftovers == []


@pytest.mark.timeout(120)
def test_ctrl_c_to_the_launcher_is_an_interruption_not_a_rank_failure() -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    from _harness import JOBS, ROOT, tagged_pids

    tag = "ctrlc-" + str(os.getpid())
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TETHER_TEST_JOB": tag}
    proc = subprocess.Popen(
        [sys.executable, str(JOBS / "report_interrupt.py")],
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None
    ready = set()
    deadline = time.monotonic() + 60
    while len(ready) < 2 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("READY"):
            ready.add(line.split()[1])
    assert ready == {"0", "1"}
    time.sleep(0.3)  # rank 0 is in its barrier now
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    took = time.monotonic() - sent
    time.sleep(0.5)
    left = tagged_pids(tag)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert proc.returncode in (130, -signal.SIGINT), err[-3000:]
    assert err.count("tether: job interrupted (SIGINT); every rank stopped") == 1, err[-3000:]
    assert "Root cause" not in err, err[-3000:]
    assert took < 10.0 and left == []


def test_the_same_error_on_every_rank_is_reported_once_and_names_no_culprit() -> None:
    same = [record(rank=r, seq=r + 1, message="lr must be positive, got -0.1") for r in (1, 0, 2)]
    text = render_report(same, {r: RankOutcome(r, 1, "raised it") for r in range(3)}, world_size=3)
    assert "tether: job failed. Every rank raised ValueError: lr must be positive, got -0.1\n" in text
    assert "Root cause" not in text and "Consequences" not in text
    assert text.count("Traceback") == 1
    # one rank fewer than the world, or one message different: a root cause and its consequences
    assert "Root cause: rank 1 failed" in render_report(same, world_size=4)
    other = [*same[:2], record(rank=2, seq=3, message="lr must be positive, got -0.2")]
    assert "Root cause: rank 1 failed" in render_report(other, world_size=3)
    error = JobFailed(same[0], {0: 1}, text, "every rank raised ValueError: lr must be positive, got -0.1")
    assert str(error) == "job failed: every rank raised ValueError: lr must be positive, got -0.1"
    assert str(pickle.loads(pickle.dumps(error))) == str(error)
