"""One root cause, any exception, exit codes that mean what they say (issue 7, parts 5-7).

* Two ranks fail within the same millisecond: every survivor and the launcher's report
  name the same root cause (repeated: the race is between posters).
* ``sys.exit(0)`` in a worker is success; ``sys.exit(3)`` is a failure posted with its code
  (3 is also ``ExitCode.PEER_FAILED``: a launcher must not take it for a consequence).
* An exception whose ``__str__`` or ``__repr__`` raises, or with a 1 MiB message, is posted
  and reaches the waiting peer in bound; so is a tether error that no posted failure
  explains (``BackendError``): it is its rank's own story.
* Without ``sync_timeout``, a raw call that outlives its group's own timeout is a
  ``SyncTimeout`` naming the late rank, not a ``BackendError`` that names nobody.

Job: ``tests/jobs/lifecycle_root.py`` under ``tether.spawn``. Failure tests assert the
bound, the exception on every survivor, the root cause in the output, and that no process
is left.
"""

from __future__ import annotations

import re

import pytest

from _core import NOTICE, tail
from _core import lc_events as events
from _harness import python
from _torchrun_report import other_failures, root_cause
from tether._core.channel import ROOT_WAIT

GROUP_TIMEOUT = 4.0  # lifecycle_root.py's

BOUND = 120.0
SPAWN_REPORT = "tether: job failed. Root cause: "
JOBS_IN_A_ROW = 3


def root_lines(stderr: str) -> list[str]:
    return [s[len(SPAWN_REPORT) :] for s in stderr.splitlines() if s.startswith(SPAWN_REPORT)]


@pytest.mark.timeout(240)
def test_two_ranks_failing_in_the_same_millisecond_give_one_root_cause_everywhere() -> None:
    res = python("lifecycle_root.py", "simultaneous", str(JOBS_IN_A_ROW), bound=200.0)
    assert res.returncode is not None, f"the jobs did not end within their bound\n{tail(res)}"
    assert res.returncode != 0, tail(res)
    # the report of each job, in order (jobs run one after the other)
    chunks = res.stderr.split("END OF JOB ")
    assert len(chunks) == JOBS_IN_A_ROW + 1, f"not every job ended\n{tail(res)}"
    launchers = {e["job"]: e for e in events(res, "launcher")}
    raised = events(res, "raised")
    problems = []
    for job in range(JOBS_IN_A_ROW):
        roots = root_lines(chunks[job])
        found = [re.match(r"rank (\d+) failed: RuntimeError: boom from rank (\d+)$", r) for r in roots]
        if len(roots) != 1 or not found[0] or found[0].group(1) != found[0].group(2):
            problems.append(f"job {job}: root cause lines {roots}, expected one 'rank R failed: ... boom from rank R'")
            continue
        root = int(found[0].group(1))
        if root not in (1, 2):
            problems.append(f"job {job}: the root cause names rank {root}, which did not fail")
        lead = launchers.get(job, {})
        if lead.get("exc") != "JobFailed" or lead.get("root_rank") != root:
            problems.append(f"job {job}: the report names rank {root}, JobFailed says {lead}")
        mine = {e["rank"]: e for e in raised if e["job"] == job}
        for r in (0, 3):
            d = mine.get(r)
            if d is None:
                problems.append(f"job {job}: survivor rank {r} reported no exception")
            elif not d["peer_failure"] or d["failing"] != root:
                problems.append(f"job {job}: rank {r} raised {d['exc']}: {d['msg']}; the report names rank {root}")
            elif d["orig_type"] != "RuntimeError" or d["orig_msg"] != f"boom from rank {root}":
                problems.append(f"job {job}: rank {r}'s PeerFailure says {d['orig_type']}: {d['orig_msg']}")
    assert not problems, "\n".join(problems) + "\n" + tail(res, 3000)
    assert res.leftovers == [], f"processes left: {res.leftovers}\n{tail(res)}"


@pytest.mark.timeout(120)
def test_sys_exit_0_in_every_worker_is_success() -> None:
    res = python("lifecycle_root.py", "exit", "0", bound=90.0)
    assert res.returncode is not None, f"the job did not end within its bound\n{tail(res)}"
    lead = events(res, "launcher")
    assert lead and lead[0]["exc"] is None, f"spawn raised on sys.exit(0): {lead}\n{tail(res)}"
    assert res.returncode == 0, tail(res)
    done = {e["rank"]: e["total"] for e in events(res, "done")}
    assert done == {0: 3, 1: 3}, f"ranks that finished (rank -> all_reduce): {done}\n{tail(res)}"
    assert SPAWN_REPORT not in res.stderr and "SystemExit" not in res.output, tail(res)
    assert res.leftovers == [], f"processes left: {res.leftovers}\n{tail(res)}"


