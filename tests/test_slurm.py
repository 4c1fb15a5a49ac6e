"""SLURM: the pure translation from a task's environment to torchrun-style variables."""

from __future__ import annotations

import pytest

from tether import _slurm
from tether._core.placement import read_launch_env as _launch_env
from tether._env import from_torchrun


def task(procid: int, ntasks: int = 8, nnodes: int = 2, **extra: str) -> dict[str, str]:
    """The environment srun gives task ``procid`` of a block-distributed job."""
    per_node = ntasks // nnodes
    env = {
        "SLURM_JOB_ID": "123456",
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(procid % per_node),
        "SLURM_NODEID": str(procid // per_node),
        "SLURM_NTASKS": str(ntasks),
        "SLURM_JOB_NUM_NODES": str(nnodes),
        "SLURM_JOB_NODELIST": "gpu[07-08]",
        "SLURM_TASKS_PER_NODE": f"{per_node}(x{nnodes})",
    }
    env.update(extra)
    return env


# --- host lists -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("node1", ["node1"]),
        ("node[01-03,7]", ["node01", "node02", "node03", "node7"]),
        ("a1,b[2-3],c", ["a1", "b2", "b3", "c"]),
        ("gpu[008-010]-ib", ["gpu008-ib", "gpu009-ib", "gpu010-ib"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("x[9-11], y[1]", ["x9", "x10", "x11", "y1"]),
        ("host-a.example.org,host-b.example.org", ["host-a.example.org", "host-b.example.org"]),
    ],
)
def test_expand_hostlist_matches_scontrol(nodelist: str, hosts: list[str]) -> None:
    assert _slurm.expand_hostlist(nodelist) == hosts


@pytest.mark.parametrize(
    ("nodelist", "message"),
    [
        ("node[1-3", r"^host list has an unmatched '\['"),
        ("node1-3]", r"^host list has an unmatched '\]'"),
        ("node[3-1]", r"^host list range '3-1' is reversed"),
        ("node[a-b]", r"^host list range 'a-b' is not N or N-M"),
        ("node[]", r"^host list range '' is not N or N-M"),
        ("n[[1]]", r"^host list has nested brackets"),
    ],
)
def test_expand_hostlist_rejects_malformed_lists(nodelist: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _slurm.expand_hostlist(nodelist)


# --- translation ------------------------------------------------------------------------


def test_not_a_slurm_task_gives_nothing() -> None:
    assert _slurm.torchrun_vars({"SLURM_JOB_ID": "5"}) == {}  # salloc shell, no srun
    assert _slurm.torchrun_vars({}) == {}


def test_torchrun_inside_slurm_leaves_torchrun_in_charge() -> None:
    env = task(0, RANK="5", WORLD_SIZE="16", TORCHELASTIC_RUN_ID="abc")
    assert not _slurm.applies(env)
    assert _slurm.torchrun_vars(env) == {}


def test_escape_hatch_disables_slurm() -> None:
    assert _slurm.torchrun_vars(task(3, TETHER_SLURM="0")) == {}


def test_two_nodes_of_four_tasks() -> None:
    assert _slurm.torchrun_vars(task(6)) == {
        "RANK": "6",
        "LOCAL_RANK": "2",
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "gpu07",
        "MASTER_PORT": str(15000 + 123456 % 5000),
    }


def test_the_port_is_the_same_on_every_task_and_in_range() -> None:
    ports = {_slurm.torchrun_vars(task(r))["MASTER_PORT"] for r in range(8)}
    assert ports == {"18456"}
    assert _slurm.master_port("99999999") in range(15000, 20000)
    assert _slurm.master_port("4242_17") == 15000 + 4242 % 5000  # an array task


def test_given_master_addr_and_port_win() -> None:
    out = _slurm.torchrun_vars(task(1, MASTER_ADDR="10.0.0.1", MASTER_PORT="29400"))
    assert (out["MASTER_ADDR"], out["MASTER_PORT"]) == ("10.0.0.1", "29400")


def test_the_step_node_list_wins_over_the_job_list() -> None:
    env = task(0, SLURM_STEP_NODELIST="gpu[08]", SLURM_STEP_NUM_NODES="2")
    assert _slurm.torchrun_vars(env)["MASTER_ADDR"] == "gpu08"


def test_legacy_names_are_read() -> None:
    env = task(5)
    del env["SLURM_JOB_NUM_NODES"], env["SLURM_JOB_NODELIST"], env["SLURM_NTASKS"], env["SLURM_TASKS_PER_NODE"]
    env.update(SLURM_NNODES="2", SLURM_NODELIST="cn[1-2]", SLURM_NPROCS="8")
    out = _slurm.torchrun_vars(env)
    assert (out["LOCAL_WORLD_SIZE"], out["GROUP_RANK"], out["MASTER_ADDR"]) == ("4", "1", "cn1")


def test_tasks_per_node_is_derived_without_slurm_saying_it() -> None:
    env = task(3)
    del env["SLURM_TASKS_PER_NODE"], env["SLURM_NODEID"]
    out = _slurm.torchrun_vars(env)
    assert (out["LOCAL_WORLD_SIZE"], out["GROUP_RANK"]) == ("4", "0")


def test_one_node_one_task_defaults() -> None:
    env = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "1", "SLURM_NODELIST": "n1"}
    out = _slurm.torchrun_vars(env)
    assert (out["RANK"], out["WORLD_SIZE"], out["LOCAL_WORLD_SIZE"], out["MASTER_ADDR"]) == ("0", "1", "1", "n1")


def test_agreeing_torchrun_variables_are_accepted() -> None:
    env = task(6, RANK="6", LOCAL_RANK="2", WORLD_SIZE="8", LOCAL_WORLD_SIZE="4", GROUP_RANK="1")
    assert _slurm.torchrun_vars(env)["RANK"] == "6"


@pytest.mark.parametrize(
    ("name", "value", "slurm"),
    [("RANK", "0", "6"), ("LOCAL_RANK", "0", "2"), ("WORLD_SIZE", "4", "8"), ("LOCAL_WORLD_SIZE", "8", "4")],
)
def test_a_contradicting_torchrun_variable_is_an_error(name: str, value: str, slurm: str) -> None:
    with pytest.raises(ValueError, match=rf"^{name}={value} contradicts SLURM, which gives {name}={slurm} "):
        _slurm.torchrun_vars(task(6, **{name: value}))


def test_missing_variables_are_named() -> None:
    env = task(1)
    del env["SLURM_LOCALID"], env["SLURM_NTASKS"]
    with pytest.raises(ValueError, match=r"^SLURM task environment is missing \['SLURM_LOCALID', 'SLURM_NTASKS'\]"):
        _slurm.torchrun_vars(env)


def test_non_integer_variable_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"^environment variable SLURM_PROCID must be an integer, got 'x'"):
        _slurm.torchrun_vars(task(1, SLURM_PROCID="x"))


