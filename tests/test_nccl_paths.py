"""NCCL's paths without a GPU (issue 9): device choice, waits that see completion, aborts that hang.

No GPU runs here, so the pieces the issue names are checked as it asks: pure functions for
the device choice and the reduction check; a fake *work* object that behaves as NCCL's
(future done at enqueue, ``is_completed()`` false until later, ``wait(timeout)`` aborting)
inside real 2-rank gloo jobs; a fake abort that hangs. ``benchmarks/nccl_check.py`` runs
the real thing where a GPU is at hand.
"""

from __future__ import annotations

import time

import pytest

from _core import lc_events
from _harness import python, torchrun
from tether import _checks
from tether._core.nccl import ABORT_BUDGET
from tether._devices import choose_device, device_identity, duplicate_devices, visible_devices
from tether._env import Topology
from tether.backends import NativeBackend

BOUND = 60.0

# --- which GPU ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "local_rank", "count", "index"),
    [
        ({}, 3, 4, 3),  # torchrun on a node of 4 GPUs
        ({"CUDA_VISIBLE_DEVICES": "3"}, 2, 1, 0),  # one GPU per rank, set by hand
        # srun --gpus-per-task=1: SLURM binds each task to its GPU
        ({"SLURM_STEP_GPUS": "5", "CUDA_VISIBLE_DEVICES": "5", "SLURM_LOCALID": "1"}, 1, 1, 0),
        ({"CUDA_VISIBLE_DEVICES": "2,3"}, 3, 2, 1),  # 4 ranks, 2 GPUs: modulo, never out of range
        ({"SLURM_STEP_GPUS": "0,1,2,3"}, 1, 4, 1),
    ],
    ids=["all-visible", "cvd-per-rank", "srun-gpus-per-task", "fewer-gpus-than-ranks", "slurm-step-gpus"],
)
def test_the_device_follows_what_the_process_sees(env: dict[str, str], local_rank: int, count: int, index: int) -> None:
    choice = choose_device(env, local_rank, 4, count)
    assert choice.index == index
    assert choice.why


def test_cuda_visible_devices_is_read_as_cuda_reads_it() -> None:
    assert visible_devices({}) is None
    assert visible_devices({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "0, 1,-1,2"}) == ["0", "1"]  # CUDA stops at -1
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "GPU-ab12,MIG-cd34"}) == ["GPU-ab12", "MIG-cd34"]


def test_a_process_without_a_visible_device_gets_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match="sees no CUDA device.*CUDA_VISIBLE_DEVICES=''"):
        choose_device({"CUDA_VISIBLE_DEVICES": ""}, 0, 1, 0)


def test_two_ranks_on_one_gpu_get_the_same_clear_error_on_every_rank() -> None:
    same = device_identity("node-a", "GPU-1", {})
    other = device_identity("node-a", "GPU-2", {})
    message = duplicate_devices([same, other, same], [0, 1, 2])
    assert message is not None and "ranks 0, 2 share one GPU" in message and "Duplicate GPU" in message
    assert duplicate_devices([same, same, other], [4, 5, 6]) == duplicate_devices([same, same, other], [4, 5, 6])
    assert duplicate_devices([same, other], [0, 1]) is None
    # NCCL_HOSTID makes NCCL treat two ranks on one GPU as two hosts (nccl_check.py relies on it)
    hosts = [device_identity("node-a", "GPU-1", {"NCCL_HOSTID": f"h{r}"}) for r in range(2)]
    assert duplicate_devices(hosts, [0, 1]) is None


def test_nccl_waits_poll_completion_and_gloo_waits_do_not() -> None:
    assert NativeBackend(Topology(), "nccl", owns_group=False).completes_at_enqueue
    assert not NativeBackend(Topology(), "gloo", owns_group=False).completes_at_enqueue