@pytest.mark.timeout(120)
def test_sys_exit_3_on_one_worker_is_a_failure_posted_with_its_code() -> None:
    res = python("lifecycle_root.py", "exit", "3", bound=90.0)
    assert res.returncode is not None, f"the job did not end within its bound\n{tail(res)}"
    assert res.returncode != 0, tail(res)
    lead = events(res, "launcher")
    assert lead and lead[0]["exc"] == "JobFailed", f"the launcher: {lead}\n{tail(res)}"
    assert lead[0]["root_rank"] == 1 and lead[0]["root_type"] == "SystemExit", lead[0]
    assert re.search(r"\b3\b", lead[0]["root_msg"] or ""), f"the root cause does not carry code 3: {lead[0]}"
    assert lead[0]["exit_codes"].get("1") == 3, f"rank 1's exit code: {lead[0]['exit_codes']}"
    raised = {e["rank"]: e for e in events(res, "raised")}
    assert 0 in raised, f"rank 0 reported no exception from its barrier\n{tail(res)}"
    r0 = raised[0]
    assert (
        r0["peer_failure"] and r0["failing"] == 1 and r0["orig_type"] == "SystemExit"
    ), f"rank 0 raised {r0['exc']}: {r0['msg']}\n{tail(res)}"
    assert re.search(r"\b3\b", r0["orig_msg"]), r0
    roots = root_lines(res.stderr)
    assert len(roots) == 1 and re.match(r"rank 1 failed: SystemExit: .*\b3\b", roots[0]), f"{roots}\n{tail(res)}"
    assert res.leftovers == [], f"processes left: {res.leftovers}\n{tail(res)}"


@pytest.mark.timeout(120)
def test_sys_exit_3_in_a_function_parallel_runs_under_torchrun_exits_3() -> None:
    # the rank ended through Python's teardown (~0.3 s here) while its peer, a victim,
    # ended at once: torchrun SIGTERMed it first, and its Root Cause entry read
    # "exitcode: -15" (69383fc): now it ends as an uncaught exception ends a rank
    from _harness import torchrun

    res = torchrun("lifecycle_root.py", "torchrun-exit", "3", nproc=2, bound=90.0)
    assert res.returncode == 1, tail(res)
    root = root_cause(res.stderr)
    assert (root.rank, root.exitcode) == (1, 3) and "SystemExit: 3" in root.traceback, root.text
    raised = {e["rank"]: e for e in events(res, "raised")}
    assert (raised[0]["exc"], raised[0]["failing"], raised[0]["orig_type"]) == ("PeerFailure", 1, "SystemExit")
    assert "[rank 1] failed: SystemExit: 3 (its traceback is in torchrun's Root Cause report)" in res.stderr
    assert res.leftovers == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("kind", "exc_type"),
    [
        ("badstr", "BadStr"),
        ("badrepr", "BadRepr"),
        ("huge", "ValueError"),
        ("orphan", "ValueError"),
        ("backend", "BackendError"),
    ],
)
def test_an_exception_that_is_hard_to_render_still_reaches_the_peer(kind: str, exc_type: str) -> None:
    # orphan: an empty slot 1 before the record (its poster killed between its two
    # operations) costs one ROOT_WAIT (2 s), not two: until acb4f69 the listener waited for
    # the slot, then waited for it again (4.0 s)
    # backend: a tether error that no posted failure explains is its rank's own story,
    # posted after ROOT_WAIT (a death a launcher saw comes first); until now it passed as a
    # victim's, posted by nobody: "rank 1 failed: SystemExit: process exited with code 3"
    res = python("lifecycle_root.py", "weird", kind, bound=90.0)
    # 1. bounded (never waits forever), and a failure
    assert res.returncode is not None, f"the job did not end within its bound (rank 0 waited forever?)\n{tail(res)}"
    assert res.returncode != 0, tail(res)
    struck = events(res, "struck")
    assert struck, f"rank 1 never raised\n{tail(res)}"
    # 2. rank 0 raised PeerFailure naming rank 1 and the type, soon after
    raised = {e["rank"]: e for e in events(res, "raised")}
    assert 0 in raised, f"rank 0 reported no exception from its barrier\n{tail(res)}"
    r0 = raised[0]
    assert r0["peer_failure"] and r0["failing"] == 1, f"rank 0 raised {r0['exc']}: {r0['msg']}\n{tail(res)}"
    assert r0["orig_type"] == exc_type, f"rank 0's PeerFailure names type {r0['orig_type']!r}\n{tail(res)}"
    if kind == "huge":
        assert r0["orig_msg"].startswith("huge message (hug3): xxxx"), r0["orig_msg"][:200]
    if kind == "badrepr":  # its __str__ works: the message must come through whole
        assert r0["orig_msg"] == "weird repr (r3pr)", r0["orig_msg"][:200]
    late = r0["time"] - struck[0]["time"]
    # orphan: one ROOT_WAIT and a notice's few ms, well under the two ROOT_WAITs of before
    bound = ROOT_WAIT + 1.5 if kind in ("orphan", "backend") else NOTICE
    assert late < bound, f"rank 0 raised {late:.1f} s after rank 1 (bound {bound} s)"
    if kind == "orphan":
        assert r0["orig_msg"] == "after an orphaned seq (0rph)", r0["orig_msg"][:200]
        assert late >= ROOT_WAIT, f"rank 0 raised {late:.1f} s after rank 1: it did not wait for slot 1"
    if kind == "backend":
        assert r0["orig_msg"] == "the backend failed and nobody's failure explains it (b4ck)", r0["orig_msg"][:200]
        (lead,) = events(res, "launcher")  # the root cause exits as one (RAISED), not as a victim (3)
        assert lead["exit_codes"] == {"0": 3, "1": 1}, lead
    # 3. the root cause, once
    roots = root_lines(res.stderr)
    assert len(roots) == 1 and roots[0].startswith(f"rank 1 failed: {exc_type}"), f"{roots}\n{tail(res, 1500)}"
    lead = events(res, "launcher")
    assert lead and lead[0]["exc"] == "JobFailed" and lead[0]["root_rank"] == 1, lead
    assert lead[0]["root_type"] == exc_type, lead
    # 4. nothing left
    assert res.leftovers == [], f"processes left: {res.leftovers}\n{tail(res)}"


