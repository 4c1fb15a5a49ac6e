"""One "[rankN]: " before each line of a traceback, however many groups this process made.

torch's ``init_process_group`` wraps ``sys.excepthook`` in one that prints every line of an
uncaught exception's traceback behind "[rankN]: ", and does so at every call: a process
that made its fourth group printed "[rank0]: [rank0]: [rank0]: [rank0]: Traceback ..."
(torch 2.13; ``tests/jobs/rank_prefix.py``). Before a new group is made, ``fresh_prefix``
takes the last group's wrap off, so the new group's is the only one; a call that fails
puts it back. A hook that is not torch's wrap (the user's, or tether's own on top
of torch's) is left alone, as is everything when torch's wrap is not found as expected.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist

_WRAP = "_distributed_excepthook"  # torch's inner function; its previous hook is ``old_hook``


def _wrapped(hook: Any) -> Callable[..., Any] | None:
    """The hook that torch's rank-prefix wrap ``hook`` wraps; None if ``hook`` is not that wrap."""
    code = getattr(hook, "__code__", None)
    closure = getattr(hook, "__closure__", None)
    if code is None or closure is None or code.co_name != _WRAP:
        return None
    if getattr(hook, "__module__", None) != dist.distributed_c10d.__name__ or "old_hook" not in code.co_freevars:
        return None
    inner = closure[code.co_freevars.index("old_hook")].cell_contents
    return inner if callable(inner) else None


@contextlib.contextmanager
def fresh_prefix() -> Iterator[None]:
    """Around ``init_process_group``: the last group's prefix off before, put back if it fails."""
    before = sys.excepthook
    inner = _wrapped(before)
    if inner is None:
        yield
        return
    sys.excepthook = inner
    try:
        yield
    except BaseException:
        if sys.excepthook is inner:  # no new group, so no new prefix: the old one stays
            sys.excepthook = before
        raise
