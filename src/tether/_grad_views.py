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
tether's (``ResultBuffers.place``), all-reduces that buffer, and points each parameter's
``.grad`` at its own slice of it. The division pass takes the place of the copy back:
a guarded step makes as many passes over the gradients as plain DDP does.

What a user sees is plain DDP's behaviour:

* ``.grad`` holds the same values (the same division, the same sum).
* With ``zero_grad(set_to_none=False)`` a parameter's ``.grad`` stays the same tensor
  from step to step, overwritten in place by the next step's averaged gradient, as
  plain DDP's copy back overwrites it.
* A gradient kept after ``zero_grad()`` (``set_to_none=True``) is never written again. A
  buffer is reused for the next step only when nothing but the reducer's own views and
  the parameters' gradients refers to its memory (its storage's use count); otherwise the
  step gets a new buffer.

The one difference: ``.grad`` is a view of the buffer, as under DDP's
``gradient_as_bucket_view=True``, so ``p.grad.detach_()`` raises; the optimizers'
``zero_grad`` never calls it on a gradient without autograd history.

It applies to tether's own all-reduce only (a user's hook returns a tensor of its own),
during backward (DDP's join mode runs the hook on zero-filled buckets outside it), to
dense parameters whose layout matches the reducer's view of them and whose gradient is
set. Anything else keeps the copy back, from the same buffer: the values never depend on
which gradients became views.
"""

from __future__ import annotations

import torch
from torch._C._distributed_c10d import GradBucket

# torch's use count of a storage (private, stable since torch 2.0; the supported range is
# one minor release, pyproject.toml). Without it no buffer is reused: a new one each step.
_use_count = getattr(torch._C, "_storage_Use_Count", None)


class ResultBuffers:
    """One buffer per DDP bucket for the averaged gradients, reused while nobody else holds it."""

    def __init__(self) -> None:
        self._last: dict[int, torch.Tensor] = {}

    def place(self, bucket: GradBucket, size: int) -> torch.Tensor | None:
        """``bucket`` divided by ``size`` into a buffer whose slices are now the gradients.

        The caller all-reduces the buffer and hands it to the reducer as the hook's result.
        None (divide in place, as before) outside backward, e.g. in DDP's join mode.
        """
        if torch._C._current_autograd_node() is None:
            return None
        source = bucket.buffer()
        params = bucket.parameters()
        grads = [p.grad for p in params]
        out = self._reusable(bucket.index(), source, len(params), grads)
        if out is None:
            out = torch.empty_like(source)
            self._last[bucket.index()] = out
        torch.div(source, size, out=out)
        base = source.storage_offset()
        for param, grad, view in zip(params, grads, bucket.gradients(), strict=True):
            if grad is None or grad.dtype != out.dtype or view.stride() != param.stride():
                continue  # not computed here (DDP keeps it unset), or laid out otherwise: copied back
            mine = out.as_strided(view.size(), view.stride(), out.storage_offset() + view.storage_offset() - base)
            if grad.data_ptr() != mine.data_ptr():
                param.grad = mine
        return out

    def _reusable(
        self, index: int, source: torch.Tensor, count: int, grads: list[torch.Tensor | None]
    ) -> torch.Tensor | None:
        """Last step's buffer for this bucket, if nobody outside can see it being overwritten.

        Who may hold its memory: the buffer itself, the reducer's view of each of the
        bucket's ``count`` gradients (kept since its last copy back), and the gradients
        that are still its slices (written again in place, as plain DDP writes them). Any
        other holder (a gradient kept after ``zero_grad()``) means a new buffer.
        """
        last = self._last.get(index)
        if last is None or _use_count is None:
            return None
        if last.shape != source.shape or last.dtype != source.dtype or last.device != source.device:
            return None
        ours = sum(1 for grad in grads if grad is not None and grad._base is last)
        return last if _holders(last) == 1 + count + ours else None


def _holders(tensor: torch.Tensor) -> int:
    """How many tensors refer to ``tensor``'s memory (its storage's use count, less the
    Python storage object that asking takes: one, whether made for it or kept by anyone)."""
    assert _use_count is not None
    return int(_use_count(tensor.untyped_storage()._cdata)) - 1
