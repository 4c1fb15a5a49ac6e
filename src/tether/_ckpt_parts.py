"""A periodic save split across the ranks: how part 0 learns that the other parts are on disk.

Every rank packs, hashes and writes its share of the replicated tensors in a thread of its
own (``_ckpt_tensors.Split``), into the same ``.tmp-`` directory; rank 0, whose part also
holds everything else, publishes the checkpoint once every part is there. The parts meet
on the job's store, on keys of the failure channel's incarnation::

    P/checkpoint/<step>/<r>   rank r's writer (set once)   rank 0's writer (deletes it)
                              {"tensors_bytes", "tensors_xxh3", "placed": [[offset, nbytes], ...]}
                              or {"failed": "<its error>"}

Rank 0's wait ends four ways: a part that failed says so; a peer's failure posted on the
channel ends it at once (a rank that died mid-part posts nothing, but the job learns of
its death within its notice); so does training stopping on this rank (the emergency save
waits for this thread) or the process ending on a signal (``give_up``); and ``WITHIN``
seconds end it whatever happens.
Each ends the save, never training: the training threads do not wait for this one. A save
that ends so leaves the keys rank 0 did not read: at most N-1 a dropped save, and drops
are rare (a peer's failure ends the job; a part whose tensors moved makes its rank's later
saves copy at once).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch._C._distributed_c10d import Store

from . import _ckpt_files as _files
from . import _ckpt_tensors as _tensors
from ._core.channel import Channel

WITHIN = 120.0  # seconds rank 0 waits for the other parts, at most
_POLL = 0.002  # seconds between two looks at the store


class PeerGone(RuntimeError):
    """A peer's failure was posted before every part of the save was on disk."""


class NotShared(RuntimeError):
    """A part's writer said it wrote its file, and rank 0 does not see it there."""


def post(channel: Channel, client: Store, step: int, part: int, written: dict[str, Any] | BaseException) -> None:
    """Say what this rank's writer did with its part: what ``Arena.write`` returned, or its error."""
    if isinstance(written, BaseException):
        told: dict[str, Any] = {"failed": f"{type(written).__name__}: {written}"}
    else:
        told = written
    client.set(channel.key("checkpoint", step, part), json.dumps(told))


def gather(
    channel: Channel, client: Store, step: int, parts: int, tmp: Path, give_up: Callable[[], bool]
) -> dict[int, dict[str, Any]]:
    """Part -> what its writer posted, for parts ``1..parts-1``, each file checked to be in ``tmp``.

    Raises:
        PeerGone: a peer's failure was posted first, or ``give_up()`` said so (training
            stopped, or the process is ending on a signal).
        TimeoutError: a part was not posted within ``WITHIN`` seconds.
        RuntimeError: a part's writer failed (its error in the message).
        NotShared: a part's file is not where it was written (``tmp`` is not one
            directory for every rank).
    """
    keys = {part: channel.key("checkpoint", step, part) for part in range(1, parts)}
    deadline = time.monotonic() + WITHIN
    while not client.check(list(keys.values())):
        if give_up() or channel.failure_count(client):
            if client.check(list(keys.values())):  # the last part landed since the check above: whole
                break
            raise PeerGone("a peer failed, or this rank stopped, before every rank's part was written")
        if time.monotonic() >= deadline:
            missing = [part for part, key in keys.items() if not client.check([key])]
            raise TimeoutError(f"rank(s) {missing} wrote no part of it within {WITHIN:.0f} s")
        time.sleep(_POLL)
    found = {}
    for part, key in keys.items():
        found[part] = json.loads(client.get(key).decode())
        with contextlib.suppress(Exception):
            client.delete_key(key)
    for part, told in found.items():
        if "failed" in told:
            raise RuntimeError(f"rank {part} could not write its part: {told['failed']}")
        path = tmp / _files.part_name(part)
        size = path.stat().st_size if path.exists() else None
        if size != _tensors.file_size(int(told["tensors_bytes"])):
            raise NotShared(f"rank {part} wrote its part, and {path} is {'missing' if size is None else 'short'} here")
    return found


def placed(found: dict[int, dict[str, Any]]) -> dict[int, list[tuple[int, int]]]:
    """Part -> where its writer placed its tensors, for ``_ckpt_tensors.resolve``."""
    return {part: [(int(offset), int(nbytes)) for offset, nbytes in told["placed"]] for part, told in found.items()}


def described(found: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """The manifest's ``parts``: parts ``1..``'s size and hash, in order."""
    return [{k: found[part][k] for k in ("tensors_bytes", "tensors_xxh3")} for part in sorted(found)]
