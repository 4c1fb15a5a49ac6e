"""Bad input (DESIGN.md, F9): a clear ValueError/TypeError, identical on every rank, before any wait.

Misuse of a launcher (``spawn``, ``Parallel``, ``initialize``) and of the syncs without a
process group is checked in this process; bad input inside a job runs on gloo
(``tests/jobs/core_bad_input.py``), where every rank must raise the same error and no
rank may diverge into a wait.
"""

from __future__ import annotations

import sys

import pytest
import torch

import _harness
import tether as idist
from _core import JOB_BOUND, TEST_TIMEOUT, assert_ended, assert_no_leftovers, lines, results, tail
from _harness import python, torchrun

# --- inside a job -------------------------------------------------------------------

EXPECTED = {  # call -> (type, start of the message), as raised on every rank of 4
    "one_rank_first(rank=7)": ("ValueError", "rank should be between 0 and 3, but given 7 (one_rank_first)"),
    "one_rank_first(rank=-1)": ("ValueError", "rank should be between 0 and 3, but given -1 (one_rank_first)"),
    "one_rank_first(rank='0')": ("TypeError", "one_rank_first: rank must be an int"),
    "one_rank_first(rank=1.0)": ("TypeError", "one_rank_first: rank must be an int"),
    "one_rank_first(rank=4, local=True)": (
        "ValueError",
        "rank should be between 0 and 3, but given 4 (one_rank_first(local=True))",
    ),
    "one_rank_first(timeout=0)": ("ValueError", "one_rank_first: timeout must be a positive number"),
    "one_rank_only(rank=4)": ("ValueError", "rank should be between 0 and 3, but given 4 (one_rank_only)"),
    "barrier(timeout=-1)": ("ValueError", "barrier: timeout must be a positive number"),
    "barrier(group=[0, 7])": (
        "ValueError",
        "Argument group should be list of int or ProcessGroup, got <class 'list'>, group=[0, 7]; "
        "its ranks must be in [0, 4)",
    ),
    "all_reduce('abc')": ("TypeError", "Unhandled input type <class 'str'>; all_reduce takes"),
    "all_reduce(op='MEAN')": ("ValueError", "Unsupported reduction operation: 'MEAN'"),
    "all_reduce(group='abc')": (
        "ValueError",
        "Argument group should be list of int or ProcessGroup, got <class 'str'>",
    ),
    "all_reduce(timeout=0)": ("ValueError", "all_reduce: timeout must be a positive number"),
    "all_gather(group=[9])": ("ValueError", "Argument group should be list of int or ProcessGroup, got <class 'list'>"),
    "all_gather_tensors_with_shapes(3 shapes)": ("ValueError", "all_gather_tensors_with_shapes: need 4 shapes"),
    "all_gather_tensors_with_shapes(list)": (
        "TypeError",
        "all_gather_tensors_with_shapes: tensor must be a torch.Tensor",
    ),
    "broadcast([1, 2])": ("TypeError", "Unhandled input type <class 'list'>; broadcast takes"),
    "broadcast(src=4)": ("ValueError", "rank should be between 0 and 3, but given 4 (broadcast's src)"),
    "broadcast(src='0')": ("TypeError", "broadcast's src: rank must be an int"),
    "new_group([0, 9])": ("ValueError", "Argument ranks should be list of int in [0, 4), got [0, 9]"),
}
OUT_OF_RANGE = "rank should be between 0 and 3, but given 7 (one_rank_first)"


@pytest.mark.timeout(TEST_TIMEOUT)
@pytest.mark.parametrize("launcher", ["spawn", pytest.param("init", marks=pytest.mark.full)])
def test_bad_input_in_a_job_raises_the_same_error_on_every_rank_before_any_wait(launcher: str) -> None:
    world = 4
    if launcher == "init":
        res = torchrun("core_bad_input.py", launcher, str(world), nproc=world, bound=JOB_BOUND)
    else:
        res = python("core_bad_input.py", launcher, str(world), bound=JOB_BOUND)
    assert_ended(res)
    bad = {d["rank"]: d for d in lines(res, "BAD")}
    assert sorted(bad) == list(range(world)), tail(res)
    for rank, d in bad.items():
        # every caught bad call raised the expected error...
        got = {name: (kind, message) for name, kind, message in d["errors"]}
        assert set(got) == set(EXPECTED), got
        for name, (kind, start) in EXPECTED.items():
            assert got[name][0] == kind and got[name][1].startswith(start), f"rank {rank}, {name}: {got[name]}"
        # ...identical on every rank, and no rank diverged into a wait: the next all_reduce
        # met every rank
        assert d["errors"] == bad[0]["errors"], f"rank {rank} differs from rank 0"
        assert d["sum"] == world, d
    # then one_rank_first(rank=7), uncaught: every rank raised its own ValueError at once
    got = results(res)
    assert sorted(got) == list(range(world)), tail(res)
    for rank, d in got.items():
        assert d["exc"] == "ValueError" and d["msg"] == OUT_OF_RANGE, f"rank {rank}: {d}"
        assert d["phase"] == "one_rank_first(rank=7) uncaught", d
    assert res.returncode != 0, tail(res)
    assert f"ValueError: {OUT_OF_RANGE}" in res.output, tail(res)
    if launcher == "spawn":
        # the same error on every rank: one report that names no culprit (issue 11)
        assert res.stderr.count(f"tether: job failed. Every rank raised ValueError: {OUT_OF_RANGE}\n") == 1, tail(res)
        assert "Root cause" not in res.stderr, tail(res)
        origin = next(line for line in res.stderr.splitlines() if line.startswith("  on host"))
        assert "core_bad_input.py" in origin, origin  # the user's `with`, not contextlib's __enter__
    assert_no_leftovers(res)


