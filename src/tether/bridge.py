"""ignite's own internals through tether: its Engine, metrics, ``Checkpoint`` and ``ProgressBar``.

ignite's code calls ``ignite.distributed`` (``idist.all_reduce`` in every metric's
reduction, ``idist.get_rank`` in the Engine and the handlers, ``idist.barrier`` in
``Checkpoint``), not the module a script imported as ``idist``. ``patch_ignite`` points
those functions of ``ignite.distributed`` (and of ``ignite.distributed.utils``, which
they call each other through) at tether's, so that a metric's all-reduce is a tether
collective: a failed peer is raised there as ``PeerFailure``, a stall as
``SyncTimeout``.

When it happens: automatically, when tether starts watching a process group
(``initialize``, ``spawn``/``Parallel`` workers, an adopted group) and ``ignite.distributed``
is already imported, which is the usual order (a training script imports ignite at its
top); or explicitly, ``tether.patch_ignite()``, for a script that imports ignite later.
tether never imports ignite by itself. ignite code that bound a function at import time
(``from ignite.distributed import all_reduce``) keeps ignite's; its collectives are then
still raw ``torch.distributed`` calls, which tether marks and explains (``_core/rawcalls.py``).

ignite's ``Engine`` logs ``Engine run is terminating due to exception: <error>`` (and
``Current run ...``) on every rank, for every engine the error passes through. A tether
error's text goes on past its first line with each rank's whereabouts (a stack each),
which tether's report shows once; on the Engine's loggers, such a line keeps the error's
first line (``_FirstLineOfTetherErrors``). The loggers are ``Engine``'s,
``DeterministicEngine``'s and those of any other subclass created by then.
"""

from __future__ import annotations

import importlib
import logging
import sys

from .errors import TetherError

__all__ = ["patch_ignite"]

# What ignite's internals call at run time; launchers and helpers (spawn, Parallel,
# initialize, auto_*) stay ignite's: they are the user's own calls, to the module they chose.
PATCHED = (
    "all_gather",
    "all_gather_tensors_with_shapes",
    "all_reduce",
    "backend",
    "barrier",
    "broadcast",
    "device",
    "get_local_rank",
    "get_nnodes",
    "get_node_rank",
    "get_nproc_per_node",
    "get_rank",
    "get_world_size",
    "hostname",
    "model_name",
    "new_group",
    "one_rank_first",
    "one_rank_only",
)


def patch_ignite() -> bool:
    """Make ignite's own distributed calls tether's; returns False when ignite is not installed.

    Idempotent. Example::

        import tether
        tether.patch_ignite()  # only needed when ignite is imported after tether started
    """
    try:
        importlib.import_module("ignite.distributed")
    except ImportError:
        return False
    _patch()
    return True


def patch_ignite_if_imported() -> None:
    """``patch_ignite``, only if the script imported ignite already (tether never imports it)."""
    if "ignite.distributed" in sys.modules:
        _patch()


def _patch() -> None:
    import tether

    for name in ("ignite.distributed", "ignite.distributed.utils"):
        module = sys.modules.get(name)
        if module is None:
            continue
        for attr in PATCHED:
            if hasattr(module, attr):
                setattr(module, attr, getattr(tether, attr))
    made = [name for name in logging.root.manager.loggerDict if name.startswith(_ENGINE_LOGGER_PREFIX)]
    for name in {*made, _ENGINE_LOGGER_PREFIX + "Engine", _ENGINE_LOGGER_PREFIX + "DeterministicEngine"}:
        engine_log = logging.getLogger(name)
        if not any(isinstance(f, _FirstLineOfTetherErrors) for f in engine_log.filters):
            engine_log.addFilter(_FirstLineOfTetherErrors())


_ENGINE_LOGGER_PREFIX = "ignite.engine.engine."  # + the class's name: an Engine's logger
_TERMINATING = "terminating due to exception: "


class _FirstLineOfTetherErrors(logging.Filter):
    """Cuts an Engine's "terminating due to exception" line about a tether error to its first line.

    The Engine logs it inside its ``except`` clause, so the error is the one in flight.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.msg
        ours = isinstance(sys.exc_info()[1], TetherError)
        if ours and isinstance(text, str) and _TERMINATING in text and "\n" in text and not record.args:
            record.msg = text.split("\n", 1)[0]
        return True
