"""Computation models: one interface, one class per model.

Backends implement only primitives that *issue* work; validation, type conversion and
every wait live in ``collectives.py`` and ``sync.py``. ``SerialBackend`` is the null
object: one process, every collective returns its input.
"""

from __future__ import annotations

import datetime
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, Store

from ._env import Topology

SUPPORTED = ("gloo", "nccl", "mpi")
UNSUPPORTED = {
    "xla": "tether does not support XLA/TPU; use torch_xla's own launcher",
    "xla-tpu": "tether does not support XLA/TPU; use torch_xla's own launcher",
    "horovod": "tether does not support Horovod; use gloo or nccl",
}

REDUCE_OPS: dict[str, dist.ReduceOp.RedOpType] = {
    "SUM": dist.ReduceOp.SUM,
    "PRODUCT": dist.ReduceOp.PRODUCT,
    "MIN": dist.ReduceOp.MIN,
    "MAX": dist.ReduceOp.MAX,
    "AND": dist.ReduceOp.BAND,
    "OR": dist.ReduceOp.BOR,
}


def available_backends() -> tuple[str, ...]:
    """The native backends this torch build has."""
    if not dist.is_available():
        return ()
    checks = {"gloo": dist.is_gloo_available, "nccl": dist.is_nccl_available, "mpi": dist.is_mpi_available}
    return tuple(name for name, ok in checks.items() if ok())


def check_backend(backend: object) -> str:
    """Validate a backend name; the same error on every rank, before any connection."""
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str such as 'gloo' or 'nccl', got {type(backend).__name__}")
    if backend in UNSUPPORTED:
        raise ValueError(f"backend {backend!r} is not supported: {UNSUPPORTED[backend]}")
    if backend not in SUPPORTED:
        raise ValueError(f"unknown backend {backend!r}; choose one of {SUPPORTED}")
    if backend not in available_backends():
        raise ValueError(f"backend {backend!r} is not available in this torch build; it has {available_backends()}")
    if backend == "nccl" and not torch.cuda.is_available():
        raise ValueError("backend 'nccl' needs CUDA devices, and torch sees none")
    return backend


class Backend:
    """The serial model; the base of every other (a null object)."""

    name: ClassVar[str] = "serial"

    def __init__(self, topology: Topology | None = None) -> None:
        self.topology = topology or Topology()

    def backend(self) -> str | None:
        return None

    def device(self) -> torch.device:
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("cpu")

    @property
    def distributed(self) -> bool:
        return False

    def abort(self) -> None:
        """Unblock threads stuck in this backend's collectives, where it can."""

    def shutdown(self, clean: bool) -> None:
        """Release the process group; after a failure, never block (abort or skip)."""


class NativeBackend(Backend):
    """torch.distributed with gloo, nccl or mpi."""

    name: ClassVar[str] = "native-dist"

    def __init__(self, topology: Topology, backend: str, owns_group: bool) -> None:
        super().__init__(topology)
        self._backend = backend
        self._owns_group = owns_group

    @classmethod
    def create(
        cls, backend: str, topology: Topology, store: Store, timeout: datetime.timedelta | None
    ) -> NativeBackend:
        kwargs: dict[str, Any] = {"timeout": timeout} if timeout is not None else {}
        if backend == "nccl":
            torch.cuda.set_device(topology.local_rank)
            kwargs["device_id"] = torch.device("cuda", topology.local_rank)
        dist.init_process_group(
            backend,
            store=PrefixStore("pg", store),
            rank=topology.rank,
            world_size=topology.world_size,
            **kwargs,
        )
        return cls(topology, backend, owns_group=True)

    def backend(self) -> str | None:
        return self._backend

    @property
    def distributed(self) -> bool:
        return True

    def device(self) -> torch.device:
        if self._backend == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def abort(self) -> None:
        # Only NCCL can unblock a thread inside a collective; gloo cannot (measured).
        if self._backend == "nccl" and dist.is_initialized():
            from torch.distributed.distributed_c10d import _abort_process_group

            _abort_process_group()

    def shutdown(self, clean: bool) -> None:
        if not self._owns_group or not dist.is_initialized():
            return
        if clean:
            dist.destroy_process_group()
        else:
            # After a failure destroy_process_group can block on a dead peer: abort where
            # the backend has it, otherwise drop the group and let the process exit.
            self.abort()
