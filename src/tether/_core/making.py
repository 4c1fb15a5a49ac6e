"""A group the user makes: its members arrive at a gate of tether's before gloo's creation.

gloo's creation of a group (``dist.new_group``, ``dist.new_subgroups``) waits in C++ on
the store for the address of every member, until the group's timeout. A member that
failed before it came is not seen there: no connection to it breaks, and nothing wakes
the wait. By hand (``tether.spawn``, 3 ranks, rank 1 raising where the others call
``dist.new_group([0, 1, 2])``): the two survivors waited there until the ladder ended
them 5 s later, exit 6 ("the main thread did not return to tether within 5 s"), not as
victims (``PeerFailure``, exit 3); with ``sync_timeout=3`` and rank 2 stalled, the job's
root cause was rank 0 ("process exited with code 3"), a rank that waited.

So the members first pass one store gate (``waits.gate``): a failure posted before they
are all there, or while they wait, raises as in every tether wait (``PeerFailure``,
``PeerLost``; ``SyncTimeout`` naming the members that did not arrive; a member that
finished is named). A failure inside the creation itself, after the gate, still ends at
the ladder: a window of the creation's milliseconds.

Only the new group's members pass it: the ranks gloo waits for. torch's documentation
asks every rank of the job to call ``new_group``, but without ``TORCH_DIST_INIT_BARRIER=1``
a rank outside the group returns at once, and programs that make a group on its members
alone work; a gate of every rank would hang them. The gate adds no wait the creation did
not have. Not gated: ``split_group`` (NCCL only, not run here), a call nested in another
(``new_subgroups`` calls ``new_group``), one on another thread or inside a tether call,
arguments torch refuses (its error comes as before).

The gate's timeout is the creation's: its ``timeout=``, else ``sync_timeout``, else torch's
default (30 minutes for gloo), so a member that stalls is named as a ``SyncTimeout`` no
later than the creation alone would have raised.

Cost: one store gate per creation (``benchmarks/results/group-gate.md``).
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from . import context
from .group import MAKING_KEY, Group
from .waits import gate

_MAIN = threading.main_thread()


def arrive(name: str, signature: inspect.Signature | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Wait until every member of the group this rank makes with ``name(*args, **kwargs)`` has come.

    Raises:
        PeerFailure, PeerLost, SyncTimeout, SyncMismatch: as any tether wait.
    """
    ctx = context.peek()
    if ctx is None or ctx.watchdog is None or ctx.store is None or ctx.channel is None or signature is None:
        return
    if ctx.watchdog.current_call or threading.current_thread() is not _MAIN or torch.compiler.is_compiling():
        return
    me, world = ctx.channel.rank, ctx.backend.topology.world_size
    try:
        given = signature.bind(*args, **kwargs).arguments
        members = _members(name, given, me, world)
        timeout = _timeout(given, ctx.settings.timeout)
    except Exception:  # arguments torch refuses, with its own error
        return
    if members is None or me not in members:
        return  # not a member: torch returns at once
    key = MAKING_KEY if len(members) == world else MAKING_KEY + ".".join(map(str, members))
    call = f"dist.{name}" if name == "new_group" else f"dist.{name}(group_size={len(members)})"
    gate(ctx, Group(key, members, None), call, "member", timeout=timeout)


def _timeout(given: dict[str, Any], sync_timeout: float | None) -> float:
    """The gate's timeout: the creation's own ``timeout=``, else ``sync_timeout``, else torch's
    default for the backend (gloo: 30 minutes), which bounded the creation's wait before."""
    if given.get("timeout") is not None:
        return float(given["timeout"].total_seconds())
    if sync_timeout is not None:
        return sync_timeout
    backend = dist.Backend(given.get("backend") or dist.get_backend())
    return float(c10d._get_default_timeout(backend).total_seconds())


def _members(name: str, given: dict[str, Any], me: int, world: int) -> tuple[int, ...] | None:
    """The global ranks of the group that ``name`` makes with this rank in it (None: not gated)."""
    if name == "new_group":
        ranks = given.get("ranks")
        return tuple(range(world)) if not ranks else _sorted(ranks)
    if name == "new_subgroups":
        size, parent = given.get("group_size"), given.get("group")
        ranks = list(range(world)) if parent is None else dist.get_process_group_ranks(parent)
        if type(size) is not int or size <= 0 or len(ranks) % size or me not in ranks:
            return None
        start = ranks.index(me) // size * size  # torch's subgroups: the parent's ranks in chunks of size
        return _sorted(ranks[start : start + size])
    return None


def _sorted(ranks: Iterable[Any]) -> tuple[int, ...]:
    return tuple(sorted({int(r) for r in ranks}))
