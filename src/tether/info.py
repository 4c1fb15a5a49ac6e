"""Read-only facts about this process's place in the job (ignite's getters)."""

from __future__ import annotations

import logging
import socket
import sys

import torch
import torch.distributed as dist

from . import backends
from ._core.runtime import current

# ignite's capability probes, for code that branches on what the installation offers.
has_native_dist_support: bool = dist.is_available()
has_xla_support = False  # tether does not run on XLA/TPU
has_hvd_support = False  # nor with Horovod
# As ignite's: the model classes, each with ``name``, ``available_backends`` and ``create_from_context()``.
registered_computation_models: tuple[type[backends.Backend], ...] = (backends.Backend, backends.NativeBackend)

CONFIG_FORMAT = "%(asctime)s %(name)s %(levelname)s: %(message)s"  # ignite's setup_logger format


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
    """This process's device, as ignite's.

    In a job: the group's CUDA device wherever CUDA is available, under gloo too: the one
    a group is bound to (``device_id``), else the current one, which tether sets at start
    from what the process sees (``cuda:<local rank>`` when it sees every GPU of the node,
    ``cuda:0`` under ``srun --gpus-per-task=1``; see ``tether/_devices.py``); else the
    CPU. Without a process group: ``cuda``, else ``mps``, else the CPU.
    """
    return current().backend.device()


def backend() -> str | None:
    """The backend name ("gloo", "nccl", ...), or None without a process group."""
    return current().backend.backend()


def available_backends() -> tuple[str, ...]:
    """The backends of every registered computation model ("nccl", "gloo", "mpi" where built)."""
    return tuple(name for model in registered_computation_models for name in model.available_backends)


def model_name() -> str:
    """ "serial" or "native-dist", as in ignite."""
    return current().backend.name


def hostname() -> str:
    """This machine's host name."""
    return socket.gethostname()


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at each record (pytest's capture, a redirect)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.setStream(sys.stderr)
        super().emit(record)


def _config_logger() -> logging.Logger:
    """ignite's ``setup_logger``, once: INFO to stderr with its format, not propagated.

    A handler the user attached to ``tether.info`` is kept and used instead.
    """
    logger = logging.getLogger(__name__)
    if not logger.handlers:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter(CONFIG_FORMAT))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger


def show_config() -> None:
    """Print the distributed configuration on rank 0, through ``logging`` (as ignite).

    Rank 0 writes ten lines to stderr (logger "tether.info", INFO, ignite's format
    "<time> tether.info INFO: world size: 4"); the other ranks print nothing.
    """
    topo = current().backend.topology
    if topo.rank != 0:
        return
    logger = _config_logger()
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
        logger.info("%s: %s", name, value)
