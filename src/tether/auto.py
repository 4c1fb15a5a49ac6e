"""``auto_model``, ``auto_optim``, ``auto_dataloader``: adapt training objects to the job.

ignite's helpers, for the native ``torch.distributed`` backends (tether has no XLA or
Horovod). They read the job from tether's context and never sync by themselves, except
``DistributedDataParallel``'s constructor, which broadcasts rank 0's parameters with a
raw collective: a peer that fails meanwhile is noticed by the watchdog, which ends a
rank stuck there after its grace period (see ``_core/watchdog.py``). The DDP that
``auto_model`` builds is guarded (``tether/ddp.py``): its gradient all-reduce stays DDP's
own, and a failure during ``backward()`` raises tether's error there.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn as nn
from torch.optim.optimizer import Optimizer
from torch.utils.data import DataLoader, Dataset, IterableDataset
from torch.utils.data.distributed import DistributedSampler
from torch.utils.data.sampler import Sampler

from . import _checks
from ._core.runtime import current
from ._core.verdicts import failure_behind_raw
from .ddp import register_comm_hook
from .errors import TetherError

log = logging.getLogger("tether")

__all__ = ["DistributedProxySampler", "auto_dataloader", "auto_model", "auto_optim"]


def auto_model(model: nn.Module, sync_bn: bool = False, **kwargs: Any) -> nn.Module:
    """Move ``model`` to ``tether.device()`` and wrap it for the job.

    * Parameters not on ``tether.device()`` are moved there.
    * With more than one rank: BatchNorm layers become ``SyncBatchNorm`` if ``sync_bn``,
      and the model is wrapped in ``DistributedDataParallel`` (with
      ``device_ids=[tether.device().index]``, the local rank's device, on CUDA).
    * With one process and several visible CUDA devices: ``DataParallel`` (as ignite).

    Args:
        model: the module to adapt.
        sync_bn: convert BatchNorm to SyncBatchNorm (distributed runs only).
        kwargs: passed to ``DistributedDataParallel`` (or ``DataParallel``).

    Returns:
        The (possibly wrapped) model.

    Raises:
        TypeError: ``model`` is not an ``nn.Module`` or ``sync_bn`` not a bool.
        ValueError: ``device_ids`` given on CUDA (tether sets it to the rank's device:
            "Argument kwargs should not contain 'device_ids'", as ignite), or ``sync_bn``
            in a distributed job off CUDA (DDP's own "SyncBatchNorm layers only work with
            GPU modules"); raised identically on every rank, before the model moves and
            before DDP's first collective.

    Example::

        model = tether.auto_model(Net())
    """
    _checks.check_auto_model(model, sync_bn)
    ctx = current()
    device = ctx.backend.device()
    topo = ctx.backend.topology
    if topo.world_size > 1 and ctx.backend.distributed:
        _checks.check_sync_bn_device(sync_bn, device)
        if device.type == "cuda":
            _checks.check_ddp_kwargs(kwargs, device)
    if any(p.device != device for p in model.parameters()):
        model.to(device)
    if topo.world_size > 1 and ctx.backend.distributed:
        if sync_bn:
            log.info("tether.auto_model: converting BatchNorm to SyncBatchNorm")
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # type: ignore[no-untyped-call]
        if device.type == "cuda":
            kwargs["device_ids"] = [device.index]  # the rank's device, as tether chose it (_devices.py)
        log.info("tether.auto_model: wrapping the model in DistributedDataParallel")
        try:  # its constructor's collectives are raw ones: a failure there gets its true story
            ddp = nn.parallel.DistributedDataParallel(model, **kwargs)
        except RuntimeError as exc:
            failure = (
                None if isinstance(exc, TetherError) else failure_behind_raw(ctx, exc, "DistributedDataParallel()")
            )
            if failure is None:
                raise
            raise failure from exc
        register_comm_hook(ddp)  # the gradient all-reduce inside the promise, no hook (tether/ddp.py)
        return ddp
    if device.type == "cuda" and torch.cuda.device_count() > 1:
        log.info("tether.auto_model: wrapping the model in DataParallel")
        return nn.parallel.DataParallel(model, **kwargs)
    return model


def auto_optim(optimizer: Optimizer, **kwargs: Any) -> Optimizer:
    """Return ``optimizer`` unchanged: native ``torch.distributed`` needs no wrapper.

    DDP averages the gradients; the optimizer steps locally. (ignite wraps it only for
    Horovod and XLA, which tether does not support.)

    Raises:
        TypeError: ``optimizer`` is not a ``torch.optim.Optimizer``, or keyword arguments
            were given (they only configure Horovod's optimizer in ignite).
    """
    _checks.check_auto_optim(optimizer, kwargs)
    return optimizer


def auto_dataloader(dataset: Dataset[Any], **kwargs: Any) -> DataLoader[Any]:
    """A ``DataLoader`` over this rank's share of ``dataset``.

    With more than one rank (ignite's rules):

    * ``batch_size`` is the *global* batch: each rank loads ``batch_size // world_size``
      (unchanged if smaller than the world size);
    * ``num_workers`` is per node: each rank gets ``ceil(num_workers / nproc_per_node)``
      (unchanged if smaller than ``nproc_per_node``);
    * no ``sampler``: a ``DistributedSampler`` (``shuffle`` goes to it, default True);
      a ``DistributedSampler``: used as is (a warning if its rank or replicas differ from
      the job's); another sampler: wrapped in ``DistributedProxySampler``;
    * an ``IterableDataset`` or a ``batch_sampler`` is not split: the dataset (or batch
      sampler) must give each rank different data.

    ``pin_memory`` defaults to True when ``tether.device()`` is CUDA.

    Args:
        dataset: a map-style or iterable dataset.
        kwargs: ``torch.utils.data.DataLoader``'s arguments.

    Raises:
        TypeError, ValueError: ``batch_size`` is not a positive int or ``num_workers`` not
            a non-negative int; any error of ``DataLoader`` itself.

    Example::

        loader = tether.auto_dataloader(dataset, batch_size=256, num_workers=4, shuffle=True)
    """
    _checks.check_loader_kwargs(kwargs)
    ctx = current()
    topo = ctx.backend.topology
    if topo.world_size > 1:
        if kwargs.get("batch_size", 1) >= topo.world_size:
            kwargs["batch_size"] //= topo.world_size
        nproc = topo.nproc_per_node
        if kwargs.get("num_workers", 0) >= nproc:
            kwargs["num_workers"] = -(-kwargs["num_workers"] // nproc)
        if "batch_sampler" in kwargs:
            warnings.warn(
                "Found batch_sampler in provided kwargs. Please, make sure that it is compatible "
                "with distributed configuration (auto_dataloader does not split a batch_sampler across ranks)",
                stacklevel=2,
            )
        elif isinstance(dataset, IterableDataset):
            log.info("tether.auto_dataloader: iterable dataset, not split: it must give each rank different data")
        else:
            kwargs["sampler"] = _distributed_sampler(dataset, kwargs, topo.rank, topo.world_size)
    kwargs.setdefault("pin_memory", ctx.backend.device().type == "cuda")
    return DataLoader(dataset, **kwargs)


def _distributed_sampler(dataset: Dataset[Any], kwargs: dict[str, Any], rank: int, world: int) -> Sampler[Any]:
    sampler = kwargs.get("sampler")
    if sampler is None:
        return DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=kwargs.pop("shuffle", True))
    if isinstance(sampler, DistributedSampler):
        if sampler.rank != rank:
            warnings.warn(
                f"Found distributed sampler with rank={sampler.rank}, but process rank is {rank}", stacklevel=3
            )
        if sampler.num_replicas != world:
            warnings.warn(
                f"Found distributed sampler with num_replicas={sampler.num_replicas}, but world size is {world}",
                stacklevel=3,
            )
        return sampler
    return DistributedProxySampler(sampler, num_replicas=world, rank=rank)


class DistributedProxySampler(DistributedSampler[Any]):
    """Split any sampler across ranks: each rank takes every ``num_replicas``-th index.

    Every rank draws the wrapped sampler's order from the same seed (``seed + epoch``:
    call ``set_epoch`` each epoch), inside ``torch.random.fork_rng``, so a random sampler
    gives every rank the same permutation and the global RNG is left untouched. The
    order is repeated to a multiple of ``num_replicas`` (the wrapped sampler's length
    must be constant).

    Args:
        sampler: a ``torch.utils.data.Sampler`` with ``__len__``, not distributed.
        num_replicas: ranks to split across (default: ``tether.get_world_size()``).
        rank: this rank's share (default: ``tether.get_rank()``).

    Raises:
        TypeError: ``sampler`` is not a Sampler, is already a DistributedSampler, or has
            no length.
        ValueError: ``rank`` is not in ``[0, num_replicas)``.
    """

    def __init__(self, sampler: Sampler[Any], num_replicas: int | None = None, rank: int | None = None) -> None:
        _checks.check_proxy_sampler(sampler)
        topo = current().backend.topology
        num_replicas, rank = _checks.check_replicas(
            topo.world_size if num_replicas is None else num_replicas, topo.rank if rank is None else rank
        )
        # DistributedSampler checks rank's range (ValueError) and reads len(dataset):
        super().__init__(sampler, num_replicas=num_replicas, rank=rank, shuffle=False)  # type: ignore[arg-type]
        self.sampler = sampler

    def __iter__(self) -> Iterator[Any]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed + self.epoch)
            order: list[Any] = []
            while len(order) < self.total_size:
                chunk = list(self.sampler)
                if not chunk:
                    raise ValueError("DistributedProxySampler: the wrapped sampler yielded nothing")
                order += chunk
        mine = order[self.rank : self.total_size : self.num_replicas]
        if len(mine) != self.num_samples:
            raise RuntimeError(
                f"{len(mine)} vs {self.num_samples}: DistributedProxySampler got {len(mine)} indices for rank "
                f"{self.rank}, expected {self.num_samples}; the wrapped sampler's length changed"
            )
        return iter(mine)
