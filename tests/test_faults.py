"""The fault matrix: every row of ``fault_matrix.ROWS`` is one real job on gloo.

Each cell asserts the promise's four parts:

1. the job ended within its bound (and every survivor raised within ``detect`` seconds
   of the strike);
2. every surviving rank raised the expected tether exception naming the right rank
   (a frozen or killed rank is not a survivor);
3. the root cause (rank, exception type, message) is printed, exactly once;
4. no process of the job is left.
"""

from __future__ import annotations

import json
import re
import sys

import pytest

import _harness
from _faults import RESULT, Case
from _torchrun_report import ROOT_CAUSE, blamed, root_cause
from fault_matrix import ROWS, TORCHRUN, Row

TEARDOWN_WARNING = "Python's teardown may abort"  # ending._at_exit's warning

SPAWN_REPORT = "tether: job failed. Root cause: "
EVERY_RANK = "tether: job failed. Every rank raised "
STOPPED = "tether: job stopped (SIGTERM); every rank stopped "


def run_row(row: Row) -> _harness.Result:
    case = Case(
        row.failure, row.place, row.striker, row.launcher, timeout=row.timeout, mismatch=row.mismatch, grace=row.grace
    )
    args = [case.to_json(), str(row.nproc)]
    if row.launcher == "spawn":
        return _harness.python("fault_job.py", *args, bound=row.bound)
    if row.launcher == "initialize-rank0":  # the c10d rendezvous without the agent's store
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(row.nproc),
            "--rdzv_backend",
            "c10d",
            "--rdzv_endpoint",
            f"127.0.0.1:{_harness.free_port()}",
            "--local_addr",
            "127.0.0.1",
            "--monitor_interval",
            "0.1",
            str(_harness.JOBS / "fault_job.py"),
            *args,
        ]
        return _harness.run(cmd, row.bound, env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})
    return _harness.torchrun("fault_job.py", *args, nproc=row.nproc, bound=row.bound)


def parse(output: str, prefix: str) -> list[dict]:
    found = []
    for line in output.splitlines():
        at = line.find(prefix)  # torchrun may prefix a worker's line with "[rankN]:"
        if at >= 0:
            found.append(json.loads(line[at + len(prefix) :]))
    return found


def printed_root(row: Row, output: str) -> tuple[str, int]:
    """The root cause as printed once (spawn: tether's report line; torchrun: its Root Cause
    entry), and the rank it names."""
    if row.launcher in TORCHRUN:
        entry = root_cause(output)
        return entry.text, blamed(entry)
    assert output.count(SPAWN_REPORT) == 1, f"root cause printed {output.count(SPAWN_REPORT)} times, expected once"
    line = output[output.index(SPAWN_REPORT) :].splitlines()[0]
    found = re.match(rf"{re.escape(SPAWN_REPORT)}rank (\d+) failed: ", line)
    assert found, f"no rank in the root cause:\n{line}"
    return line, int(found.group(1))


def check_root(row: Row, output: str) -> int | None:
    if row.root is None:
        assert SPAWN_REPORT not in output and ROOT_CAUSE not in output
        return None
    rank, exc_type, fragment = row.root
    if row.failure == "term_launcher":
        # F8: the launcher was told to stop, and every rank has: one line, no report (8b64d4f)
        stops = re.findall(rf"^{re.escape(STOPPED)}\((.*)\)$", output, re.M)
        assert len(stops) == 1 and SPAWN_REPORT not in output and EVERY_RANK not in output, output[-3000:]
        codes = dict(re.findall(r"rank (\d+): exited with code (\d+)", stops[0]))
        assert sorted(codes) == [str(r) for r in range(row.nproc)], stops[0]
        return None
    if rank is None and row.launcher == "spawn" and EVERY_RANK in output:
        # F8: each rank posted its own stop before any saw another's: the report names no
        # culprit, truthfully (``report.raised_everywhere``), and every rank raised it
        assert output.count(EVERY_RANK) == 1 and SPAWN_REPORT not in output, output[-3000:]
        line = output[output.index(EVERY_RANK) :].splitlines()[0]
        assert line == f"{EVERY_RANK}{exc_type}: {fragment}", line
        return None
    block, named = printed_root(row, output)
    if rank is not None:
        assert named == rank, f"root cause names rank {named}, expected {rank}:\n{block}"
    if row.launcher == "spawn":
        assert re.match(rf"{re.escape(SPAWN_REPORT)}rank {named} failed: {re.escape(exc_type)}: ", block), block
    else:
        assert exc_type in block, f"{exc_type!r} not in the root cause:\n{block}"
    assert fragment in block, f"{fragment!r} not in the root cause:\n{block}"
    return named


