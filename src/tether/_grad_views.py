"""Where tether's guarded all-reduce puts its result: in the gradients, so DDP copies nothing back.

DDP's built-in all-reduce divides each gradient by the world size while copying it into
its bucket (``at::mul_out`` in ``reducer.cpp``'s ``mark_variable_ready_dense``). With a
communication hook registered, as tether's guard is, that copy is a plain one and the
hook must divide the bucket in a pass of its own; measured: 6.6 ms of a 180 ms step for a
100 MB model at 2 ranks (``benchmarks/results/ddp-eb27993.md``), the bulk of the guard's
cost. After the all-reduce the reducer copies each gradient back out of the hook's result
(``grad.copy_(view)``), and ATen's ``copy_`` returns at once when source and destination
are the same memory with the same layout (measured: 10 µs for 20 MB, against 0.47 ms).

So, during backward, the hook divides the bucket *out of place*, into a buffer of
tether's (``ResultBuffers.place``), all-reduces that buffer, and points each large
gradient (``MIN_VIEW_BYTES`` or more) at its own slice of it. The division pass takes the
place of the copy back: a guarded step makes as many passes over the gradients as plain
DDP does.

What a user sees is plain DDP's behaviour:

* ``.grad`` holds the same values (the same division, the same sum).
* With ``zero_grad(set_to_none=False)`` a parameter's ``.grad`` stays the same tensor
  from step to step, overwritten in place by the next step's averaged gradient, as
  plain DDP's copy back overwrites it.
* A gradient kept after ``zero_grad()`` (``set_to_none=True``) is never written again. A
  buffer is reused for the next step only when nothing but the reducer's own views and
  the parameters' gradients refers to its memory (its storage's use count); otherwise the
  step gets a new buffer.

One difference: ``.grad`` is a view of the buffer, as under DDP's
``gradient_as_bucket_view=True``, so ``p.grad.detach_()`` raises; the optimizers'
``zero_grad`` never calls it on a gradient without autograd history.

The other is memory: one more gradient-sized buffer per model, held from step to step
(the reducer keeps its views of it until its next copy back), where plain DDP with
``zero_grad()``'s default ``set_to_none=True`` holds only its buckets between steps. So
it applies to gradients in CPU memory only, where the saved pass is a few % of a step
(gloo on CPU); on a GPU that pass is a kernel at memory bandwidth, and the memory counts.

It applies to tether's own all-reduce only (a user's hook returns a tensor of its own),
during backward (DDP's join mode runs the hook on zero-filled buckets outside it), to
dense parameters whose layout matches the reducer's view of them and whose gradient is
set. Anything else keeps the copy back, from the same buffer: the values never depend on
which gradients became views.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch._C._distributed_c10d import GradBucket

# torch's use count of a storage (private, stable since torch 2.0; the supported range is
# one minor release, pyproject.toml). Without it no buffer is reused: a new one each step.
_use_count = getattr(torch._C, "_storage_Use_Count", None)

# A gradient smaller than this keeps the copy back: pointing ``.grad`` at a slice costs
# Python 1-2 µs a parameter (``as_strided`` 1.0 µs, the checks 0.5 µs), and copying
# 256 KiB cost 3.2 µs (measured here, 2 ranks on 2 cores, in cache).
MIN_VIEW_BYTES = 256 * 1024


class _View(NamedTuple):
    param: torch.Tensor
    size: torch.Size
    stride: tuple[int, ...]
    offset: int  # in the buffer's storage


class _Slot(NamedTuple):
    """A bucket's buffer (None: no gradient of it is worth a view) and where each view goes."""

    buffer: torch.Tensor | None
    layout: tuple[torch.Size, torch.dtype]  # the bucket's
    params: list[torch.Tensor]  # the bucket's, in its order
    views: list[_View]


class ResultBuffers:
    """One buffer per DDP bucket for the averaged gradients, reused while nobody else holds it."""

    def __init__(self) -> None:
        self._slots: dict[int, _Slot] = {}

    def place(self, bucket: GradBucket, size: int) -> torch.Tensor | None:
        """``bucket`` divided by ``size`` into a buffer whose slices are now the gradients.

        The caller all-reduces the buffer and hands it to the reducer as the hook's result.
        None (divide in place, as before) outside backward (e.g. DDP's join mode), off
        CPU, or for a bucket whose gradients are all small.
        """
        source = bucket.buffer()
        if source.device.type != "cpu" or torch._C._current_autograd_node() is None:
            return None
        params = bucket.parameters()
        slot = self._slots.get(bucket.index())
        if slot is None or not _same_bucket(slot, source, params) or not _free(slot):
            slot = _plan(bucket, source, params)
            self._slots[bucket.index()] = slot
        buffer = slot.buffer
        if buffer is None:
            return None
        torch.div(source, size, out=buffer)
        for param, shape, stride, offset in slot.views:
            grad = param.grad
            if grad is None or (grad._base is buffer and grad.storage_offset() == offset):
                continue  # not computed here (DDP keeps it unset), or the view already
            param.grad = buffer.as_strided(shape, stride, offset)
        return buffer


def _plan(bucket: GradBucket, source: torch.Tensor, params: list[torch.Tensor]) -> _Slot:
    """A new buffer for ``bucket``, and the views its large gradients will be."""
    layout = (source.shape, source.dtype)
    views = [
        _View(param, view.size(), view.stride(), int(view.storage_offset() - source.storage_offset()))
        for param, view in zip(params, bucket.gradients(), strict=True)
        # the reducer copies back through a view with the parameter's strides: the same, or a real copy
        if param.dtype == source.dtype
        and view.stride() == param.stride()
        and view.numel() * view.element_size() >= MIN_VIEW_BYTES
    ]
    return _Slot(torch.empty_like(source) if views else None, layout, params, views)


def _same_bucket(slot: _Slot, source: torch.Tensor, params: list[torch.Tensor]) -> bool:
    """Whether ``slot`` was planned for this bucket (DDP rebuilds its buckets at its second step)."""
    return (
        slot.layout == (source.shape, source.dtype)
        and len(slot.params) == len(params)
        and all(a is b for a, b in zip(slot.params, params, strict=True))
    )


def _free(slot: _Slot) -> bool:
    """Whether ``slot``'s buffer may be overwritten: nobody outside can see it.

    Who may hold its memory: the buffer itself, the reducer's view of each of the bucket's
    gradients (kept since its last copy back), and the gradients that are still its slices
    (overwritten in place, as plain DDP overwrites them). Any other holder (a gradient kept
    after ``zero_grad()``) means a new buffer.
    """
    buffer = slot.buffer
    if buffer is None:
        return True  # nothing to overwrite
    if _use_count is None:
        return False
    ours = 0
    for view in slot.views:
        grad = view.param.grad
        if grad is not None and grad._base is buffer:
            ours += 1
    return _holders(buffer) == 1 + len(slot.params) + ours


def _holders(tensor: torch.Tensor) -> int:
    """How many tensors refer to ``tensor``'s memory (its storage's use count, less the
    Python storage object that asking takes: one, whether made for it or kept by anyone)."""
    assert _use_count is not None
    return int(_use_count(tensor.untyped_storage()._cdata)) - 1
