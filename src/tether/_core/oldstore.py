"""The last group's store, when this rank left it still open: a new group on its port waits.

With ``env://`` every ``init_process_group`` (and ``tether.initialize``) uses the same
``MASTER_PORT``, and the store's host (rank 0) serves each new group's store on it only
after its old one closed. A rank that left a group (``finalize`` or the user's
``destroy_process_group``) before the host did, and made the next group at once, connected
to the host's *old* store: torch's rendezvous found the old group's keys there, gloo
connected to the host's old group, the group "was made", and the old store then closed
under it (``DistNetworkError: Failed to recv, got 0 bytes``) while the host waited in the
new store for this rank, until the job's bound (a fresh clone's run under load; forced
with the host 2.6 s late: ``tests/jobs/lifecycle_cycles.py``).

So a rank that leaves waits, up to ``CLOSE_WAIT``, for the host's store to close, seen on a
bare TCP connection (``stores.StoreProbe``). Most leaves end there. A host later than
that (a loaded machine, local work before its own leave) leaves the probe here
(``leave``), and the next group made on the same port waits for it first
(``before_new_group``, from ``tether.initialize`` and from ``dist.init_process_group``),
up to ``LATE_CLOSE_WAIT``, saying so after ``NOTE_AFTER``. A rank that makes no next
group never waits for it. A host that dies closes its store too (the kernel closes its
sockets), so only a host that lives on without closing (it froze, or keeps a reference
to the old store) costs the whole bound, after which the new group is made as before.

Only a probe surely on the old store is kept: a copy of the connection the store watch
opened while the group lived (``StoreProbe.on``). A connection opened at the leave could
reach a *new* store, where the host, faster, had already destroyed the old group and
begun the next; waiting for that one to close would hold this rank out of the very
group that needs it. Such a probe gets ``CLOSE_WAIT`` and no more, as before.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

import torch.distributed as dist

from .._env import parse_init_method
from .rankprefix import fresh_prefix
from .stores import CLOSE_WAIT, StoreProbe

log = logging.getLogger("tether")

LATE_CLOSE_WAIT = 300.0  # seconds a new group waits for the last one's store (tether's store timeout)
NOTE_AFTER = 5.0  # seconds of that wait before it says why, once

_left_open: StoreProbe | None = None
_lock = threading.Lock()


def leave(probe: StoreProbe, bound: float = CLOSE_WAIT) -> None:
    """Wait up to ``bound`` for the store under ``probe`` to close; if it has not, keep the
    probe for the next group (``before_new_group``), when it is surely on the old store."""
    global _left_open
    if probe.wait_closed(bound):
        return
    if not probe.surely_old:  # it may be on a new store by now: never waited for again
        probe.close()
        return
    with _lock:
        older, _left_open = _left_open, probe
    if older is not None:
        older.close()


def before_new_group(port: int | None, bound: float = LATE_CLOSE_WAIT, note_after: float = NOTE_AFTER) -> None:
    """Before this rank makes a group whose store is on ``port`` (None: not a TCP store):
    wait until the last group's store, if this rank left it open, has closed.

    Another port's group does not wait (the old store is no obstacle to it).
    """
    global _left_open
    with _lock:
        probe, _left_open = _left_open, None
    if probe is None:
        return
    if port is None or port != probe.port:
        probe.close()
        return
    if probe.wait_closed(note_after):
        return
    left = max(bound - note_after, 0.0)
    log.warning(
        "tether: this rank waits for the store of its last process group (port %d) to close before it makes "
        "a new group on the same port: the store's host (rank 0) has not closed it yet (waiting up to %.0f s more)",
        port,
        left,
    )
    probe.wait_closed(left)
    probe.close()


def port_of(init_method: str | None, store: object, env: Mapping[str, str]) -> int | None:
    """The port of the store an ``init_process_group`` call makes, or None (a store the caller
    made, a file, an address torch will refuse itself)."""
    if store is not None:
        return None
    if init_method is None or init_method.startswith("env://"):
        port = env.get("MASTER_PORT", "")
        return int(port) if port.isdigit() else None
    try:
        address = parse_init_method(init_method)
    except ValueError:
        return None
    return address[1] if address is not None else None


_init_wrapped = False


def wrap_init() -> None:
    """Make ``dist.init_process_group`` wait first for the last group's store (``before_new_group``).

    Installed once, the first time tether watches a group (only a group tether watched can
    leave a store open here); torch's own function runs unchanged after the wait, with the
    last group's rank prefix taken off the excepthook (``rankprefix``).
    """
    global _init_wrapped
    if _init_wrapped:
        return
    original: Callable[..., None] = dist.init_process_group

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> None:
        if _left_open is not None:
            init_method = kwargs.get("init_method", args[1] if len(args) > 1 else None)
            store = kwargs.get("store", args[5] if len(args) > 5 else None)
            before_new_group(port_of(init_method, store, os.environ))
        with fresh_prefix():
            return original(*args, **kwargs)

    dist.init_process_group = init_process_group
    dist.distributed_c10d.init_process_group = init_process_group
    _init_wrapped = True
