"""Computation models: one interface, one class per model.

Backends implement only primitives that *issue* work; validation (``_checks.py``), type
conversion and every wait live in ``collectives.py`` and ``syncs.py``. ``Backend`` is the
serial model, a null object: one process, every collective returns its input.

The classes are ``tether.registered_computation_models``, and answer what ignite's do:
``name``, ``available_backends`` and ``create_from_context()``. ``device()`` is ignite's
(the user's device); ``comm_device()`` is where tether stages what it sends, which for
gloo stays the CPU even where CUDA is present.
"""

from __future__ import annotations

import datetime
import os
import warnings
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, Store

from . import _checks
from ._env import Topology, env_int

REDUCE_OPS: dict[str, dist.ReduceOp.RedOpType] = {  # ignite's names
    "SUM": dist.ReduceOp.SUM,
    "PRODUCT": dist.ReduceOp.PRODUCT,
    "MIN": dist.ReduceOp.MIN,
    "MAX": dist.ReduceOp.MAX,
    "AND": dist.ReduceOp.BAND,
    "OR": dist.ReduceOp.BOR,
}


def available_backends() -> tuple[str, ...]:
    """The native backends this torch build has, in ignite's order ("nccl", "gloo", "mpi")."""
    if not dist.is_available():
        return ()
    checks = {"nccl": dist.is_nccl_available, "gloo": dist.is_gloo_available, "mpi": dist.is_mpi_available}
    return tuple(name for name in _checks.NATIVE if checks[name]())


def check_backend(backend: object, caller: str = "initialize") -> str:
    """Validate a backend name; the same error on every rank, before any connection.

    Args:
        caller: "Parallel" gives the message of ignite's ``Parallel``; any other caller
            (``initialize``, ``spawn``) ignite's ``_assert_backend``.

    Raises:
        ValueError: not a backend of this torch build (XLA and Horovod never are).
        RuntimeError: "nccl" and torch sees no CUDA device.
    """
    check = _checks.check_parallel_backend if caller == "Parallel" else _checks.check_backend
    return check(backend, available_backends(), torch.cuda.is_available())


class Backend:
    """The serial model; the base of every other (a null object)."""

    name: ClassVar[str] = "serial"
    available_backends: ClassVar[tuple[str, ...]] = ()

    def __init__(self, topology: Topology | None = None) -> None:
        self.topology = topology or Topology()

    @staticmethod
    def create_from_context() -> Backend | None:
        """The serial model (ignite's ``_SerialModel.create_from_context``)."""
        return Backend()

    def backend(self) -> str | None:
        return None

    def device(self) -> torch.device:
        """CUDA if available, else MPS if available, else the CPU (ignite's serial device)."""
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")

    def comm_device(self) -> torch.device:
        """Where collectives stage numbers, strings and tensors they must move."""
        return self.device()

    def can_send(self, tensor: torch.Tensor) -> bool:
        """Whether a collective can send ``tensor`` where it is, without a copy."""
        return True

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
    available_backends: ClassVar[tuple[str, ...]] = available_backends()

    def __init__(self, topology: Topology, backend: str, owns_group: bool) -> None:
        super().__init__(topology)
        self._backend = backend
        self._owns_group = owns_group

    @staticmethod
    def create_from_context(local_rank_hint: int | None = None) -> NativeBackend | None:
        """The model of a process group created outside tether; None when there is none.

        Reads ``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` (else ``local_rank_hint``, else one node),
        never syncs, and does not own the group (``shutdown`` leaves it alone).
        """
        if not (dist.is_available() and dist.is_initialized()):
            return None
        rank, world = dist.get_rank(), dist.get_world_size()
        env = os.environ
        hint = rank if local_rank_hint is None else local_rank_hint
        local = env_int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else hint
        nproc = env_int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else world
        topology = Topology(rank, world, local, nproc, world // nproc, rank // nproc)
        return NativeBackend(topology, str(dist.get_backend()), owns_group=False)

    @classmethod
    def create(
        cls, backend: str, topology: Topology, store: Store, timeout: datetime.timedelta | None
    ) -> NativeBackend:
        kwargs: dict[str, Any] = {"timeout": timeout} if timeout is not None else {}
        if backend == "nccl":
            torch.cuda.set_device(topology.local_rank)
            kwargs["device_id"] = torch.device("cuda", topology.local_rank)
        elif torch.cuda.is_available() and topology.local_rank < torch.cuda.device_count():
            torch.cuda.set_device(topology.local_rank)  # as ignite: device() is cuda:<local rank>
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
        """The current CUDA device where CUDA is available (any backend), else the CPU (ignite's)."""
        if torch.cuda.is_available():
            index = torch.cuda.current_device()
            if index < self.topology.local_rank < torch.cuda.device_count():
                warnings.warn(
                    "Current device index is less than current local rank. "
                    "Please, make sure to call torch.cuda.set_device(local_rank).",
                    stacklevel=3,
                )
            return torch.device(f"cuda:{index}")
        return torch.device("cpu")

    def comm_device(self) -> torch.device:
        if self._backend == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def can_send(self, tensor: torch.Tensor) -> bool:
        if self._backend == "nccl":
            return tensor.device == self.comm_device()
        if self._backend == "gloo":
            return tensor.device.type in ("cpu", "cuda")  # gloo has CUDA paths for every collective tether uses
        return tensor.device.type == "cpu"

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
