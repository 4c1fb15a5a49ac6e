"""Drop-in fidelity with ignite 0.5.5: numbers, tensors, devices, groups and messages.

The distributed checks run in one job of 3 ranks (``tests/jobs/fidelity_job.py``). The
rest runs in this process, which never initializes a process group: the serial model,
and every argument check of ``_checks`` that only a launcher or CUDA reaches, matched
with the regular expressions of ignite's own tests (``tests/ignite/distributed``).
"""

from __future__ import annotations

import json
import logging
import re

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler, Sampler, WeightedRandomSampler

import tether as idist
from _core import JOB_BOUND, TEST_TIMEOUT, assert_ended, assert_no_leftovers, lines, results, tail
from _harness import python
from tether import _checks, backends
from tether._env import Topology

# --- distributed: one job ----------------------------------------------------------------


@pytest.mark.timeout(TEST_TIMEOUT)
def test_a_job_keeps_ignites_numbers_tensors_groups_and_messages() -> None:
    world = 3
    res = python("fidelity_job.py", "spawn", str(world), bound=JOB_BOUND)
    assert_ended(res)
    assert res.returncode == 0, tail(res)
    checks = {d["rank"]: d for d in lines(res, "FIDELITY")}
    assert sorted(checks) == list(range(world)), tail(res)
    for rank, d in checks.items():
        assert d["errors"] == [], f"rank {rank}:\n" + "\n".join(d["errors"])
        assert d["count"] > 90, d  # every step ran
    assert all(d["exc"] is None for d in results(res).values()), tail(res)
    # show_config: ignite's lines, from rank 0 only, on stderr
    shown = re.findall(r"^\S+ \S+ tether\.info INFO: (.*)$", res.stderr, re.MULTILINE)
    assert shown == [
        "distributed configuration: native-dist",
        "backend: gloo",
        f"device: {'cuda' if torch.cuda.is_available() else 'cpu'}",
        f"hostname: {idist.hostname()}",
        f"world size: {world}",
        "rank: 0",
        "local rank: 0",
        f"num processes per_node: {world}",
        "num nodes: 1",
        "node rank: 0",
    ], tail(res)
    assert_no_leftovers(res)


# --- serial: no process group ------------------------------------------------------------


@pytest.fixture(autouse=True)
def serial() -> None:
    assert not dist.is_initialized()


def test_serial_model_is_ignites() -> None:
    assert idist.new_group([]) == []  # ignite returns ranks unchanged
    assert idist.new_group([0, 5]) == [0, 5]
    assert idist.all_reduce(0.1) == 0.1 and idist.all_gather(1 / 3) == [1 / 3]
    t = torch.zeros(2, dtype=torch.float16)
    assert idist.broadcast(t, src=1) is t  # serial ignores src, as ignite
    serial_model, native_model = idist.registered_computation_models
    assert serial_model.available_backends == () and "gloo" in native_model.available_backends
    assert idist.available_backends() == native_model.available_backends
    model = serial_model.create_from_context()
    assert model is not None and model.name == "serial" and model.topology.world_size == 1
    assert native_model.create_from_context() is None  # no process group


