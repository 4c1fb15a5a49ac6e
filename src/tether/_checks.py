"""Every argument check, in one place: pure functions of the arguments and the job's size.

A check depends only on what every rank passes and on facts every rank shares (world
size, the backends this torch build has), so a bad call raises the same error on every
rank, before any communication. Each message starts with ignite 0.5.5's own sentence
for the same mistake (the text ignite's tests match), with the same exception type,
and adds tether's detail after it; checks ignite does not make have tether's own text.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import pickle
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from numbers import Number
from pathlib import Path
from typing import Any, TypeGuard

import torch
import torch.nn as nn
from torch.optim.optimizer import Optimizer
from torch.utils.data.distributed import DistributedSampler
from torch.utils.data.sampler import Sampler

# Backend names: the ones tether runs on, and the ones ignite knows that tether does not.
NATIVE = ("nccl", "gloo", "mpi")  # ignite's order
UNSUPPORTED = {
    "xla-tpu": "tether does not support XLA/TPU; use torch_xla's own launcher",
    "xla": "tether does not support XLA/TPU; use torch_xla's own launcher",
    "horovod": "tether does not support Horovod; use gloo or nccl",
}


def _show(value: object, width: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


# --- backends ---------------------------------------------------------------------------


def _backend_detail(backend: object) -> str:
    if isinstance(backend, str) and backend in UNSUPPORTED:
        return UNSUPPORTED[backend]
    if isinstance(backend, str) and backend in NATIVE:
        return f"this torch build has no {backend!r} backend"
    return f"got {_show(backend)}"


def check_backend(backend: object, available: tuple[str, ...], cuda: bool) -> str:
    """``initialize``/``spawn``'s backend (ignite's ``_assert_backend``).

    Raises:
        ValueError: not one of ``available``.
        RuntimeError: "nccl" without a CUDA device (as ignite, at once instead of at init).
    """
    if not isinstance(backend, str) or backend not in available:
        raise ValueError(f"Backend should be one of '{available}'; {_backend_detail(backend)}")
    return _check_nccl(backend, cuda)


def check_parallel_backend(backend: object, available: tuple[str, ...], cuda: bool) -> str:
    """``Parallel``'s backend, with the message of ignite's ``Parallel``."""
    if not isinstance(backend, str) or backend not in available:
        raise ValueError(f"Unknown backend '{backend}'. Available backends: {available}; {_backend_detail(backend)}")
    return _check_nccl(backend, cuda)


def _check_nccl(backend: str, cuda: bool) -> str:
    if backend == "nccl" and not cuda:
        raise RuntimeError("Nccl backend is required but no cuda capable devices; torch sees none (use 'gloo' on CPU)")
    return backend


# --- launchers (ignite's Parallel._setup_spawn_params and native model's checks) ---------


def check_serial_parallel(**given: object) -> None:
    """``Parallel(backend=None, ...)``: no launcher argument may be given."""
    for name, value in given.items():
        if value is not None:
            raise ValueError(
                f"If backend is None, argument '{name}' should be also None, but given {value}; "
                "backend=None runs one serial process"
            )


def check_nproc_per_node(nproc_per_node: object) -> int:
    if not _is_int(nproc_per_node) or nproc_per_node < 1:
        raise ValueError(
            f"Argument nproc_per_node should positive, but given {_show(nproc_per_node)}; it must be an int >= 1"
        )
    return nproc_per_node


def check_max_restarts(max_restarts: object, nnodes: int) -> int:
    """``spawn``'s ``max_restarts``: an int >= 0; restarts need one node (its launcher decides alone)."""
    if not _is_int(max_restarts) or max_restarts < 0:
        raise ValueError(f"spawn: max_restarts must be an int >= 0, got {_show(max_restarts)}")
    if max_restarts and nnodes > 1:
        raise ValueError("spawn: max_restarts needs nnodes=1 (use torchrun --max-restarts across nodes)")
    return max_restarts


def check_nnodes(nnodes: object) -> int:
    """``nnodes`` (None means 1)."""
    if nnodes is None:
        return 1
    if not _is_int(nnodes) or nnodes < 1:
        raise ValueError(f"Argument nnodes should positive, but given {_show(nnodes)}; it must be an int >= 1")
    return nnodes


