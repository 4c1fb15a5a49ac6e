"""Process groups: ``new_group``, and turning a ``group=`` argument into the members of a sync."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from . import _checks
from ._core.context import Context
from ._core.group import Group, all_ranks
from ._core.runtime import current


def new_group(ranks: list[int], **kwargs: Any) -> Any:
    """Make a process group of ``ranks`` (every rank of the job must call it).

    As ignite: without a process group, returns ``ranks`` unchanged. An empty list makes
    a group no rank is in (``torch.distributed.GroupMember.NON_GROUP_MEMBER``, what
    ``torch.distributed.new_group([])`` gave before torch 2.x refused it): a sync on it
    returns every rank's input.

    Args:
        ranks: global ranks of the new group.
        kwargs: passed to ``torch.distributed.new_group`` (``backend``, ``pg_options``...).

    Raises:
        ValueError: ``ranks`` is not a list of int (or, in a job, not ranks of the job);
            raised identically on every rank, before any collective.

    Example::

        pair = tether.new_group([0, 1])
        tether.all_reduce(t, group=pair)
    """
    ctx = current()
    if not ctx.backend.distributed:
        return _checks.check_ranks(ranks)
    if not _checks.check_ranks(ranks, ctx.backend.topology.world_size):
        return dist.GroupMember.NON_GROUP_MEMBER
    return dist.new_group(ranks=ranks, **kwargs)


def world(ctx: Context) -> Group:
    """Every rank of the job (made once per context: it is on every collective's happy path)."""
    group = ctx.world
    if group is None:
        group = ctx.world = all_ranks(ctx.backend.topology.world_size)
    return group


def node(ctx: Context) -> Group:
    topo = ctx.backend.topology
    return Group(f"n{topo.node_rank}", tuple(topo.node_ranks), None)


def resolve(ctx: Context, group: Any) -> Group | None:
    """The sync members for ``group``; None if this rank is not one of them.

    ``group`` is None (every rank), a list of ranks (a ProcessGroup is made on first use,
    and every rank must make that first call; an empty list has no member, as
    ``new_group([])``) or a ProcessGroup.

    Raises:
        ValueError: anything else, or ranks outside the job (ignite's message first).
    """
    if group is None:
        return world(ctx)
    if isinstance(group, list):
        key = tuple(sorted(set(_checks.check_group_ranks(group, ctx.backend.topology.world_size))))
        if not key:
            return None
        with ctx.lock:
            pg = ctx.groups.get(key)
        if pg is None:
            pg = dist.new_group(ranks=list(key))
            with ctx.lock:
                ctx.groups[key] = pg
        group = pg
    if isinstance(group, int) and not isinstance(group, bool) and group == dist.GroupMember.NON_GROUP_MEMBER:
        return None
    if not isinstance(group, dist.ProcessGroup):
        raise _checks.group_error(group)
    members = tuple(dist.get_process_group_ranks(group))
    if ctx.backend.topology.rank not in members:
        return None
    return Group("g" + ".".join(map(str, members)), members, group)