# --- launchers, in this process --------------------------------------------------------


def work(local_rank: int) -> None:  # never runs: every call below fails before spawning
    raise AssertionError("spawned")


@pytest.mark.parametrize(
    ("backend", "kind", "match"),
    [
        ("foo", ValueError, r"; got 'foo'$"),
        ("xla-tpu", ValueError, r"; tether does not support XLA/TPU"),
        ("horovod", ValueError, r"; tether does not support Horovod"),
        (None, ValueError, r"; got None$"),
        (3, ValueError, r"; got 3$"),
    ],
)
def test_spawn_parallel_and_initialize_reject_bad_backends(backend: object, kind: type, match: str) -> None:
    assert_backend = r"^Backend should be one of '\(.*\)'"  # ignite's _assert_backend (spawn, initialize)
    with pytest.raises(kind, match=assert_backend + match):
        idist.spawn(backend, work, (), nproc_per_node=2)  # type: ignore[arg-type]
    if backend is not None:  # ignite's Parallel (needs check_backend(backend, "Parallel") in parallel.py)
        with pytest.raises(kind, match=r"^Unknown backend '.*'. Available backends: \(.*\)" + match):
            idist.Parallel(backend=backend, nproc_per_node=2)  # type: ignore[arg-type]
    with pytest.raises(kind, match=assert_backend + match):
        idist.initialize(backend)  # type: ignore[arg-type]
    assert not torch.distributed.is_initialized()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"nproc_per_node": 0}, r"^Argument nproc_per_node should positive, but given 0"),
        ({"nproc_per_node": -2}, r"^Argument nproc_per_node should positive, but given -2"),
        ({"nproc_per_node": "2"}, r"^Argument nproc_per_node should positive, but given '2'"),
        ({"nproc_per_node": True}, r"^Argument nproc_per_node should positive, but given True"),
        ({"nproc_per_node": 1, "nnodes": 0}, r"^Argument nnodes should positive, but given 0"),
        (
            {"nproc_per_node": 1, "nnodes": 2, "node_rank": 2, "master_port": 1234},
            r"^Argument node_rank should be between 0 and 1",
        ),
        (
            {"nproc_per_node": 1, "nnodes": 2, "node_rank": 1},
            r"^If number of nodes larger than one, arguments master_addr and master_port should be specified",
        ),
        ({"nproc_per_node": 1, "init_method": "ftp://x"}, r"init_method 'ftp://x' is not supported"),
        ({"nproc_per_node": 1, "init_method": "tcp://nohost"}, r"init_method must look like tcp://HOST:PORT"),
        ({"nproc_per_node": 1, "timeout": -1}, r"timeout must be a datetime.timedelta or a positive number"),
        ({"nproc_per_node": 1, "start_method": "thread"}, r"start_method must be one of"),
    ],
)
def test_spawn_rejects_bad_arguments_before_starting_any_process(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        idist.spawn("gloo", work, (), **kwargs)  # type: ignore[arg-type]


def test_spawn_rejects_an_unknown_keyword_argument() -> None:
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\): \['nprocs'\]"):
        idist.spawn("gloo", work, (), nprocs=2)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"backend": None, "nproc_per_node": 2},
            r"^If backend is None, argument 'nproc_per_node' should be also None, but given 2",
        ),
        (
            {"backend": None, "master_port": 1234},
            r"^If backend is None, argument 'master_port' should be also None, but given 1234",
        ),
        ({"backend": "gloo", "nproc_per_node": 0}, r"^Argument nproc_per_node should positive, but given 0"),
        ({"backend": "gloo", "nproc_per_node": "4"}, r"^Argument nproc_per_node should positive, but given '4'"),
    ],
)
def test_parallel_rejects_bad_arguments(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        idist.Parallel(**kwargs)  # type: ignore[arg-type]


def test_parallel_rejects_nproc_per_node_under_a_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"nproc_per_node is given, but this process already runs under a launcher"):
        idist.Parallel("gloo", nproc_per_node=2)


