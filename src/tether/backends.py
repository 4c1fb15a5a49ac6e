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
import socket
import warnings
from typing import Any, ClassVar

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch._C._distributed_c10d import PrefixStore, Store

from . import _checks, _devices
from ._core.nccl import ABORT_BUDGET, abort_in_background
from ._env import Topology, env_int

_CPU = torch.device("cpu")

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
    def completes_at_enqueue(self) -> bool:
        """Whether a work's future completes before the work itself (see ``NativeBackend``)."""
        return False

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
        self._device_index: int | None = None  # the CUDA device chosen for a group tether made

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
    def prepare(cls, backend: str, topology: Topology) -> NativeBackend:
        """The model of a group tether is about to create: its CUDA device chosen and set.

        The device follows what the process sees (``_devices.choose_device``), for every
        backend where CUDA is present (ignite's ``device()`` is the current device).
        """
        self = cls(topology, backend, owns_group=True)
        if backend == "nccl" or torch.cuda.is_available():
            choice = _devices.choose_device(
                os.environ, topology.local_rank, topology.nproc_per_node, torch.cuda.device_count()
            )
            self._device_index = choice.index
            torch.cuda.set_device(choice.index)
        return self

    def create_group(self, store: Store, timeout: datetime.timedelta | None) -> None:
        """Create the default process group on ``store`` (a prefix of the job's store).

        NCCL: the ranks first compare their GPUs over the store (``check_devices``), and
        the group is bound to this rank's device (``device_id``), which makes NCCL create
        its communicator here, eagerly: ``runtime.start`` runs this under the watchdog.
        """
        kwargs: dict[str, Any] = {"timeout": timeout} if timeout is not None else {}
        if self._backend == "nccl":
            assert self._device_index is not None  # set by ``prepare``
            check_devices(store, self.topology, self._device_index)
            kwargs["device_id"] = torch.device("cuda", self._device_index)
        dist.init_process_group(
            self._backend,
            store=self.group_store(store),
            rank=self.topology.rank,
            world_size=self.topology.world_size,
            **kwargs,
        )

    @staticmethod
    def group_store(store: Store) -> Store:
        """The store ``init_process_group`` is given, over ``store`` (torch's default store is
        it under the group's name: ``_core.storewaits.default_store_on``)."""
        return PrefixStore("pg", store)

    def backend(self) -> str | None:
        return self._backend

    @property
    def distributed(self) -> bool:
        return True

    def device(self) -> torch.device:
        """The group's CUDA device where CUDA is available (any backend), else the CPU (ignite's).

        A group bound to a device (``init_process_group(device_id=...)``: tether's NCCL
        groups, and an adopted group made so) answers that device; any other the current one.
        """
        if torch.cuda.is_available():
            bound = _bound_device()
            if bound is not None:
                return bound
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
            return _bound_device() or torch.device("cuda", torch.cuda.current_device())
        return _CPU

    @property
    def completes_at_enqueue(self) -> bool:
        """Whether a work's future completes when its kernel is enqueued, not finished (NCCL).

        Then only ``work.is_completed()`` says the collective finished; ``waits`` polls it.
        """
        return self._backend == "nccl"

    def can_send(self, tensor: torch.Tensor) -> bool:
        if self._backend == "nccl":
            return tensor.device == self.comm_device()
        if self._backend == "gloo":
            return tensor.device.type in ("cpu", "cuda")  # gloo has CUDA paths for every collective tether uses
        return tensor.device.type == "cpu"

    def abort(self) -> None:
        """Abort NCCL's communicators so that a thread blocked in one gets an error.

        Only NCCL can unblock a thread inside a collective; gloo cannot (measured). Every
        group's communicator is aborted inside one NCCL group call (aborted one by one they
        can deadlock: pytorch#119797), and torch's registry of groups is left as it is:
        torch's ``_abort_process_group`` clears it, after which the main thread's raw
        ``dist`` and DDP calls fail with ``ValueError``/``AssertionError`` instead of the
        backend error that tether explains. Can block (``ncclCommAbort`` may hang): run it
        with ``abort_in_background``.
        """
        if self._backend != "nccl" or not dist.is_initialized():
            return
        names = c10d._world.pg_names
        everyone = sorted(list(names), key=lambda pg: names[pg], reverse=True)  # subgroups first, as torch does
        nccl = _nccl_of(dist.group.WORLD)
        if nccl is not None:
            nccl._group_start()
        try:
            for pg in everyone:
                pg.abort()
        finally:
            if nccl is not None:
                nccl._group_end()

    def shutdown(self, clean: bool) -> None:
        if not self._owns_group or not dist.is_initialized():
            return
        if clean:
            dist.destroy_process_group()
        else:
            # After a failure destroy_process_group can block on a dead peer: abort where
            # the backend has it (never waiting on it longer than ABORT_BUDGET), and drop the group.
            abort_in_background(self.abort, ABORT_BUDGET)


def _nccl_of(pg: Any) -> Any:
    """``pg``'s NCCL backend object, or None."""
    try:
        backend = pg._get_backend(torch.device("cuda"))
    except RuntimeError:
        return None
    nccl_class = getattr(c10d, "ProcessGroupNCCL", None)
    return backend if nccl_class is not None and isinstance(backend, nccl_class) else None


def _bound_device() -> torch.device | None:
    """The device the default group is bound to (``device_id``), if any."""
    pg = dist.group.WORLD if dist.is_initialized() else None
    bound = getattr(pg, "bound_device_id", None)
    return bound if isinstance(bound, torch.device) else None


def check_devices(store: Store, topology: Topology, index: int) -> None:
    """With NCCL: every rank of a node compares its GPU with the others', before the group exists.

    Each rank writes its GPU's identity (host or ``NCCL_HOSTID``, and UUID) to the store
    and reads its node's; ranks that share a GPU make every rank of the node raise the same
    ``ValueError``, where NCCL would fail later with "Duplicate GPU detected". Costs one
    store write and one read of the node's keys per rank, once.

    Raises:
        ValueError: two ranks of this node share a GPU.
    """
    uuid = str(torch.cuda.get_device_properties(index).uuid)
    store.set(f"gpu/{topology.rank}", _devices.device_identity(socket.gethostname(), uuid, os.environ))
    ranks = topology.node_ranks
    keys = [f"gpu/{r}" for r in ranks]
    store.wait(keys)
    identities = [v.decode() for v in store.multi_get(keys)]
    problem = _devices.duplicate_devices(identities, ranks)
    if problem is not None:
        raise ValueError(problem)
