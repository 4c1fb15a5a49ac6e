"""``one_rank_first`` / ``one_rank_only``: a failure of the working rank reaches every rank.

The motivating bug (DESIGN.md, F1): in ignite, an exception inside ``one_rank_first`` on
the working rank skips its barrier, and the other ranks wait until the launcher kills
them, or forever when the working rank's process stays alive. Each test here runs a real
job on gloo (``tests/jobs/core_sync.py``) and asserts the four things of
``_core.assert_contained``: bounded, every survivor raised ``PeerFailure`` naming the
working rank and its exception, root cause printed, no process left.

Launchers: ``tether.spawn`` ("spawn"), ``Parallel`` as a spawner ("parallel-spawn"),
``Parallel`` under torchrun ("parallel") and ``initialize`` under torchrun ("init"). The
default run covers each scenario once at 4 ranks; ``--full`` adds 2 ranks and the other
launchers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _core import JOB_BOUND, TEST_TIMEOUT, assert_contained, assert_ended, assert_no_leftovers, results, tail
from _harness import Result, free_port, python, torchrun

SCRIPT = "core_sync.py"
TORCHRUN = ("parallel", "init")


def message(rank: int) -> str:
    return f"download failed on rank {rank} (token 7f3a)"  # as core_sync.message


def run_job(launcher: str, world: int, **params: object) -> Result:
    args = [f"{k}={v}" for k, v in params.items()]
    if launcher in TORCHRUN:
        return torchrun(SCRIPT, launcher, str(world), *args, nproc=world, bound=JOB_BOUND)
    return python(SCRIPT, launcher, str(world), *args, bound=JOB_BOUND)


full = pytest.mark.full


# --- one_rank_first: the working rank raises -------------------------------------------


@pytest.mark.timeout(TEST_TIMEOUT)
@pytest.mark.parametrize(
    ("launcher", "world", "working"),
    [
        ("spawn", 4, 0),
        ("parallel", 4, 2),
        pytest.param("init", 4, 2, marks=full),
        pytest.param("parallel-spawn", 4, 0, marks=full),
        pytest.param("spawn", 2, 0, marks=full),
        pytest.param("spawn", 2, 1, marks=full),
        pytest.param("parallel", 2, 0, marks=full),
        pytest.param("init", 2, 0, marks=full),
    ],
)
def test_peers_raise_peer_failure_when_working_rank_raises_inside_one_rank_first(
    launcher: str, world: int, working: int
) -> None:
    res = run_job(launcher, world, scenario="first-raises", rank=working)
    got = assert_contained(
        res,
        world=world,
        failing=working,
        exc_type="ValueError",
        message=message(working),
        spawned=launcher.endswith("spawn"),
    )
    # the survivors never ran the block: they raised where they waited for the working rank
    assert all(got[r]["phase"] == "one_rank_first" for r in got if r != working), got
    assert got[working]["phase"] == "block"


@pytest.mark.timeout(TEST_TIMEOUT)
@pytest.mark.parametrize(
    ("launcher", "world", "working"),
    [
        ("init", 4, 0),
        pytest.param("parallel", 4, 0, marks=full),
        pytest.param("spawn", 4, 0, marks=full),
        pytest.param("init", 2, 0, marks=full),
    ],
)
def test_peers_raise_peer_failure_while_a_non_daemon_thread_keeps_the_failing_rank_alive(
    launcher: str, world: int, working: int
) -> None:
    # rank 0's process cannot exit (a non-daemon thread sleeps 600 s): without tether the
    # other ranks would wait in the barrier until the process-group timeout (30 min)
    res = run_job(launcher, world, scenario="first-thread", rank=working)
    got = assert_contained(
        res, world=world, failing=working, exc_type="ValueError", message=message(working), spawned=launcher == "spawn"
    )
    assert all(got[r]["phase"] == "one_rank_first" for r in got if r != working), got


@pytest.mark.timeout(TEST_TIMEOUT)
@pytest.mark.parametrize(
    ("launcher", "world", "working"),
    [
        pytest.param("spawn", 4, 2, marks=full),
        pytest.param("init", 4, 0, marks=full),
        ("spawn", 2, 0),
    ],
)
def test_working_rank_that_catches_its_own_error_does_not_wait_on_peers_in_all_reduce(
    launcher: str, world: int, working: int
) -> None:
    # The working rank catches its ValueError and calls all_reduce; the others raised
    # PeerFailure and stay alive 60 s (a caller that handles it, a notebook). The working
    # rank must not wait for them: every rank was told the job failed.
    res = run_job(launcher, world, scenario="first-caught", rank=working, linger=60)
    got = assert_contained(
        res,
        world=world,
        failing=working,
        exc_type="ValueError",
        message=message(working),
        spawned=launcher == "spawn",
        own="PeerFailure",
    )
    mine = got[working]
    assert mine["phase"] == "all_reduce" and mine["failing_rank"] == working, mine
    assert mine["orig_type"] == "ValueError" and mine["orig_msg"] == message(working), mine
    assert mine["waited"] < 5.0, f"all_reduce waited {mine['waited']} s on ranks that had stopped"


# --- one_rank_first(local=True) on 2 nodes x 2 processes -------------------------------


@pytest.mark.timeout(TEST_TIMEOUT)
def test_local_working_rank_failure_stops_its_own_node_and_reaches_the_other_node() -> None:
    # nodes are two tether.spawn launchers (nnodes=2); node 1's local rank 0 is rank 2
    res = python(
        SCRIPT, "spawn-2nodes", "2", "scenario=local-raises", "rank=0", "node=1", f"port={free_port()}", bound=JOB_BOUND
    )
    got = assert_contained(res, world=4, failing=2, exc_type="ValueError", message=message(2), spawned=True)
    # rank 3 (same node) never ran the block; node 0's working rank ran its own block, then
    # learnt of the failure when it released its node (the block's end: phase "block") or
    # at its next sync; rank 1 learnt it in its gate or in that sync (rank 0's block is
    # empty: the post and rank 0's "go" race)
    assert got[3]["phase"] == "one_rank_first", got[3]
    assert got[0]["phase"] in ("block", "barrier"), got
    assert got[1]["phase"] in ("one_rank_first", "barrier"), got


# --- one_rank_only(with_barrier=True) --------------------------------------------------


@pytest.mark.timeout(TEST_TIMEOUT)
@pytest.mark.parametrize(
    ("launcher", "world", "working"),
    [
        ("parallel-spawn", 4, 1),
        pytest.param("init", 4, 0, marks=full),
        pytest.param("parallel", 2, 1, marks=full),
        pytest.param("spawn", 2, 0, marks=full),
    ],
)
def test_peers_raise_peer_failure_when_one_rank_only_with_barrier_raises(
    launcher: str, world: int, working: int
) -> None:
    res = run_job(launcher, world, scenario="only-raises", rank=working)
    got = assert_contained(
        res,
        world=world,
        failing=working,
        exc_type="ValueError",
        message=message(working),
        spawned=launcher.endswith("spawn"),
    )
    assert all(d["phase"] == "one_rank_only" for d in got.values()), got


# --- happy path: order -----------------------------------------------------------------


def read_log(path: Path) -> list[tuple[str, int, float]]:
    out = []
    for line in path.read_text().splitlines():
        what, rank, stamp = line.split()
        out.append((what, int(rank), float(stamp)))
    return out


def assert_goes_first(events: list[tuple[str, int, float]], working: int, ranks: list[int]) -> None:
    """Within ``ranks``, the working rank's start and end precede every other line."""
    mine = [e for e in events if e[1] in ranks]
    assert sorted((w, r) for w, r, _ in mine) == sorted([(w, r) for r in ranks for w in ("start", "end")]), mine
    assert [(w, r) for w, r, _ in mine[:2]] == [("start", working), ("end", working)], mine
    end = mine[1][2]
    assert all(t >= end for _, r, t in mine[2:]), mine