def test_a_reduction_nccl_lacks_is_refused_before_any_communication() -> None:
    with pytest.raises(ValueError, match="'AND' on the nccl backend.*use 'MIN'"):
        _checks.check_op_on_backend("AND", "nccl")
    with pytest.raises(ValueError, match="'OR' on the nccl backend.*use 'MAX'"):
        _checks.check_op_on_backend("OR", "nccl")
    _checks.check_op_on_backend("AND", "gloo")
    _checks.check_op_on_backend("SUM", "nccl")


# --- waits on a work whose future completes at enqueue ----------------------------------


@pytest.mark.timeout(BOUND + 30)
def test_a_wait_on_nccl_lasts_until_the_gpu_finished() -> None:
    res = python("nccl_paths.py", "waits_finish", bound=BOUND)
    assert res.returncode == 0, res.output[-3000:]
    waited = lc_events(res, "waited")
    assert len(waited) == 2, res.output[-3000:]
    for w in waited:
        assert w["elapsed"] >= 0.4, w  # the future was done at once: the old wait returned at once
        assert w["polls"] > 2, w
    assert res.leftovers == []


@pytest.mark.timeout(BOUND + 30)
def test_a_peer_failure_ends_a_wait_on_nccl_in_bound() -> None:
    res = python("nccl_paths.py", "waits_peer_fails", bound=BOUND)
    assert res.elapsed < BOUND and res.returncode == 7, res.output[-3000:]
    (e,) = lc_events(res, "raised")
    assert (e["rank"], e["exc"], e["failing"]) == (0, "PeerFailure", 1), e
    (waited,) = lc_events(res, "waited")
    assert waited["elapsed"] < 0.3 + 2.0, waited  # rank 1 raised 0.3 s in
    assert "RuntimeError: rank 1 broke while rank 0 waited on the GPU" in res.stderr, res.stderr[-3000:]
    (launcher,) = lc_events(res, "launcher")
    assert launcher["exit_codes"] == {"0": 3, "1": 1}
    assert res.leftovers == []


@pytest.mark.timeout(BOUND + 30)
def test_a_peer_failure_while_nccl_blocks_in_the_issue_is_the_peers_failure() -> None:
    res = python("nccl_paths.py", "issue_blocks", bound=BOUND)
    assert res.elapsed < BOUND and res.returncode == 7, res.output[-3000:]
    (e,) = lc_events(res, "raised")
    # before: NCCL's DistBackendError out of the issue went through untranslated (seen on a GPU)
    assert (e["rank"], e["exc"], e.get("failing")) == (0, "PeerFailure", 1), e
    (waited,) = lc_events(res, "waited")
    assert waited["cause"] == "DistBackendError", waited  # chained to the backend's error
    assert waited["elapsed"] < 0.3 + 2.0, waited  # rank 1 raised 0.3 s in; the ladder aborts at grace / 2
    assert "RuntimeError: rank 1 broke while rank 0 issued its all_reduce" in res.stderr, res.stderr[-3000:]
    (launcher,) = lc_events(res, "launcher")
    assert launcher["exit_codes"] == {"0": 3, "1": 1}
    assert res.leftovers == []


@pytest.mark.timeout(BOUND + 30)
def test_a_wait_on_nccl_times_out_on_every_rank() -> None:
    res = python("nccl_paths.py", "waits_timeout", bound=BOUND)
    assert res.elapsed < BOUND and res.returncode == 7, res.output[-3000:]
    events = {e["rank"]: e for e in lc_events(res, "raised")}
    assert sorted(events) == [0, 1], res.output[-3000:]
    assert all(e["exc"] == "SyncTimeout" for e in events.values()), events
    assert "did not arrive" in events[0]["msg"] and "rank 1" in events[0]["msg"], events[0]
    # the root cause is the rank that did not arrive, never the one that waited
    assert "Root cause: rank 1 failed: SyncTimeout: all_reduce(SUM, float32[4]) #2 timed out" in res.stderr, res.stderr
    (waited,) = lc_events(res, "waited")
    assert 1.0 <= waited["elapsed"] < 3.0, waited
    (launcher,) = lc_events(res, "launcher")
    assert launcher["exit_codes"] == {"0": 4, "1": 4}
    assert res.leftovers == []


# --- aborts that hang -------------------------------------------------------------------