def check_node_rank(node_rank: object, nnodes: int) -> int:
    """``node_rank`` of ``nnodes`` (None means 0, on one node only)."""
    if node_rank is None:
        if nnodes > 1:
            raise ValueError(
                f"If number of nodes larger than one, arguments node_rank should be given; nnodes={nnodes}"
            )
        return 0
    if not _is_int(node_rank) or not 0 <= node_rank < nnodes:
        raise ValueError(
            f"Argument node_rank should be between 0 and {nnodes - 1}, but given {_show(node_rank)}; "
            "it must be an int"
        )
    return node_rank


def check_master(nnodes: int, master_addr: object, master_port: object, init_method: object) -> None:
    """More than one node needs the store's address, or an ``init_method``."""
    if nnodes > 1 and (master_addr is None or master_port is None) and init_method is None:
        raise ValueError(
            "If number of nodes larger than one, arguments master_addr and master_port or init_method "
            f"should be specified, but given master_addr={master_addr}, master_port={master_port} and "
            f"init_method={init_method}."
        )


def check_port(port: object) -> int:
    """A TCP port, as an int or a numeric str (``--master_port`` from argparse, ``MASTER_PORT``)."""
    try:
        value = int(str(port))
    except (TypeError, ValueError):
        value = -1
    if isinstance(port, bool) or not 0 <= value < 65536:
        raise ValueError(f"master_port must be a port number in [0, 65536), got {_show(port)}")
    return value


def check_rank_and_world_size(rank: object, world_size: object) -> tuple[int, int] | None:
    """``initialize(rank=, world_size=)``: both or neither; None when neither."""
    if rank is None and world_size is None:
        return None
    if rank is None or world_size is None:
        raise ValueError(
            f"Both rank and world_size should be provided, but given {rank} and {world_size}; pass both or neither"
        )
    if not _is_int(world_size) or world_size < 1 or not _is_int(rank) or not 0 <= rank < world_size:
        raise ValueError(
            f"rank and world_size must be ints with 0 <= rank < world_size, got rank={_show(rank)}, "
            f"world_size={_show(world_size)}"
        )
    return rank, world_size


# --- syncs and collectives ---------------------------------------------------------------


def check_rank(rank: object, size: int, name: str) -> int:
    """A rank in ``[0, size)``; ``name`` says which argument of which call."""
    if not _is_int(rank):
        raise TypeError(f"{name}: rank must be an int, got {type(rank).__name__} {_show(rank, 40)}")
    if not 0 <= rank < size:
        raise ValueError(f"rank should be between 0 and {size - 1}, but given {rank} ({name})")
    return rank


def check_timeout(timeout: object, name: str) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"{name}: timeout must be a positive number of seconds or None, got {_show(timeout)}")
    return float(timeout)


_NUMBERS = frozenset({int, float})


def check_input(tensor: object, kinds: tuple[type, ...], name: str) -> None:
    """The data argument of a collective: one of ``kinds``."""
    if type(tensor) in _NUMBERS and Number in kinds:  # the common case, without the ABC check of ``Number``
        return
    if not isinstance(tensor, kinds):
        names = ", ".join(k.__name__ for k in kinds)
        raise TypeError(f"Unhandled input type {type(tensor)}; {name} takes one of: {names}")


def check_reduce_op(op: object, ops: Collection[str]) -> str:
    if not isinstance(op, str) or op not in ops:
        raise ValueError(f"Unsupported reduction operation: '{op}'; choose one of {sorted(ops)}")
    return op


_BITWISE = ("AND", "OR")  # ignite's names for BAND/BOR, which NCCL does not have


def check_op_on_backend(op: str, backend: str | None) -> None:
    """A reduction the group's backend lacks: the same clear error on every rank, before any data moves.

    NCCL has no bitwise reductions; without this check NCCL raises inside the collective
    ("Cannot use ReduceOp.BAND with NCCL"), once the ranks are in it.
    """
    if backend == "nccl" and op in _BITWISE:
        raise ValueError(
            f"Unsupported reduction operation: '{op}' on the nccl backend (NCCL has no bitwise "
            f"reductions); for 0/1 values use '{'MIN' if op == 'AND' else 'MAX'}', or reduce on a gloo group"
        )