@pytest.mark.timeout(TEST_TIMEOUT)
@pytest.mark.parametrize(
    ("launcher", "world", "working"),
    [
        ("spawn", 4, 2),
        pytest.param("init", 4, 0, marks=full),
        pytest.param("parallel", 2, 1, marks=full),
        pytest.param("spawn", 2, 0, marks=full),
    ],
)
def test_working_rank_block_ends_before_any_other_rank_starts_it(
    launcher: str, world: int, working: int, tmp_path: Path
) -> None:
    log = tmp_path / "order.txt"
    res = run_job(launcher, world, scenario="order", rank=working, file=str(log))
    assert_ended(res)
    assert res.returncode == 0, tail(res)
    assert all(d["exc"] is None for d in results(res).values()) and len(results(res)) == world, tail(res)
    assert_goes_first(read_log(log), working, list(range(world)))
    assert_no_leftovers(res)


@full
@pytest.mark.timeout(TEST_TIMEOUT)
def test_local_working_rank_block_ends_before_its_node_starts_it(tmp_path: Path) -> None:
    log = tmp_path / "order.txt"
    res = python(
        SCRIPT,
        "spawn-2nodes",
        "2",
        "scenario=order",
        "rank=1",
        "local=true",
        f"file={log}",
        f"port={free_port()}",
        bound=JOB_BOUND,
    )
    assert_ended(res)
    assert res.returncode == 0, tail(res)
    events = read_log(log)
    assert_goes_first(events, 1, [0, 1])
    assert_goes_first(events, 3, [2, 3])
    assert_no_leftovers(res)


# --- happy path: a job's store does not grow with its syncs ------------------------------


@pytest.mark.timeout(TEST_TIMEOUT)
def test_the_keys_of_spent_gates_are_deleted_so_the_store_does_not_grow_with_every_sync() -> None:
    res = run_job("spawn", 4, scenario="spent-keys")
    assert_ended(res)
    assert res.returncode == 0, tail(res)
    assert all(d["exc"] is None for d in results(res).values()) and len(results(res)) == 4, tail(res)
    [line] = [ln for ln in res.stdout.splitlines() if ln.startswith("KEYS ")]
    keys = json.loads(line.split(" ", 1)[1])
    # 300 gates leave 2 keys each; what may stay is the last gate's two (and the ones
    # before it, in the middle of being deleted)
    assert keys["after"] <= keys["before"] + 4, keys
    assert_no_leftovers(res)
