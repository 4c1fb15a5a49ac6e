"""The waits of torch's functional collectives (DTensor, tensor parallelism): named, explained, bounded.

``torch.distributed._functional_collectives`` ("funcol") issues a collective as a custom
op and returns at once; the wait comes later, in the module's ``wait_tensor``, which
blocks in C++ on the work. A DTensor's ``redistribute`` and ``full_tensor``, and every
op of a tensor-parallel model that moves shards, wait there. Measured by hand (2 ranks,
``tether.spawn``, a DTensor redistributed from ``Shard(0)`` to ``Replicate()``): with
rank 1 raising first, rank 0 got gloo's ``RuntimeError: Connection closed by peer`` in
its own code; with rank 1 stalled and ``sync_timeout=5``, gloo's "Timed out waiting
6000ms", and the verdict said "user code timed out". Every such wait looks
``wait_tensor`` up on the module at call time (``AsyncCollectiveTensor``'s first use
and ``wait()``, the collectives' backward), so the module's function is wrapped as
``rawcalls`` wraps ``torch.distributed``'s: this rank's whereabouts name it, and a
backend error out of it becomes the failure behind it. Its bound is the group's timeout
(``sync_timeout + RAW_MARGIN`` for tether's groups and those made while it watches).

Not covered: a direct call of the op ``torch.ops._c10d_functional.wait_tensor`` (a
compiled graph's, whose waits tether never names, see ``rawcalls``; symmetric memory's,
NCCL only), and the issue of a collective that blocks (NCCL's first collective on a
communicator connects its ranks; gloo's issue only queues).

tether never imports the module itself (15 ms here, on a job that may never use it): it
is wrapped when tether starts if a script imported it first, else once it is imported.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

from .verdicts import OUTSIDE

MODULE = "torch.distributed._functional_collectives"
IN_WAIT = f"funcol.wait_tensor {OUTSIDE}"  # a rank's whereabouts while it waits there
_wrappers: set[Any] = set()  # the wrappers made: a second install leaves them as they are


def install() -> None:
    """Wrap the module's ``wait_tensor`` now if it is imported, else when it is (once per process)."""
    module = sys.modules.get(MODULE)
    if module is not None:
        _wrap(module)
    elif not any(isinstance(finder, _WrapOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _WrapOnImport())


def _wrap(module: ModuleType) -> None:
    from .rawcalls import run_outside

    original = getattr(module, "wait_tensor")  # noqa: B009
    if original in _wrappers:
        return

    @functools.wraps(original)
    def wait_tensor(tensor: Any) -> Any:
        return run_outside(IN_WAIT, original, tensor)

    _wrappers.add(wait_tensor)
    setattr(module, "wait_tensor", wait_tensor)  # noqa: B010 (mypy reads the module as a bare ModuleType)


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Finds the module as Python's own path finder does, with a loader that wraps it once loaded; then leaves."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return None  # the next finders' to find
        sys.meta_path.remove(self)  # one module, once
        spec.loader = _ThenWrap(spec.loader)
        return spec


class _ThenWrap(importlib.abc.Loader):
    """``loader``, wrapping ``wait_tensor`` once the module ran; anything else asked goes to ``loader``."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _wrap(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename: tracebacks, inspect
        return getattr(self._loader, name)
