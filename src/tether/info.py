"""Read-only facts about this process's place in the job (ignite's getters)."""

from __future__ import annotations

import logging
import socket

import torch
import torch.distributed as dist

from . import backends
from ._core.runtime import current

log = logging.getLogger("tether")

# ignite's capability probes, for code that branches on what the installation offers.
has_native_dist_support: bool = dist.is_available()
has_xla_support = False  # tether does not run on XLA/TPU
has_hvd_support = False  # nor with Horovod
registered_computation_models: list[type[backends.Backend]] = [backends.Backend, backends.NativeBackend]


def get_rank() -> int:
    """This process's global rank (0 without a process group)."""
    return current().backend.topology.rank


def get_world_size() -> int:
    """Number of ranks in the job (1 without a process group)."""
    return current().backend.topology.world_size


def get_local_rank() -> int:
    """This process's rank on its node."""
    return current().backend.topology.local_rank


def get_nproc_per_node() -> int:
    """Number of ranks on each node."""
    return current().backend.topology.nproc_per_node


def get_nnodes() -> int:
    """Number of nodes in the job."""
    return current().backend.topology.nnodes


def get_node_rank() -> int:
    """This node's index among the job's nodes."""
    return current().backend.topology.node_rank


def device() -> torch.device:
    """The device collectives use: ``cuda:<index>`` under NCCL, else the CPU."""
    return current().backend.device()


def backend() -> str | None:
    """The backend name ("gloo", "nccl", ...), or None without a process group."""
    return current().backend.backend()


def available_backends() -> tuple[str, ...]:
    """The native backends this torch build offers."""
    return backends.available_backends()


def model_name() -> str:
    """ "serial" or "native-dist", as in ignite."""
    return current().backend.name


def hostname() -> str:
    """This machine's host name."""
    return socket.gethostname()


def show_config() -> None:
    """Log the distributed configuration (logger "tether", level INFO)."""
    topo = current().backend.topology
    for name, value in (
        ("distributed configuration", model_name()),
        ("backend", backend()),
        ("device", device().type),
        ("hostname", hostname()),
        ("world size", topo.world_size),
        ("rank", topo.rank),
        ("local rank", topo.local_rank),
        ("num processes per_node", topo.nproc_per_node),
        ("num nodes", topo.nnodes),
        ("node rank", topo.node_rank),
    ):
        log.info("%s: %s", name, value)