def test_initialize_rejects_half_given_ranks_and_unknown_options(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_JOB_ID", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match=r"^Both rank and world_size should be provided"):
        idist.initialize("gloo", rank=0)
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\): \['nproc_per_node'\]"):
        idist.initialize("gloo", rank=0, world_size=1, nproc_per_node=1)
    with pytest.raises(ValueError, match=r"timeout must be a datetime.timedelta or a positive number"):
        idist.initialize("gloo", timeout="10")
    assert not torch.distributed.is_initialized()


ONE_PROCESS_WORLD = """
import torch.distributed as dist, tether
tether.initialize("gloo")
answers = (tether.get_world_size(), tether.get_rank(), tether.backend(), tether.all_reduce(0.1))
print("ANSWERS", *answers, dist.is_initialized())
tether.finalize()
print("AFTER", tether.get_world_size(), dist.is_initialized())
"""


@pytest.mark.timeout(60)
def test_initialize_outside_any_launcher_runs_a_job_of_one_process() -> None:
    res = _harness.run([sys.executable, "-c", ONE_PROCESS_WORLD], bound=50)
    assert res.returncode == 0, res.output[-3000:]
    assert "ANSWERS 1 0 gloo 0.1 True" in res.stdout, res.output[-3000:]
    assert "AFTER 1 False" in res.stdout, res.output[-3000:]
    assert res.leftovers == []


# --- the syncs without a process group (validation does not depend on it) -------------


def test_one_rank_first_rejects_out_of_range_and_non_int_ranks() -> None:
    with (
        pytest.raises(ValueError, match=r"^rank should be between 0 and 0, but given 1 \(one_rank_first\)$"),
        idist.one_rank_first(rank=1),
    ):
        pass
    with (
        pytest.raises(ValueError, match=r"^rank should be between 0 and 0, but given -1 \(one_rank_first\)$"),
        idist.one_rank_first(rank=-1),
    ):
        pass
    with (
        pytest.raises(TypeError, match=r"one_rank_first: rank must be an int, got str '0'"),
        idist.one_rank_first(rank="0"),
    ):  # type: ignore[arg-type]
        pass
    with (
        pytest.raises(TypeError, match=r"one_rank_first: rank must be an int, got bool"),
        idist.one_rank_first(rank=True),
    ):
        pass
    with (
        pytest.raises(ValueError, match=r"one_rank_first: timeout must be a positive number"),
        idist.one_rank_first(timeout=-1),
    ):
        pass


def test_one_rank_only_rejects_a_bad_rank_when_called() -> None:
    @idist.one_rank_only(rank=3)
    def f() -> None:
        pass

    with pytest.raises(ValueError, match=r"^rank should be between 0 and 0, but given 3 \(one_rank_only\)$"):
        f()


@pytest.mark.parametrize(
    ("call", "kind", "match"),
    [
        (
            lambda: idist.all_reduce("abc"),
            TypeError,
            r"^Unhandled input type <class 'str'>; all_reduce takes one of: Tensor, Number$",
        ),
        (lambda: idist.all_reduce([1, 2]), TypeError, r"^Unhandled input type <class 'list'>"),
        (lambda: idist.all_reduce(1, op="mean"), ValueError, r"^Unsupported reduction operation: 'mean'; choose one"),
        (lambda: idist.all_reduce(1, timeout=0), ValueError, r"all_reduce: timeout must be a positive number"),
        (lambda: idist.broadcast([1, 2]), TypeError, r"^Unhandled input type <class 'list'>; broadcast takes"),
        (lambda: idist.broadcast({"a": 1}), TypeError, r"^Unhandled input type <class 'dict'>"),
        (lambda: idist.broadcast(None), ValueError, r"^Argument tensor should not be None"),  # ignite's serial model
        (
            lambda: idist.all_gather_tensors_with_shapes([1], [[1]]),
            TypeError,
            r"tensor must be a torch.Tensor, got list",
        ),
        (lambda: idist.barrier(timeout=0), ValueError, r"barrier: timeout must be a positive number"),
        (lambda: idist.new_group("0"), ValueError, r"^Argument ranks should be list of int, got '0'$"),
        (lambda: idist.set_local_rank(-1), ValueError, r"set_local_rank: index must be a non-negative int"),
    ],
)
def test_collectives_reject_unsupported_input_with_a_clear_error(call: object, kind: type, match: str) -> None:
    with pytest.raises(kind, match=match):
        call()  # type: ignore[operator]