@pytest.mark.parametrize(
    ("cuda", "mps", "expected"),
    [(True, True, "cuda"), (False, True, "mps"), (False, False, "cpu")],
)
def test_serial_device_is_cuda_then_mps_then_cpu(
    monkeypatch: pytest.MonkeyPatch, cuda: bool, mps: bool, expected: str
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
    assert idist.device() == torch.device(expected)


def test_native_device_is_the_current_cuda_device_under_gloo_too(monkeypatch: pytest.MonkeyPatch) -> None:
    gloo = backends.NativeBackend(Topology(1, 2, 1, 2, 1, 0), "gloo", owns_group=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gloo.device() == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert gloo.device() == torch.device("cuda:1")
    assert gloo.comm_device() == torch.device("cpu")  # what tether stages for gloo stays on the CPU
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    with pytest.warns(UserWarning, match=r"Current device index is less than current local rank."):
        assert gloo.device() == torch.device("cuda:0")


def test_show_config_prints_ignites_lines_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    idist.show_config()
    err = capsys.readouterr().err
    assert "tether.info INFO: distributed configuration: serial" in err
    assert "tether.info INFO: backend: None" in err
    assert f"tether.info INFO: device: {idist.device().type}" in err
    assert "tether.info INFO: rank: 0" in err
    assert "tether.info INFO: local rank: 0" in err
    assert "tether.info INFO: world size: 1" in err
    assert re.search(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} tether\.info INFO: node rank: 0$", err, re.MULTILINE)
    assert logging.getLogger("tether.info").propagate is False  # once, as ignite's setup_logger


# ignite's regular expressions (tests/ignite/distributed/...), with the call that raises.
SERIAL_MESSAGES = [
    (lambda: idist.new_group(["a", "b", "c"]), ValueError, "Argument ranks should be list of int"),
    (lambda: idist.new_group(1), ValueError, "Argument ranks should be list of int"),
    (lambda: idist.spawn("horovod", print, (), nproc_per_node=1), ValueError, r"Backend should be one of"),
    (lambda: idist.spawn("xla-tpu", print, (), nproc_per_node=1), ValueError, r"Backend should be one of"),
    (lambda: idist.initialize("abc"), ValueError, r"Backend should be one of"),
    (lambda: idist.DistributedProxySampler(None), TypeError, r"Argument sampler should be instance of torch Sampler"),
    (lambda: idist.DistributedProxySampler(Sampler()), TypeError, r"Argument sampler should have length"),
    (
        lambda: idist.DistributedProxySampler(DistributedSampler(range(10), num_replicas=8, rank=0)),
        TypeError,
        r"Argument sampler must not be a distributed sampler already",
    ),
    (lambda: idist.broadcast(None), ValueError, r"Argument tensor should not be None"),
]


@pytest.mark.parametrize(("call", "kind", "match"), SERIAL_MESSAGES)
def test_serial_messages_match_ignites_tests(call: object, kind: type[Exception], match: str) -> None:
    with pytest.raises(kind, match=match):
        call()  # type: ignore[operator]


def test_one_rank_first_message_matches_ignites_test() -> None:
    rank = 100
    with (
        pytest.raises(ValueError, match=f"rank should be between 0 and {idist.get_world_size() - 1}, but given {rank}"),
        idist.one_rank_first(rank),
    ):
        pass


# The launcher checks ignite's test_launcher.py makes of Parallel (``_checks`` serves
# spawn, Parallel and initialize).
LAUNCHER_MESSAGES = [
    (lambda: backends.check_backend("abc", "Parallel"), r"Unknown backend 'abc'. Available backends:"),
    (lambda: _checks.check_serial_parallel(nnodes=2), r"If backend is None, argument 'nnodes' should be also None"),
    (lambda: _checks.check_nproc_per_node(-1), r"Argument nproc_per_node should positive"),
    (lambda: _checks.check_nnodes(-1), r"Argument nnodes should positive"),
    (lambda: _checks.check_node_rank(None, 2), r"If number of nodes larger than one"),
    (lambda: _checks.check_node_rank(2, 2), r"Argument node_rank should be between 0 and"),
    (
        lambda: _checks.check_master(2, None, None, None),
        r"If number of nodes larger than one, arguments master_addr and master_port",
    ),
    (
        lambda: _checks.check_rank_and_world_size(0, None),
        r"Both rank and world_size should be provided",  # comp_models/test_native.py
    ),
    (lambda: _checks.check_rank_and_world_size(None, 2), r"Both rank and world_size should be provided"),
]


@pytest.mark.parametrize(("call", "match"), LAUNCHER_MESSAGES)
def test_launcher_messages_match_ignites_tests(call: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()  # type: ignore[operator]


def test_launcher_checks_pass_what_ignite_accepts() -> None:
    assert _checks.check_nproc_per_node(4) == 4
    assert (_checks.check_nnodes(None), _checks.check_node_rank(None, 1)) == (1, 0)
    assert _checks.check_node_rank(1, 2) == 1
    _checks.check_master(2, "10.0.0.1", 2222, None)
    _checks.check_master(2, None, None, "tcp://10.0.0.1:2222")
    _checks.check_serial_parallel(nnodes=None, master_port=None)
    assert _checks.check_rank_and_world_size(None, None) is None
    assert _checks.check_rank_and_world_size(1, 2) == (1, 2)
    assert backends.check_backend("gloo") == "gloo" == backends.check_backend("gloo", "Parallel")


def test_nccl_without_cuda_is_a_runtime_error_as_in_ignite(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match=r"Nccl backend is required but no cuda capable devices"):
        backends.check_backend("nccl")
    with pytest.raises(RuntimeError, match=r"Nccl backend is required but no cuda capable devices"):
        idist.initialize("nccl")


def test_auto_model_refuses_device_ids_with_ignites_message() -> None:
    with pytest.raises(ValueError, match=r"Argument kwargs should not contain 'device_ids'"):
        _checks.check_ddp_kwargs({"device_ids": [0]}, torch.device("cuda:0"))


def test_proxy_sampler_follows_ignites_order() -> None:
    """ignite's test_dist_proxy_sampler: the shares of every rank are the sampler's draw."""
    weights = torch.ones(100)
    weights[:50] += 1
    sampler = WeightedRandomSampler(weights, 200)
    shares = [idist.DistributedProxySampler(sampler, num_replicas=8, rank=i) for i in range(8)]
    for seed in range(5):
        torch.manual_seed(seed)
        drawn = set(sampler)
        for share in shares:
            share.set_epoch(seed)
        assert {i for share in shares for i in share} == drawn


@pytest.mark.timeout(TEST_TIMEOUT)
def test_spawn_workers_get_ignites_environment_on_the_master_port_given() -> None:
    from _harness import free_port

    port = free_port()
    res = python("fidelity_env.py", bound=JOB_BOUND, env={"MASTER_PORT": str(port), "MASTER_ADDR": "127.0.0.1"})
    assert_ended(res, JOB_BOUND)
    assert res.returncode == 0, tail(res)
    seen = sorted((json.loads(line[4:]) for line in res.stdout.splitlines() if line.startswith("ENV ")), key=str)
    assert len(seen) == 2, tail(res)
    for env in seen:
        r = env["rank"]
        assert env == {
            "RANK": str(r),
            "LOCAL_RANK": str(r),
            "WORLD_SIZE": "2",
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),  # the launcher hosted the store on the port the environment named
            "rank": r,
            "local_rank": r,
        }, env
    assert_no_leftovers(res)
