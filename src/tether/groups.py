"""Process groups: turning a ``group=`` argument into the members of a sync."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from ._core.context import Context
from ._core.runtime import current
from ._core.waits import Group


def _check_ranks(ranks: object, world_size: int) -> list[int]:
    if not isinstance(ranks, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
        raise ValueError(f"ranks must be a list of int, got {ranks!r:.80}")
    bad = [r for r in ranks if not 0 <= r < world_size]
    if bad or not ranks:
        raise ValueError(f"ranks must be a non-empty list of ranks in [0, {world_size}), got {ranks}")
    return ranks


def new_group(ranks: list[int], **kwargs: Any) -> Any:
    """Make a process group of ``ranks`` (every rank of the job must call it).

    Without a process group, returns ``ranks`` unchanged (ignite's serial behaviour).

    Raises:
        ValueError: ``ranks`` is not a non-empty list of valid ranks; raised identically on
            every rank, before any collective.
    """
    ctx = current()
    _check_ranks(ranks, ctx.backend.topology.world_size)
    if not ctx.backend.distributed:
        return ranks
    return dist.new_group(ranks=ranks, **kwargs)


def world(ctx: Context) -> Group:
    return Group("w", tuple(range(ctx.backend.topology.world_size)), None)


def node(ctx: Context) -> Group:
    topo = ctx.backend.topology
    return Group(f"n{topo.node_rank}", tuple(topo.node_ranks), None)


def resolve(ctx: Context, group: Any) -> Group | None:
    """The sync members for ``group``; None if this rank is not one of them."""
    if group is None:
        return world(ctx)
    if isinstance(group, list):
        ranks = _check_ranks(group, ctx.backend.topology.world_size)
        key = tuple(sorted(set(ranks)))
        with ctx.lock:
            pg = ctx.groups.get(key)
        if pg is None:
            pg = dist.new_group(ranks=list(key))
            with ctx.lock:
                ctx.groups[key] = pg
        group = pg
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        return None
    if not isinstance(group, dist.ProcessGroup):
        raise ValueError(f"group must be None, a list of int or a ProcessGroup, got {type(group).__name__}")
    members = tuple(dist.get_process_group_ranks(group))
    if ctx.backend.topology.rank not in members:
        return None
    return Group("g" + ".".join(map(str, members)), members, group)