def test_uneven_tasks_per_node_is_an_error() -> None:
    env = task(1, ntasks=7, SLURM_TASKS_PER_NODE="4,3")
    with pytest.raises(ValueError, match=r"^tether needs the same number of tasks on every node: "):
        _slurm.torchrun_vars(env)


def test_cyclic_distribution_is_an_error() -> None:
    # srun --distribution=cyclic: task 1 is on node 1 as its local task 0
    env = task(1, SLURM_NODEID="1", SLURM_LOCALID="0")
    with pytest.raises(ValueError, match=r"use srun --distribution=block$"):
        _slurm.torchrun_vars(env)


def test_rank_out_of_range_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"^SLURM_PROCID=9 is not in \[0, 8\)"):
        _slurm.torchrun_vars(task(1, SLURM_PROCID="9"))


def test_non_numeric_job_id_needs_a_port() -> None:
    with pytest.raises(ValueError, match=r"^SLURM_JOB_ID must be a number to derive MASTER_PORT"):
        _slurm.torchrun_vars(task(1, SLURM_JOB_ID="abc"))
    assert _slurm.torchrun_vars(task(1, SLURM_JOB_ID="abc", MASTER_PORT="1234"))["MASTER_PORT"] == "1234"


# --- wiring into initialize ---------------------------------------------------------------


def test_initialize_reads_slurm_into_its_topology() -> None:
    launch = _launch_env(task(6), None, None, None)
    topo = launch.topology
    assert (topo.rank, topo.world_size, topo.local_rank, topo.nproc_per_node, topo.nnodes, topo.node_rank) == (
        6,
        8,
        2,
        4,
        2,
        1,
    )
    assert (launch.master_addr, launch.master_port) == ("gpu07", 18456)
    assert topo.node_ranks == [4, 5, 6, 7]


def test_initialize_keeps_the_environment_untouched() -> None:
    env = task(2)
    before = dict(env)
    _launch_env(env, None, None, None)
    assert env == before


def test_initialize_refuses_explicit_ranks_under_slurm() -> None:
    with pytest.raises(ValueError, match=r"^initialize: rank= and world_size= must not be given under SLURM"):
        _launch_env(task(2), None, 2, 8)


def test_init_method_overrides_the_slurm_address() -> None:
    launch = _launch_env(task(2), "tcp://10.1.1.1:23456", None, None)
    assert (launch.master_addr, launch.master_port) == ("10.1.1.1", 23456)


def test_torchrun_under_slurm_reads_torchrun() -> None:
    env = task(0, RANK="5", LOCAL_RANK="1", WORLD_SIZE="16", LOCAL_WORLD_SIZE="4", TORCHELASTIC_RUN_ID="j")
    launch = _launch_env(env, None, None, None)
    assert launch == from_torchrun(env)
    assert launch is not None and launch.topology.rank == 5
