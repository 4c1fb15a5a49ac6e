"""The public surface: ``tether.__all__`` is pinned, and ``import tether as idist`` has ignite's names."""

from __future__ import annotations

import inspect

import pytest

import tether
import tether as idist

EXPECTED_ALL = [
    "BackendError",
    "Checkpointer",
    "DistributedProxySampler",
    "ExitCode",
    "JobFailed",
    "Parallel",
    "PeerFailure",
    "PeerFinished",
    "PeerLost",
    "Position",
    "RankFormatter",
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
    "get_logger",
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
    "patch_ignite",
    "rank_print",
    "register_comm_hook",
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


def _ignite_public_names() -> list[tuple[str, object]]:
    """Every public, non-module attribute of ``ignite.distributed`` (it has no ``__all__``)."""
    ignite_idist = pytest.importorskip("ignite.distributed")
    names = [n for n in dir(ignite_idist) if not n.startswith("_")]
    return [(n, getattr(ignite_idist, n)) for n in names if not inspect.ismodule(getattr(ignite_idist, n))]


def _callables(name: str, obj: object) -> list[tuple[str, object]]:
    """A function, or a class with its public methods (``Parallel.run``, ``set_epoch``...)."""
    if inspect.isclass(obj):
        methods = [(f"{name}.{m}", v) for m, v in vars(obj).items() if inspect.isfunction(v) and not m.startswith("_")]
        return [(name, obj), *methods]
    return [(name, obj)] if callable(obj) else []


def _ours(name: str) -> object:
    obj: object = tether
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _signature_difference(ignite_fn: object, ours: object) -> str | None:
    """None if ``ours`` accepts every call ``ignite_fn`` accepts, with the same meaning.

    ignite's parameters must come first, in order, with the same names, kinds and
    defaults; tether may add parameters after them, each with a default (``timeout=``,
    ``group=``), and before a ``**kwargs`` that both have.
    """
    theirs = list(inspect.signature(ignite_fn).parameters.values())
    mine = list(inspect.signature(ours).parameters.values())
    var = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    their_fixed = [p for p in theirs if p.kind not in var]
    my_fixed = [p for p in mine if p.kind not in var]

    def shape(p: inspect.Parameter) -> tuple[str, object, object]:
        return (p.name, p.kind, p.default)

    if [shape(p) for p in my_fixed[: len(their_fixed)]] != [shape(p) for p in their_fixed]:
        return "ignite's parameters are not a prefix of tether's with the same names, kinds and defaults"
    extra = my_fixed[len(their_fixed) :]
    if any(p.default is inspect.Parameter.empty for p in extra):
        return f"tether's extra parameters {[p.name for p in extra]} must all have defaults"
    if any(p.kind is inspect.Parameter.POSITIONAL_ONLY for p in extra):
        return "tether's extra parameters must not be positional-only"
    for kind in var:
        their_var = [p.name for p in theirs if p.kind is kind]
        my_var = [p.name for p in mine if p.kind is kind]
        if their_var and their_var != my_var:
            return f"ignite takes {kind.description} {their_var}, tether {my_var}"
    return None


# Differences being fixed elsewhere; each entry must still differ (remove it once fixed).
PENDING: dict[str, str] = {}  # name -> why it still differs; empty: none does


def test_signatures_match_the_installed_ignites() -> None:
    """Every public callable of ``ignite.distributed``: tether's takes the same calls."""
    checked, differences = [], {}
    for name, obj in _ignite_public_names():
        for qualname, fn in _callables(name, obj):
            assert hasattr(tether, qualname.split(".")[0]), f"tether lacks ignite's {name}"
            ours = _ours(qualname)
            assert callable(ours), qualname
            difference = _signature_difference(fn, ours)
            if difference is not None:
                differences[qualname] = (
                    f"{difference}: ignite {inspect.signature(fn)}, tether {inspect.signature(ours)}"
                )
            checked.append(qualname)
    assert {name: d for name, d in differences.items() if name not in PENDING} == {}
    assert sorted(name for name in PENDING if name not in differences) == [], "fixed: remove it from PENDING"
    # the whole API was compared, not an empty intersection
    assert {"all_reduce", "broadcast", "spawn", "Parallel", "Parallel.run", "one_rank_first"} <= set(checked)


def test_the_signature_comparison_catches_what_breaks_a_call() -> None:
    def ignite_like(tensor: object, op: str = "SUM", *, group: object = None, **kwargs: object) -> None:
        pass

    def extra_keyword(
        tensor: object, op: str = "SUM", *, group: object = None, timeout: object = None, **kwargs: object
    ) -> None:
        pass

    def renamed(t: object, op: str = "SUM", *, group: object = None, **kwargs: object) -> None:
        pass

    def other_default(tensor: object, op: str = "sum", *, group: object = None, **kwargs: object) -> None:
        pass

    def required_extra(
        tensor: object, op: str = "SUM", *, group: object = None, timeout: object, **kwargs: object
    ) -> None:
        pass

    def no_kwargs(tensor: object, op: str = "SUM", *, group: object = None) -> None:
        pass

    assert _signature_difference(ignite_like, extra_keyword) is None
    for ours in (renamed, other_default, required_extra, no_kwargs):
        assert _signature_difference(ignite_like, ours) is not None, ours.__name__


def test_every_public_name_of_ignite_exists_with_the_same_kind() -> None:
    for name, obj in _ignite_public_names():
        assert hasattr(tether, name), f"tether lacks ignite's {name}"
        ours = getattr(tether, name)
        assert inspect.isclass(ours) == inspect.isclass(obj), name
        assert callable(ours) == callable(obj), name
        if isinstance(obj, bool):
            assert isinstance(ours, bool), name
    assert isinstance(idist.registered_computation_models, tuple)
    for model in idist.registered_computation_models:
        assert isinstance(model.available_backends, tuple)
        assert callable(model.create_from_context)
    assert idist.registered_computation_models[0].create_from_context() is not None  # serial: always a model
    assert idist.registered_computation_models[1].create_from_context() is None  # no process group here


def test_exceptions_form_the_documented_hierarchy() -> None:
    for name in ("PeerFailure", "SyncTimeout", "SyncMismatch", "BackendError", "JobFailed"):
        assert issubclass(getattr(tether, name), tether.TetherError)
    assert issubclass(tether.TetherError, RuntimeError)
    assert issubclass(tether.PeerLost, tether.PeerFailure)
    assert issubclass(tether.PeerFinished, tether.PeerFailure)
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