@pytest.mark.timeout(BOUND + 30)
def test_finalize_after_a_failure_does_not_wait_on_an_abort_that_hangs() -> None:
    res = python("nccl_paths.py", "finalize_abort_hangs", bound=BOUND)
    assert res.elapsed < BOUND and res.returncode == 7, res.output[-3000:]
    (e,) = lc_events(res, "raised")
    assert (e["rank"], e["exc"], e["failing"]) == (0, "PeerFailure", 1), e
    (done,) = lc_events(res, "finalized")
    assert ABORT_BUDGET - 0.1 <= done["elapsed"] < ABORT_BUDGET + 1.0, done
    assert "RuntimeError: rank 1 broke" in res.stderr, res.stderr[-3000:]
    (launcher,) = lc_events(res, "launcher")
    assert launcher["exit_codes"] == {"0": 0, "1": 1}  # rank 0 handled the failure and returned
    assert res.leftovers == []


@pytest.mark.full  # the ladder already ran its abort on a thread of its own: a guard, not a fix
@pytest.mark.timeout(BOUND + 30)
def test_an_abort_that_holds_the_gil_does_not_hold_the_exit() -> None:
    res = python("nccl_paths.py", "ladder_abort_hangs", bound=BOUND)
    assert res.elapsed < BOUND and res.returncode == 7, res.output[-3000:]
    (launcher,) = lc_events(res, "launcher")
    # grace 2 s: the abort starts at 1 s and holds the GIL; SIGALRM's default action ends the rank at 3 s
    assert launcher["exit_codes"] == {"0": -14, "1": 1}, res.output[-3000:]  # -14: killed by SIGALRM
    assert "RuntimeError: rank 1 broke" in res.stderr, res.stderr[-3000:]
    assert res.elapsed < 20.0, res.elapsed
    assert res.leftovers == []


@pytest.mark.timeout(BOUND + 30)
def test_tethers_nccl_abort_leaves_torchs_registry_of_groups() -> None:
    res = python("nccl_paths.py", "keeps_world", bound=BOUND)
    assert res.returncode == 0, res.output[-3000:]
    (world,) = lc_events(res, "world")
    assert world == {"event": "world", "initialized": True, "groups": 1, "world_size": 1}, world
    assert res.leftovers == []


# --- set-up under the watchdog --------------------------------------------------------


@pytest.mark.timeout(BOUND + 30)
def test_a_peer_lost_while_the_group_is_created_ends_the_wait_within_grace() -> None:
    res = python("setup_watched.py", bound=BOUND)
    (ended,) = lc_events(res, "ended")
    # before: rank 0 waited in init_process_group for the store's timeout (5 minutes)
    assert ended["code"] == 6, res.output[-3000:]  # the ladder ended it: ExitCode.WATCHDOG
    assert ended["after_kill"] < 12.0, ended  # lost within ~0.5 s (the host's judge) + grace 2 s
    assert "rank 1 failed: Lost" in res.stderr, res.stderr[-3000:]
    assert "init_process_group(gloo) (outside tether)" in res.stderr, res.stderr[-3000:]
    assert res.leftovers == []


@pytest.mark.timeout(BOUND + 30)
@pytest.mark.parametrize("how", ["SIGINT", pytest.param("SIGTERM", marks=pytest.mark.full)])
def test_a_stop_while_the_group_waits_for_a_straggler_ends_the_rank_at_once(how: str) -> None:
    res = torchrun("setup_stopped.py", how, nproc=2, bound=BOUND)
    ended = time.time()
    (sent,) = lc_events(res, "stop sent")
    assert res.returncode is not None and res.returncode != 0, res.output[-3000:]
    assert not lc_events(res, "initialized")
    # tether's handler waits for the C++ wait's end, so the keeper ends the rank after 1 s
    # (``Watchdog.stops_end_process``); before: a Ctrl-C there waited for torchrun's SIGKILL, 30 s
    took = ended - sent["time"]
    assert took < 10.0, (took, res.output[-3000:])
    assert res.leftovers == []