def check_survivor(row: Row, res: dict, root: int | None) -> None:
    rank = res["rank"]
    assert res["type"] in row.expect, f"rank {rank} raised {res['type']}: {res['message']}; expected {row.expect}"
    if res["type"] == "PeerFailure" and row.failure == "term_launcher":
        # the rank whose own stop was posted first: any of them
        assert re.match(rf"rank \d+ failed: {row.root[1]}: {row.root[2]}", res["message"]), res["message"]
    elif res["type"] in ("PeerFailure", "PeerLost"):
        expected = row.striker if row.root is None or row.root[0] is not None else root
        assert res["failing"] == expected, f"rank {rank}'s {res['type']} names rank {res['failing']}, not {expected}"
        assert res["message"].startswith(f"rank {expected} failed: "), res["message"]
    elif res["type"] == "SyncTimeout":
        assert row.striker in res["missing"], f"rank {rank}'s SyncTimeout misses {res['missing']}, not the staller"
        # the rank that posted it read where the staller runs from its registration (Channel.placed)
        assert res["pid"], f"rank {rank}'s SyncTimeout gives no pid for the rank it names: {res}"
    elif res["type"] == "SyncMismatch":
        calls = res["calls"]
        assert str(row.striker) in calls, f"rank {rank}'s SyncMismatch does not name rank {row.striker}: {calls}"
        if row.mismatch == "barrier":  # the striker waits in its barrier until the failure reaches it
            assert calls[str(row.striker)].startswith("barrier"), calls
        else:  # the striker leads its one_rank_first(rank=1) and may be past it when asked
            assert any(c.startswith("one_rank_first(rank=") for c in calls.values()), calls


@pytest.mark.parametrize("row", [r.param() for r in ROWS])
def test_fault(row: Row) -> None:
    result = run_row(row)
    output = result.output
    tail = f"\n---- stdout\n{result.stdout[-4000:]}\n---- stderr\n{result.stderr[-6000:]}"

    # 1. the job ended, within its bound, with a failure status
    assert result.returncode is not None, f"the job ran past {row.bound} s and was killed{tail}"
    assert result.elapsed < row.bound
    assert result.returncode != 0, f"the job reported success{tail}"
    if row.failure == "kill_host" and row.launcher == "spawn":
        assert result.returncode == -9, tail  # the launcher itself was killed
    if row.failure == "term_launcher":
        assert result.returncode == 143, tail  # the launcher stopped, as SIGTERM's default ends a process

    # 3. the root cause, printed once (first: survivors are checked against it)
    try:
        root = check_root(row, output)
    except AssertionError as exc:
        raise AssertionError(f"{exc}{tail}") from None

    # 2. every survivor raised the expected exception naming the right rank
    results = {r["rank"]: r for r in parse(output, RESULT) if r["rank"] >= 0}
    missing = [r for r in row.surviving_ranks() if r not in results]
    assert not missing, f"surviving ranks {missing} printed no RESULT{tail}"
    for rank in row.surviving_ranks():
        try:
            check_survivor(row, results[rank], root)
        except AssertionError as exc:
            raise AssertionError(f"{exc}{tail}") from None
    if row.victim_exc is not None and row.striker in results:
        assert results[row.striker]["type"] == row.victim_exc, results[row.striker]
    struck = parse(output, "STRUCK ")
    if row.detect is not None and struck and row.surviving_ranks():
        latency = max(results[r]["time"] for r in row.surviving_ranks()) - struck[0]["time"]
        print(f"{row.id}: every survivor raised {latency:.3f} s after the strike; job took {result.elapsed:.1f} s")
        assert latency < row.detect, f"survivors raised {latency:.2f} s after the strike, bound {row.detect}{tail}"

    # 4. nothing left
    assert result.leftovers == [], f"processes left: {result.leftovers}{tail}"
    # and no exit that waited on the backend's threads and warned of an abort (a survivor's
    # work pending on the failed rank is no reason: 20c514a)
    assert TEARDOWN_WARNING not in output, f"a rank warned at its exit{tail}"
