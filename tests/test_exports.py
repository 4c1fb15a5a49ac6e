"""The public surface: ``tether.__all__`` is pinned, and ``import tether as idist`` has ignite's names."""

from __future__ import annotations

import inspect

import tether
import tether as idist

EXPECTED_ALL = [
    "BackendError",
    "DistributedProxySampler",
    "ExitCode",
    "JobFailed",
    "Parallel",
    "PeerFailure",
    "PeerLost",
    "SyncMismatch",
    "SyncTimeout",
    "TetherError",
    "all_gather",
    "all_gather_tensors_with_shapes",
    "all_reduce",
    "auto_dataloader",
    "auto_model",
    "auto_optim",
    "available_backends",
    "backend",
    "barrier",
    "broadcast",
    "device",
    "finalize",
    "get_local_rank",
    "get_nnodes",
    "get_node_rank",
    "get_nproc_per_node",
    "get_rank",
    "get_world_size",
    "has_hvd_support",
    "has_native_dist_support",
    "has_xla_support",
    "hostname",
    "initialize",
    "model_name",
    "new_group",
    "one_rank_first",
    "one_rank_only",
    "registered_computation_models",
    "set_local_rank",
    "show_config",
    "spawn",
    "sync",
]

# ignite.distributed's API (ignite/distributed/utils.py and auto.py, ignite 0.5) that
# tether implements; code written for ``import ignite.distributed as idist`` uses these.
IGNITE_API = [
    "Parallel",
    "DistributedProxySampler",
    "all_gather",
    "all_gather_tensors_with_shapes",
    "all_reduce",
    "auto_dataloader",
    "auto_model",
    "auto_optim",
    "available_backends",
    "backend",
    "barrier",
    "broadcast",
    "device",
    "finalize",
    "get_local_rank",
    "get_nnodes",
    "get_node_rank",
    "get_nproc_per_node",
    "get_rank",
    "get_world_size",
    "hostname",
    "initialize",
    "model_name",
    "new_group",
    "one_rank_first",
    "one_rank_only",
    "set_local_rank",
    "show_config",
    "spawn",
    "sync",
]

# ignite's capability probes, used by code that branches on the backend at hand.
IGNITE_PROBES = ["has_native_dist_support", "has_xla_support", "has_hvd_support", "registered_computation_models"]


def test_all_is_pinned_and_sorted() -> None:
    assert tether.__all__ == EXPECTED_ALL
    assert sorted(tether.__all__) == tether.__all__
    assert len(set(tether.__all__)) == len(tether.__all__)


def test_every_name_in_all_exists_and_shows_as_tether() -> None:
    for name in tether.__all__:
        obj = getattr(tether, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert obj.__module__ == "tether", f"{name} shows as {obj.__module__}"


def test_import_tether_as_idist_exposes_ignites_api() -> None:
    missing = [name for name in IGNITE_API if not hasattr(idist, name)]
    assert missing == []
    for name in IGNITE_API:
        assert name in tether.__all__, name
        if name not in ("Parallel", "DistributedProxySampler"):
            assert callable(getattr(idist, name)), name


def test_import_tether_as_idist_exposes_ignites_capability_probes() -> None:
    assert [name for name in IGNITE_PROBES if not hasattr(idist, name)] == []
    assert idist.has_native_dist_support is True
    assert idist.has_xla_support is False and idist.has_hvd_support is False
    assert [m.name for m in idist.registered_computation_models] == ["serial", "native-dist"]


def test_signatures_match_ignites() -> None:
    params = {name: list(inspect.signature(getattr(idist, name)).parameters) for name in IGNITE_API}
    assert params["one_rank_first"][:2] == ["rank", "local"]
    assert params["one_rank_only"][:2] == ["rank", "with_barrier"]
    assert params["all_reduce"][:3] == ["tensor", "op", "group"]
    assert params["all_gather"][:2] == ["tensor", "group"]
    assert params["broadcast"][:4] == ["tensor", "src", "safe_mode", "group"]
    assert params["barrier"][:1] == ["group"]
    assert params["all_gather_tensors_with_shapes"][:3] == ["tensor", "shapes", "group"]
    assert params["spawn"][:5] == ["backend", "fn", "args", "kwargs_dict", "nproc_per_node"]
    assert params["new_group"][:1] == ["ranks"]
    assert params["set_local_rank"] == ["index"]


def test_exceptions_form_the_documented_hierarchy() -> None:
    for name in ("PeerFailure", "SyncTimeout", "SyncMismatch", "BackendError", "JobFailed"):
        assert issubclass(getattr(tether, name), tether.TetherError)
    assert issubclass(tether.TetherError, RuntimeError)
    assert issubclass(tether.PeerLost, tether.PeerFailure)
    assert issubclass(tether.SyncTimeout, TimeoutError)
    assert {c.name: int(c) for c in tether.ExitCode} == {
        "OK": 0,
        "RAISED": 1,
        "PEER_FAILED": 3,
        "TIMEOUT": 4,
        "MISMATCH": 5,
        "WATCHDOG": 6,
        "LAUNCH_FAILED": 7,
    }