@pytest.mark.timeout(120)
def test_a_raw_call_that_outlives_the_groups_own_timeout_is_a_sync_timeout_naming_the_late_rank() -> None:
    # no sync_timeout: the timeout that expires is the group's (the user's timeout=, else
    # torch's 30 minutes). It was a BackendError that named nobody, posted by nobody: rank 0
    # exited 3, and the report said "rank 0 failed: SystemExit: process exited with code 3"
    res = python("lifecycle_root.py", "group-timeout", bound=90.0)
    # 1. bounded, and a failure
    assert res.returncode is not None, f"the job did not end within its bound\n{tail(res)}"
    assert res.returncode != 0, tail(res)
    # 2. rank 0 raised the timeout once the group's expired (and a query); rank 1, asleep in
    # user code, was ended by its watchdog after grace (exit code 6: WATCHDOG)
    raised = {e["rank"]: e for e in events(res, "raised")}
    assert sorted(raised) == [0] and raised[0]["exc"] == "SyncTimeout", f"{raised}\n{tail(res)}"
    (lead,) = events(res, "launcher")
    assert lead["exit_codes"] == {"0": 4, "1": 6}, lead
    head = f"dist.all_reduce timed out after {GROUP_TIMEOUT:g} s: rank(s) [1] did not arrive"
    assert str(raised[0]["msg"]).startswith(head), raised[0]
    (struck,) = events(res, "struck")
    took = float(raised[0]["time"]) - float(struck["time"])
    assert GROUP_TIMEOUT - 0.5 < took < GROUP_TIMEOUT + 1.0 + NOTICE, took
    # 3. the root cause, once: the late rank, with the timeout's story
    roots = root_lines(res.stderr)
    assert len(roots) == 1 and roots[0].startswith(f"rank 1 failed: SyncTimeout: {head}"), f"{roots}\n{tail(res, 1500)}"
    assert "  rank 0: stopped: TIMEOUT (exited with code 4)" in res.stderr, tail(res, 1500)
    # 4. nothing left
    assert res.leftovers == [], f"processes left: {res.leftovers}\n{tail(res)}"


@pytest.mark.timeout(180)
def test_a_main_decorated_with_torchs_record_still_shows_the_failing_rank_as_root_cause() -> None:
    from _harness import torchrun

    res = torchrun("torchrun_record.py", nproc=2, bound=120.0)
    assert res.returncode == 1, tail(res)
    struck = {e["rank"]: e["time"] for e in events(res, "struck")}
    left = {e["rank"]: e["time"] for e in events(res, "left")}
    assert int(struck[1]) == int(left[0]), (struck, left)  # the same second: a tie, but for tether's stamp
    root = root_cause(res.stderr)
    assert root.rank == 1, root.text
    assert "RuntimeError: boom 0.1 from rank 1" in root.traceback and "PeerFailure" not in root.text, root.text
    assert {r: e.exitcode for r, e in other_failures(res.stderr).items()} == {0: 3}, tail(res)
    victim = next(e for e in events(res, "raised") if e["rank"] == 0)
    assert (victim["exc"], victim["failing"], victim["orig_msg"]) == ("PeerFailure", 1, "boom 0.1 from rank 1"), victim
    assert res.leftovers == [], tail(res)


@pytest.mark.timeout(180)
def test_two_ranks_failing_in_the_same_second_under_torchrun_show_the_first_as_root_cause() -> None:
    from _harness import torchrun

    res = torchrun("torchrun_tie.py", nproc=4, bound=120.0)
    assert res.returncode == 1, tail(res)
    struck = {e["rank"]: e["time"] for e in events(res, "struck")}
    assert sorted(struck) == [1, 2] and int(struck[1]) == int(struck[2]), struck  # the same second
    root = root_cause(res.stderr)
    assert root.rank == 2, root.text
    assert "RuntimeError: boom from rank 2" in root.traceback and "boom from rank 1" not in root.text, root.text
    victims = {e["rank"]: e for e in events(res, "raised") if e["rank"] in (0, 3)}
    assert sorted(victims) == [0, 3], tail(res)
    for e in victims.values():
        assert (e["exc"], e["failing"], e["orig_msg"]) == ("PeerFailure", 2, "boom from rank 2"), e
    assert res.leftovers == [], tail(res)