def check_ranks(ranks: object, world_size: int | None = None) -> list[int]:
    """``new_group``'s ranks: a list of int (in ``[0, world_size)`` when given)."""
    if not isinstance(ranks, list) or not all(_is_int(r) for r in ranks):
        raise ValueError(f"Argument ranks should be list of int, got {_show(ranks)}")
    if world_size is not None and any(not 0 <= r < world_size for r in ranks):
        raise ValueError(f"Argument ranks should be list of int in [0, {world_size}), got {_show(ranks)}")
    return ranks


def group_error(group: object, detail: str = "") -> ValueError:
    """The error for a ``group=`` that is neither None, a list of ranks, nor a ProcessGroup."""
    return ValueError(
        f"Argument group should be list of int or ProcessGroup, got {type(group)}, group={_show(group)}"
        + (f"; {detail}" if detail else "")
    )


def check_group_ranks(group: list[Any], world_size: int) -> list[int]:
    """A ``group=`` given as a list: ranks of the job."""
    if not all(_is_int(r) for r in group):
        raise group_error(group)
    if any(not 0 <= r < world_size for r in group):
        raise group_error(group, f"its ranks must be in [0, {world_size})")
    return group


def check_broadcast(
    tensor: object, src: object, rank: int, world_size: int, safe_mode: bool, distributed: bool
) -> None:
    """``broadcast``'s data (a tensor, number, str or Path; None only where ignite allows it) and ``src``.

    Without a process group ``src`` is not checked (ignite's serial model ignores it).
    """
    if not (isinstance(tensor, (torch.Tensor, Number, str, Path)) or tensor is None):
        raise TypeError(f"Unhandled input type {type(tensor)}; broadcast takes a tensor, a number, a str or a Path")
    if distributed:
        check_rank(src, world_size, "broadcast's src")
    if tensor is not None:
        return
    if not distributed:
        raise ValueError("Argument tensor should not be None; one process has nothing to receive it from")
    if rank == src:
        raise ValueError(f"Source data can not be None; rank {src} sends it")
    if not safe_mode:
        raise ValueError(
            "Argument safe_mode should be True if None is passed for non src rank; "
            "without it, every rank passes a placeholder of the source's type"
        )


def check_src_in_group(src: int, members: Sequence[int]) -> None:
    if src not in members:
        raise ValueError(f"broadcast: src {src} is not in the group {list(members)}")


def check_shapes_input(tensor: object) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"all_gather_tensors_with_shapes: tensor must be a torch.Tensor, got {type(tensor).__name__}")


def check_shapes(tensor: torch.Tensor, shapes: object, size: int, index: int) -> list[list[int]]:
    """One shape per member, each with ``tensor``'s number of dims; this rank's is its own."""
    rows: list[list[int]] = []
    given = -1
    if isinstance(shapes, Sequence) and not isinstance(shapes, str):
        given = len(shapes)
        for s in shapes:
            if not isinstance(s, Sequence) or isinstance(s, str) or not all(_is_int(n) and n >= 0 for n in s):
                break
            rows.append(list(s))
    if len(rows) != size or given != size or any(len(s) != tensor.ndim for s in rows):
        raise ValueError(
            f"all_gather_tensors_with_shapes: need {size} shapes of {tensor.ndim} dims, got {_show(shapes)}"
        )
    if list(tensor.shape) != rows[index]:
        raise ValueError(
            f"all_gather_tensors_with_shapes: tensor has shape {list(tensor.shape)}, shapes says {rows[index]}"
        )
    return rows


# --- auto_model, auto_optim, auto_dataloader, DistributedProxySampler -------------------


def check_auto_model(model: object, sync_bn: object) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"auto_model: model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(sync_bn, bool):
        raise TypeError(f"auto_model: sync_bn must be a bool, got {type(sync_bn).__name__}")


def check_ddp_kwargs(kwargs: Mapping[str, Any], device: torch.device) -> None:
    """On CUDA, tether (as ignite) sets ``device_ids`` itself."""
    if "device_ids" in kwargs:
        raise ValueError(
            f"Argument kwargs should not contain 'device_ids', but got {kwargs}; "
            f"auto_model uses this rank's device, [{device.index}]"
        )


def check_sync_bn_device(sync_bn: bool, device: torch.device) -> None:
    """DistributedDataParallel refuses SyncBatchNorm off CUDA: say so before its first collective."""
    if sync_bn and device.type != "cuda":
        raise ValueError(
            f"SyncBatchNorm layers only work with GPU modules; auto_model: sync_bn=True needs CUDA, and this "
            f"job runs on {device.type}; pass sync_bn=False"
        )


