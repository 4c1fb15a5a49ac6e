"""The control-plane syncs: ``barrier``, ``one_rank_first`` and ``one_rank_only``.

Each validates its arguments first (the same error on every rank, before any
communication), then runs one store gate (see ``_core/waits.py``). The working rank of
``one_rank_first``/``one_rank_only`` always takes part, in ``finally``: when its block
raises, it posts the failure and marks the gate "failed", so every other rank raises
``PeerFailure`` instead of entering its block, while the working rank's own exception
propagates unchanged.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from . import groups
from ._checks import check_rank, check_timeout
from ._core.context import Context
from ._core.group import Group
from ._core.runtime import current
from ._core.waits import gate

log = logging.getLogger("tether")

T = TypeVar("T")


def barrier(group: Any = None, timeout: float | None = None) -> None:
    """Wait until every rank of ``group`` (default: all) has called ``barrier``.

    A process barrier on the job's store (2 store round trips per rank); under NCCL it
    does not order GPU work, exactly like ``dist.barrier`` does not order other streams.

    Args:
        group: None (all ranks), a list of ranks, or a ProcessGroup. Ranks outside it
            return at once.
        timeout: seconds; on expiry every rank raises ``SyncTimeout``.

    Raises:
        PeerFailure: another rank failed before or while this one waited.
        SyncTimeout: ``timeout`` expired; names the ranks that did not arrive.
        SyncMismatch: another rank entered a different sync at this point.
    """
    timeout = check_timeout(timeout, "barrier")
    ctx = current()
    if not ctx.backend.distributed:
        return
    members = groups.resolve(ctx, group)
    if members is not None:
        gate(ctx, members, "barrier", "member", timeout=timeout)


def _finish(ctx: Context, group: Group, signature: str, exc: BaseException, role: str) -> None:
    """The working rank's side of a gate after its block raised ``exc``."""
    try:
        gate(ctx, group, signature, role, failed=exc)
    except Exception:  # never mask the block's own exception
        log.exception("tether: could not tell the other ranks that this rank's block failed")


@contextmanager
def one_rank_first(rank: int = 0, local: bool = False, timeout: float | None = None) -> Iterator[None]:
    """Run the block on ``rank`` first; the other ranks run it once that rank finished it.

    The other ranks wait for the working rank only (2 store round trips each). If the
    working rank's block raises, every other rank raises ``PeerFailure`` naming it and
    does not run the block; the working rank's exception propagates unchanged.

    Args:
        rank: the rank that goes first (a local rank when ``local``).
        local: each node's ``rank``-th local process goes first, and the other ranks
            wait only for their own node's working rank.
        timeout: seconds the other ranks wait; on expiry all raise ``SyncTimeout``.

    Raises:
        TypeError, ValueError: ``rank`` is not an int in range, or ``timeout`` is not a
            positive number; raised identically on every rank, before any wait.
        PeerFailure: the working rank (or any other) failed.

    Example::

        with tether.one_rank_first():
            dataset = download_and_cache()
    """
    ctx = current()
    topo = ctx.backend.topology
    check_rank(
        rank,
        topo.nproc_per_node if local else topo.world_size,
        "one_rank_first(local=True)" if local else "one_rank_first",
    )
    timeout = check_timeout(timeout, "one_rank_first")
    if not ctx.backend.distributed:
        yield
        return
    group = groups.node(ctx) if local else groups.world(ctx)
    me = topo.local_rank if local else topo.rank
    signature = f"one_rank_first(rank={rank}, local={local})"
    if me != rank:
        gate(ctx, group, signature, "waiter", timeout=timeout)
        yield
        return
    ctx.check()
    try:
        yield
    except BaseException as exc:
        _finish(ctx, group, signature, exc, "leader")
        raise
    gate(ctx, group, signature, "leader")


def one_rank_only(rank: int = 0, with_barrier: bool = False) -> Callable[[Callable[..., T]], Callable[..., T | None]]:
    """Decorator: run the function on ``rank`` only; the others return None.

    With ``with_barrier``, every rank then waits until all ranks are past the call; if the
    function raised on ``rank``, the others raise ``PeerFailure`` naming it.

    Raises:
        TypeError, ValueError: ``rank`` out of range, at call time, on every rank alike.
        PeerFailure: with ``with_barrier``, the working rank's function raised.

    Example::

        @tether.one_rank_only(with_barrier=True)
        def save_checkpoint(): ...
    """

    def decorate(func: Callable[..., T]) -> Callable[..., T | None]:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> T | None:
            ctx = current()
            topo = ctx.backend.topology
            check_rank(rank, topo.world_size, "one_rank_only")
            if not with_barrier or not ctx.backend.distributed:
                return func(*args, **kwargs) if topo.rank == rank else None
            group, signature = groups.world(ctx), f"one_rank_only(rank={rank})"
            result = None
            if topo.rank == rank:
                ctx.check()
                try:
                    result = func(*args, **kwargs)
                except BaseException as exc:
                    _finish(ctx, group, signature, exc, "member")
                    raise
            gate(ctx, group, signature, "member")
            return result

        return wrapper

    return decorate
