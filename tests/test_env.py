"""Reading a launcher's environment (``tether._env``): pure functions, checked in-process."""

from __future__ import annotations

import pytest

from tether._env import Topology, from_torchrun, parse_init_method

TORCHRUN = {  # what torchrun sets for the 4th process of 2 nodes x 2
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "10.0.0.5",
    "MASTER_PORT": "29400",
    "TORCHELASTIC_RUN_ID": "abc123",
    "TORCHELASTIC_RESTART_COUNT": "2",
    "TORCHELASTIC_USE_AGENT_STORE": "True",
    "TORCHELASTIC_ERROR_FILE": "/tmp/err.json",
}


def test_from_torchrun_reads_every_variable() -> None:
    env = from_torchrun(TORCHRUN)
    assert env is not None
    assert env.topology == Topology(rank=3, world_size=4, local_rank=1, nproc_per_node=2, nnodes=2, node_rank=1)
    assert env.topology.node_ranks == [2, 3]
    assert (env.master_addr, env.master_port) == ("10.0.0.5", 29400)
    assert env.use_agent_store is True
    assert env.error_file == "/tmp/err.json"
    assert env.job_id == "abc123-29400-r2"


def test_from_torchrun_job_id_changes_with_each_restart() -> None:
    ids = {from_torchrun({**TORCHRUN, "TORCHELASTIC_RESTART_COUNT": str(n)}).job_id for n in range(3)}  # type: ignore[union-attr]
    assert len(ids) == 3


def test_from_torchrun_defaults_for_a_plain_env_launcher() -> None:
    env = from_torchrun({"RANK": "1", "WORLD_SIZE": "3"})
    assert env is not None
    assert env.topology == Topology(rank=1, world_size=3, local_rank=1, nproc_per_node=3, nnodes=1, node_rank=0)
    assert (env.master_addr, env.master_port) == ("127.0.0.1", 29500)
    assert env.use_agent_store is False and env.error_file is None
    assert env.job_id == "env-29500-r0"


def test_from_torchrun_derives_the_node_without_group_rank() -> None:
    env = from_torchrun({"RANK": "5", "WORLD_SIZE": "6", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "3"})
    assert env is not None and env.topology.node_rank == 1 and env.topology.nnodes == 2


@pytest.mark.parametrize("missing", ["RANK", "WORLD_SIZE"])
def test_from_torchrun_is_none_outside_a_launcher(missing: str) -> None:
    assert from_torchrun({k: v for k, v in TORCHRUN.items() if k != missing}) is None
    assert from_torchrun({}) is None


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"RANK": "three"}, r"environment variable RANK must be an integer, got 'three'"),
        ({"WORLD_SIZE": ""}, r"environment variable WORLD_SIZE must be an integer, got ''"),
        ({"LOCAL_RANK": "1.0"}, r"environment variable LOCAL_RANK must be an integer"),
        ({"MASTER_PORT": "http"}, r"environment variable MASTER_PORT must be an integer"),
        ({"LOCAL_WORLD_SIZE": "3"}, r"WORLD_SIZE=4 is not a multiple of LOCAL_WORLD_SIZE=3"),
        ({"RANK": "4"}, r"rank must be in \[0, world_size\), got rank=4, world_size=4"),
        ({"RANK": "-1"}, r"rank must be in \[0, world_size\)"),
        ({"LOCAL_RANK": "2"}, r"local rank must be in \[0, nproc_per_node\), got 2 and 2"),
        (
            {"WORLD_SIZE": "0", "RANK": "0", "LOCAL_WORLD_SIZE": "1", "LOCAL_RANK": "0"},
            r"rank must be in \[0, world_size\)",
        ),
    ],
)
def test_from_torchrun_rejects_inconsistent_variables(change: dict[str, str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        from_torchrun({**TORCHRUN, **change})


@pytest.mark.parametrize(
    ("init_method", "address"),
    [
        (None, None),
        ("env://", None),
        ("tcp://127.0.0.1:29500", ("127.0.0.1", 29500)),
        ("tcp://node-1.cluster:1234", ("node-1.cluster", 1234)),
        ("tcp://[::1]:8080", ("::1", 8080)),
    ],
)
def test_parse_init_method(init_method: str | None, address: tuple[str, int] | None) -> None:
    assert parse_init_method(init_method) == address


@pytest.mark.parametrize(
    "init_method", ["tcp://host", "tcp://host:", "tcp://:29500", "tcp://host:port", "tcp://host:-1"]
)
def test_parse_init_method_rejects_a_malformed_tcp_address(init_method: str) -> None:
    with pytest.raises(ValueError, match=r"init_method must look like tcp://HOST:PORT"):
        parse_init_method(init_method)


@pytest.mark.parametrize("init_method", ["env:", "127.0.0.1:29500", ""])
def test_parse_init_method_rejects_schemes_without_a_tcp_store(init_method: str) -> None:
    with pytest.raises(ValueError, match=r"is not supported: tether's failure channel needs a TCP store"):
        parse_init_method(init_method)


def test_topology_rejects_impossible_places() -> None:
    with pytest.raises(ValueError, match=r"rank must be in \[0, world_size\)"):
        Topology(rank=2, world_size=2)
    with pytest.raises(ValueError, match=r"local rank must be in \[0, nproc_per_node\)"):
        Topology(rank=0, world_size=2, local_rank=1, nproc_per_node=1)


def test_an_adopted_group_learns_its_nodes_from_hostnames() -> None:
    from torch._C._distributed_c10d import HashStore

    from tether._core.placement import local_from_hostnames

    store = HashStore()
    hosts = ["a", "a", "b", "b"]
    for r in (0, 1, 3):  # the other ranks have said where they run
        store.set(f"p/host/{r}", hosts[r])
    assert local_from_hostnames(store, "p/", 2, 4, host="b") == (0, 2)
    assert local_from_hostnames(store, "p/", 1, 4, host="a") == (1, 2)
    store.set("q/host/0", "a")
    store.set("q/host/1", "b")
    store.set("q/host/2", "a")  # not laid out node by node: one node of 4 is assumed
    assert local_from_hostnames(store, "q/", 3, 4, host="b") == (3, 4)
    # a rank that never says where it runs: after the wait, one node is assumed
    assert local_from_hostnames(store, "r/", 0, 2, host="a", within=0.05) == (0, 2)
