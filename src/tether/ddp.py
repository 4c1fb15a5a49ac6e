"""DDP's gradient all-reduce inside the promise: a communication hook tether can fail.

``auto_model`` registers it on the ``DistributedDataParallel`` it builds; users who build
DDP themselves call ``register_comm_hook(model)``, optionally around a hook of their own
(``fp16_compress_hook``, PowerSGD). When a peer fails while this rank is in
``loss.backward()``, ``backward()`` raises ``tether.PeerFailure`` (or ``PeerLost``,
``SyncTimeout``...) on every survivor, within the notice time of any tether wait.

How (facts in ``_core/futures.py``): the hook returns a future of tether's, chained to
the backend's; the watchdog fails it when a failure is delivered. The reducer then
raises a ``RuntimeError`` that wraps the error's text ("Got the following error when
running the callback: ..."); ``torch.autograd.backward``, through which every
``Tensor.backward()`` goes, is wrapped once a hook is registered so that a rank with a
known failure gets tether's own exception, chained to the reducer's. The model's own
``forward`` is wrapped the same way: DDP's forward makes raw collectives in C++ (the
bucket rebuild of its second iteration, the buffer broadcast). Both wrappers go through
``rawcalls.run_outside``: two attribute writes and a ``try`` on the happy path, and a
user's own autograd error (not the backend's, no failure known) passes unchanged.

With ``sync_timeout`` set, a bucket's all-reduce still pending ``sync_timeout`` seconds
after the hook issued it is failed with ``SyncTimeout`` naming the ranks that were not in
DDP's (or another torch.distributed) wait: the watchdog's keeper looks at the deadlines
every period, so within ``sync_timeout`` + 1 s.
"""

# No ``from __future__ import annotations`` here: DDP checks a hook's annotations, which
# must be the real ``GradBucket`` and ``Future[Tensor]``, not strings.
import functools
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket
from torch.nn.parallel import DistributedDataParallel

from ._core.context import Context
from ._core.rawcalls import run_outside
from ._core.runtime import current
from ._core.verdicts import OUTSIDE, expire
from .collectives import allreduce_options
from .groups import world

__all__ = ["register_comm_hook"]

Hook = Callable[[Any, GradBucket], torch.futures.Future[torch.Tensor]]


def register_comm_hook(model: DistributedDataParallel, state: object = None, hook: Hook | None = None) -> None:
    """Register tether's communication hook on ``model``, around ``hook`` if given.

    Args:
        model: a ``DistributedDataParallel`` (``auto_model`` registers the hook itself).
        state: passed to ``hook`` (as for ``model.register_comm_hook``).
        hook: the hook doing the work, e.g. ``default_hooks.fp16_compress_hook``;
            default: all-reduce the bucket and divide by the group's size (DDP's own).

    Raises:
        TypeError: ``model`` is not a ``DistributedDataParallel`` or ``hook`` is not
            callable; raised on every rank alike, before any communication.
        RuntimeError: DDP's own, if a hook is registered on ``model`` already.

    Example::

        model = DistributedDataParallel(net)
        tether.register_comm_hook(model, hook=default_hooks.fp16_compress_hook)
    """
    if not isinstance(model, DistributedDataParallel):
        raise TypeError(f"register_comm_hook: model must be a DistributedDataParallel, got {type(model).__name__}")
    if hook is not None and not callable(hook):
        raise TypeError(f"register_comm_hook: hook must be callable, got {type(hook).__name__}")
    ctx = current()
    group = model.process_group
    model.register_comm_hook(state if hook is not None else group, _TetherHook(ctx, hook, group))
    _wrap_backward()
    _translate_forward(model)


def _translate_forward(model: DistributedDataParallel) -> None:
    """DDP's forward makes raw collectives of its own, in C++ (its bucket rebuild at the
    second iteration, its buffer broadcast): a failure there gets its true story too.

    Set on the instance (``model.forward``): a deep copy of the model would call the
    original's forward.
    """
    forward: Callable[..., Any] = model.forward

    @functools.wraps(forward)
    def translated(*args: Any, **kwargs: Any) -> Any:
        return run_outside(IN_FORWARD, forward, *args, **kwargs)

    model.forward = translated  # type: ignore[method-assign]


class _TetherHook:
    """The hook DDP calls per bucket: the backend's future, behind one tether can fail."""

    def __init__(self, ctx: Context, inner: Hook | None, group: Any) -> None:
        self._ctx = ctx
        self._inner = inner
        self._group = group
        self._size = dist.get_world_size(group)  # fixed for the group's life; asked once, not per bucket
        self.__qualname__ = self.__name__ = f"tether_hook({getattr(inner, '__name__', 'allreduce')})"

    def __call__(self, state: Any, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        watchdog = self._ctx.watchdog
        work: torch.futures.Future[Any]
        if self._inner is not None:
            work = self._inner(state, bucket)
        else:  # DDP's own all-reduce; its future's value is a list, unpacked in settle (one hop less)
            tensor = bucket.buffer().div_(self._size)
            work = self._group.allreduce([tensor], _SUM).get_future()  # what DDP's C++ hook calls
        if watchdog is None:  # no failure channel (one process): nothing can fail it
            return work if self._inner is not None else work.then(_first)
        parent: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        failables = watchdog.failables

        def settle(done: torch.futures.Future[Any]) -> None:
            try:
                value = done.value()
            except Exception as exc:  # the backend's error: backward() explains it
                failables.settle(parent, error=exc)
            else:
                failables.settle(parent, result=value[0] if isinstance(value, list) else value)

        def rescue() -> bool:  # the work finished before the failure came: its result stands
            if not work.done():
                return False
            settle(work)
            return True

        # NCCL's futures are done once enqueued: there ``done()`` proves nothing, so no rescue
        finished = None if self._ctx.backend.completes_at_enqueue else rescue
        timeout = self._ctx.settings.timeout
        if timeout is None:
            failables.add(parent, rescue=finished)
        else:
            deadline = time.monotonic() + timeout
            failables.add(parent, deadline, functools.partial(_expire, self._ctx, timeout), rescue=finished)
        work.add_done_callback(settle)
        return parent.then(_value)


_SUM = allreduce_options("SUM")  # an asynchronous sum: DDP's bucket, straight to its group


def _first(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
    return fut.value()[0]


def _value(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
    return fut.value()  # raises the failure tether set on ``fut``: C++ sees a real error


# What a rank in backward() answers a whereabouts query with (``watchdog.current_call``).
IN_BACKWARD = f"DDP's backward {OUTSIDE}"
IN_FORWARD = f"DDP's forward {OUTSIDE}"


def _expire(ctx: Context, timeout: float) -> None:
    """A bucket's all-reduce outlived ``sync_timeout``: ask every rank where it is, post the
    timeout (every rank raises it), and fail this rank's futures with it. On the keeper thread."""
    if ctx.watchdog is not None and ctx.watchdog.failure is None:
        error = expire(ctx, world(ctx), 0, "DDP's gradient all-reduce", timeout, at=OUTSIDE)
        ctx.watchdog.deliver(error, None)


_wrapped = False


def _wrap_backward() -> None:
    """Wrap ``torch.autograd.backward`` once per process (see the module docstring)."""
    global _wrapped
    if _wrapped:
        return
    original = torch.autograd.backward

    @functools.wraps(original)
    def backward(*args: Any, **kwargs: Any) -> None:
        run_outside(IN_BACKWARD, original, *args, **kwargs)

    torch.autograd.backward = backward
    _wrapped = True
