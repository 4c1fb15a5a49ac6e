"""Sharded training state (FSDP) for ``tether.Checkpointer``, through ``torch.distributed.checkpoint``.

With FSDP each rank holds a shard of the model and optimizer, so no rank can save the
whole state alone: every rank writes its shard with DCP (``dcp.save``, a collective),
into one directory, and every rank reads its shard back with ``dcp.load``. tether's
checks still apply (one manifest, one checksum over every file, the same world size: a
sampler's position means other samples at another size), and only periodic saves exist
for such state: an emergency save would need the failed rank's shard.

The state dicts come from ``torch.distributed.checkpoint.state_dict`` (keys by parameter
name, also for the optimizer), for the one sharded module of the Checkpointer's objects
and the optimizers over its parameters. Other objects (a scheduler) save their plain
``state_dict()``, which DCP stores as bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch


def is_sharded(obj: object) -> bool:
    """An ``nn.Module`` whose state is split across ranks: FSDP's wrapper, or DTensor parameters."""
    if not isinstance(obj, torch.nn.Module):
        return False
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch built without distributed
        return False
    return type(obj).__name__ == "FullyShardedDataParallel" or any(isinstance(p, DTensor) for p in obj.parameters())


def state_of(objects: Mapping[str, Any], module_name: str) -> dict[str, Any]:
    """Every object's state dict as DCP saves it (this rank's shards of the sharded ones)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    module = objects[module_name]
    state: dict[str, Any] = {}
    for name, obj in objects.items():
        if obj is module:
            state[name] = get_model_state_dict(module)
        elif isinstance(obj, torch.optim.Optimizer):
            state[name] = get_optimizer_state_dict(module, obj)
        else:
            state[name] = obj.state_dict()
    return state


def load_into(objects: Mapping[str, Any], module_name: str, state: Mapping[str, Any]) -> None:
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    module = objects[module_name]
    for name, obj in objects.items():
        if obj is module:
            set_model_state_dict(module, state[name])
        elif isinstance(obj, torch.optim.Optimizer):
            set_optimizer_state_dict(module, obj, state[name])
        else:
            obj.load_state_dict(state[name])


def save(objects: Mapping[str, Any], module_name: str, directory: Path) -> None:
    """Every rank writes its shards into ``directory`` (a collective: every rank calls it)."""
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    dcp_save(state_of(objects, module_name), checkpoint_id=str(directory))


def load(objects: Mapping[str, Any], module_name: str, directory: Path) -> None:
    """Every rank reads its shards from ``directory`` into the objects (a collective)."""
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    state = state_of(objects, module_name)  # the structure to fill, on this rank's shards
    dcp_load(state, checkpoint_id=str(directory))
    load_into(objects, module_name, state)