def check_auto_optim(optimizer: object, kwargs: Mapping[str, Any]) -> None:
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"auto_optim: optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if kwargs:
        raise TypeError(
            f"auto_optim: unexpected keyword argument(s) {sorted(kwargs)}: they configure Horovod's "
            "DistributedOptimizer in ignite, and tether runs on native torch.distributed only"
        )


def check_loader_kwargs(kwargs: Mapping[str, Any]) -> None:
    """``batch_size`` a positive int and ``num_workers`` a non-negative int, where given."""
    for name, least in (("batch_size", 1), ("num_workers", 0)):
        if name not in kwargs:
            continue
        value = kwargs[name]
        if not _is_int(value):
            raise TypeError(f"auto_dataloader: {name} must be an int, got {type(value).__name__} {_show(value, 40)}")
        if value < least:
            raise ValueError(f"auto_dataloader: {name} must be >= {least}, got {value}")


def check_proxy_sampler(sampler: object) -> None:
    if not isinstance(sampler, Sampler):
        raise TypeError(
            f"Argument sampler should be instance of torch Sampler, but given: {type(sampler)}; "
            "DistributedProxySampler wraps a torch.utils.data.Sampler"
        )
    if isinstance(sampler, DistributedSampler):
        raise TypeError("Argument sampler must not be a distributed sampler already; use it directly")
    if not hasattr(sampler, "__len__"):
        raise TypeError(
            f"Argument sampler should have length; {type(sampler).__name__} has no __len__, "
            "and DistributedProxySampler splits a fixed number of indices"
        )


def check_replicas(num_replicas: object, rank: object) -> tuple[int, int]:
    if not _is_int(num_replicas):
        raise TypeError(f"DistributedProxySampler: num_replicas must be an int, got {type(num_replicas).__name__}")
    if not _is_int(rank):
        raise TypeError(f"DistributedProxySampler: rank must be an int, got {type(rank).__name__}")
    if num_replicas < 1:
        raise ValueError(f"DistributedProxySampler: num_replicas must be >= 1, got {num_replicas}")
    return num_replicas, rank


def check_start_method(fn: Callable[..., Any], asked: str | None) -> str:
    """The start method for ``fn``: "forkserver" where there is one (Linux, macOS), else
    "spawn"; "fork" for a function a child cannot import.

    Raises:
        ValueError: a bad ``start_method``, or "spawn" asked for a function defined on
            stdin, in ``python -c`` or in a notebook.
        TypeError: ``fn`` cannot be pickled (a lambda, a closure) and would need "spawn".
    """
    methods = multiprocessing.get_all_start_methods()
    if asked is not None and asked not in methods:
        raise ValueError(f"start_method must be one of {methods}, got {asked!r}")
    main = sys.modules.get("__main__")
    main_file = getattr(main, "__file__", None)  # "<stdin>" under `python -`, absent in -c and notebooks
    unimportable = getattr(fn, "__module__", None) == "__main__" and not (main_file and os.path.isfile(main_file))
    if asked is None and unimportable and "fork" in methods:
        asked = "fork"
    elif asked is None:
        asked = "forkserver" if "forkserver" in methods else "spawn"
    if asked == "fork":
        return asked
    if unimportable:
        raise ValueError(
            f"spawn: {getattr(fn, '__qualname__', fn)!r} is defined in __main__ without a file (stdin, python -c, "
            f"a notebook), which start_method={asked!r} cannot import in a child: define it in a module, or use "
            "start_method='fork'"
        )
    try:
        pickle.dumps(fn)
    except Exception as exc:
        raise TypeError(
            f"spawn: the function {getattr(fn, '__qualname__', fn)!r} cannot be pickled for start_method={asked!r} "
            f"({type(exc).__name__}: {exc}); define it at module level, or use start_method='fork'"
        ) from None
    return asked


def to_timedelta(timeout: object) -> datetime.timedelta | None:
    if timeout is None or isinstance(timeout, datetime.timedelta):
        return timeout
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0:
        return datetime.timedelta(seconds=timeout)
    raise ValueError(f"timeout must be a datetime.timedelta or a positive number of seconds, got {timeout!r}")
