"""DDP's gradient all-reduce inside the promise: the reducer's waits are futures tether can fail.

``auto_model`` guards the ``DistributedDataParallel`` it builds; users who build DDP
themselves call ``register_comm_hook(model)``, optionally around a hook of their own
(``fp16_compress_hook``, PowerSGD). When a peer fails while this rank is in
``loss.backward()``, ``backward()`` raises ``tether.PeerFailure`` (or ``PeerLost``,
``SyncTimeout``...) on every survivor, within the notice time of any tether wait.

One mechanism (facts in ``_core/futures.py``): every future the reducer waits on is one
of tether's, chained to the backend's, that the watchdog fails when a failure is
delivered. It is handed to the reducer by a communication hook, ``_TetherHook``, around
the user's hook, or dividing and all-reducing the bucket as torch's ``allreduce_hook``
does. On NCCL a future completes when the kernel is enqueued, so the guard may not take
a done future for a finished collective (no ``rescue``); NCCL has not run here
(``docs/nccl.md``).

A hook costs DDP the division it folds into its copy of the gradients into the bucket.
On CPU, tether's own all-reduce divides into a buffer whose slices become the gradients,
so the reducer's copy back out of the bucket is a no-op and the step makes as many passes
over the gradients as plain DDP (``_grad_views.py``: the rules, what a user sees, and the
memory it costs). Not with ``find_unused_parameters`` or ``static_graph`` (DDP leaves a
globally unused parameter's gradient untouched, and a view would not be), nor with
``gradient_as_bucket_view`` (the gradients are the bucket's views already, and DDP
checks it), nor around a user's hook.

Tried and reverted (2026-12-02): keeping DDP's built-in all-reduce and giving the
reducer a ``ProcessGroup`` subclass of tether's whose ``allreduce`` handed out such a
future (``_update_process_group``). It saved the hook's division pass (~3 % of a 100 MB
step), but every collective of the reducer then went through a Python trampoline, and
jobs hung, rarely, with every rank in DDP's bucket rebuild (``_rebuild_buckets``, a
broadcast through that group) at the second iteration: 2 of 132 benchmark jobs, and one
fresh-clone test run. The hook keeps the reducer on torch's own group.

The reducer then raises a ``RuntimeError`` that holds the error's text ("Unable to cast
<the error> to Tensor": ``_core/futures.py``); ``torch.autograd.backward``, through
which every ``Tensor.backward()`` goes, is wrapped while tether runs (``rawcalls.py``,
guarded or not) so that a rank with a known failure gets tether's own exception, chained
to the reducer's. DDP's ``forward`` is wrapped the same way: it makes raw collectives in
C++ (the bucket rebuild of its second iteration, the buffer broadcast), which go to the
process group unguarded (the hook guards the gradients' all-reduce only) and are bounded
and explained as every raw call. Both wrappers cost two attribute writes and a ``try``
on the happy path, and a user's own autograd error (not the backend's, no failure
known) passes unchanged.

With ``sync_timeout`` set, a bucket's all-reduce still pending ``sync_timeout`` seconds
after it was issued is failed with ``SyncTimeout`` naming the ranks that were not in
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
from ._core.runtime import current
from ._core.threadstates import keep_thread_state
from ._core.verdicts import OUTSIDE, expire
from ._grad_views import ResultBuffers
from .collectives import allreduce_options
from .groups import world

__all__ = ["register_comm_hook"]

Hook = Callable[[Any, GradBucket], torch.futures.Future[torch.Tensor]]


def register_comm_hook(model: DistributedDataParallel, state: object = None, hook: Hook | None = None) -> None:
    """Bring ``model``'s gradient all-reduce inside the promise, around ``hook`` if given.

    tether registers a communication hook that calls ``hook`` (default: an all-reduce of
    the bucket, averaged over the group, as DDP's own) and hands the reducer a future
    tether can fail (see the module docstring). DDP takes one hook per model: pass yours
    here as ``hook``.

    Args:
        model: a ``DistributedDataParallel`` (``auto_model`` guards the one it builds).
        state: passed to ``hook`` (as for ``model.register_comm_hook``).
        hook: the hook doing the work, e.g. ``default_hooks.fp16_compress_hook``;
            default: DDP's own all-reduce of the bucket, averaged over the group.

    Raises:
        TypeError: ``model`` is not a ``DistributedDataParallel`` or ``hook`` is not
            callable; raised on every rank alike, before any communication.
        RuntimeError: ``model`` is guarded already, or has a communication hook of its
            own (pass that hook as ``hook``; DDP takes one hook per model).

    Example::

        model = DistributedDataParallel(net)
        tether.register_comm_hook(model, hook=default_hooks.fp16_compress_hook)
    """
    if not isinstance(model, DistributedDataParallel):
        raise TypeError(f"register_comm_hook: model must be a DistributedDataParallel, got {type(model).__name__}")
    if hook is not None and not callable(hook):
        raise TypeError(f"register_comm_hook: hook must be callable, got {type(hook).__name__}")
    if getattr(model, "_comm_hooks", None):  # tether's hook, or one of the user's
        raise RuntimeError(
            "register_comm_hook: this model's gradient all-reduce is guarded already or has a communication "
            "hook of its own; DDP takes one hook per model: pass yours as register_comm_hook(model, hook=...)"
        )
    ctx = current()
    group = model.process_group
    # DDP leaves a gradient untouched where the parameter went unused by every rank, and
    # checks that a gradient_as_bucket_view gradient is its bucket's: neither gets views
    plain_copies = not (model.find_unused_parameters or model.static_graph or model.gradient_as_bucket_view)
    views = ResultBuffers() if plain_copies else None
    guard = _TetherHook(ctx, hook, group, views)
    model.register_comm_hook(state if hook is not None else group, guard)


class _TetherHook:
    """The hook DDP calls per bucket: the backend's future, behind one tether can fail."""

    def __init__(self, ctx: Context, inner: Hook | None, group: Any, views: ResultBuffers | None) -> None:
        self._ctx = ctx
        self._inner = inner
        self._group = group
        self._views = views
        self._size = dist.get_world_size(group)  # fixed for the group's life; asked once, not per bucket
        self.__qualname__ = self.__name__ = f"tether_hook({getattr(inner, '__name__', 'allreduce')})"

    def __call__(self, state: Any, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        buffer = bucket.buffer()
        if self._inner is not None:
            return _guard(self._ctx, self._inner(state, bucket), buffer.device, first=False)
        placed = None if self._views is None else self._views.place(bucket, self._size)
        tensor = buffer.div_(self._size) if placed is None else placed  # _grad_views.py
        work = self._group.allreduce([tensor], _SUM).get_future()  # what DDP's C++ hook calls
        return _guard(self._ctx, work, buffer.device, first=True)  # a list's future: unpacked in settle


def _guard(
    ctx: Context, work: torch.futures.Future[Any], device: torch.device, first: bool
) -> torch.futures.Future[Any]:
    """``work``'s result (its first item, if ``first``), in a future this rank's watchdog fails
    when a failure is delivered, or when ``sync_timeout`` expires first.

    On a GPU the future must carry ``device``: a future made without devices records no CUDA
    event when it completes, so the reducer, reading it on its own stream, would copy the
    bucket into the gradients before the backend's stream had reduced it (NCCL completes
    ``work`` at enqueue). Completed inside ``work``'s callback, whose current stream waits
    for ``work``'s events, it records an event the reducer's stream then waits for, as a
    ``then()`` child does (``benchmarks/nccl_check.py``, check ``ddp_grads``).
    """
    watchdog = ctx.watchdog
    if watchdog is None:  # no failure channel (one process): nothing can fail it
        return work.then(_first) if first else work
    devices: list[torch.device | str | int] | None = None if device.type == "cpu" else [device]
    parent: torch.futures.Future[Any] = torch.futures.Future(devices=devices)
    failables = watchdog.failables

    def settle(done: torch.futures.Future[Any]) -> None:
        keep_thread_state()  # on gloo's thread: threadstates.py
        try:
            value = done.value()
        except Exception as exc:  # the backend's error: backward() explains it
            failables.settle(parent, error=exc)
        else:
            failables.settle(parent, result=value[0] if first else value)

    def rescue() -> bool:  # the work finished before the failure came: its result stands
        if not work.done():
            return False
        settle(work)
        return True

    # NCCL's futures are done once enqueued: there ``done()`` proves nothing, so no rescue
    finished = None if ctx.backend.completes_at_enqueue else rescue
    timeout = ctx.settings.timeout
    if timeout is None:
        failables.add(parent, rescue=finished)
    else:
        deadline = time.monotonic() + timeout
        failables.add(parent, deadline, functools.partial(_expire, ctx, timeout), rescue=finished)
    work.add_done_callback(settle)
    return parent  # one Python callback per bucket, as torch's allreduce_hook (_core/futures.py)


_SUM = allreduce_options("SUM")  # an asynchronous sum: DDP's bucket, straight to its group


def _first(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
    keep_thread_state()  # on gloo's thread: threadstates.py
    return fut.value()[0]


def _expire(ctx: Context, timeout: float) -> None:
    """A bucket's all-reduce outlived ``sync_timeout``: ask every rank where it is, post the
    timeout (every rank raises it), and fail this rank's futures with it. On the keeper thread."""
    if ctx.watchdog is not None and ctx.watchdog.failure is None:
        error = expire(ctx, world(ctx), 0, "DDP's gradient all-reduce", timeout, at=OUTSIDE)
        ctx.watchdog.deliver(error, None)
