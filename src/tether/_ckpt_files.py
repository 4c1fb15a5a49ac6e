"""The Checkpointer's files on disk: names, the manifest, the checks a resume makes, flushing.

A checkpoint is a directory ``step-<N>`` (``N`` optimizer steps done) holding
``manifest.json`` and the state: ``state.pt`` for replicated state, or DCP's files plus
``state.pt`` for sharded state (``"layout": "dcp"``). It is written under a ``.tmp-``
name, flushed and renamed, so a directory named ``step-<N>`` is complete unless its files
were damaged afterwards, which the checksum finds.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

FORMAT = 1
NAME = re.compile(r"^step-(\d+)$")


def steps(dirname: Path) -> list[tuple[int, Path]]:
    """The ``step-<N>`` directories in ``dirname``, newest first."""
    if not dirname.is_dir():
        return []
    return sorted(((int(m.group(1)), p) for p in dirname.iterdir() if (m := NAME.match(p.name))), reverse=True)


def manifest(step: int, epoch: int, iteration: int, world: int, emergency: bool) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "step": step,
        "epoch": epoch,
        "iteration": iteration,
        "world_size": world,
        "emergency": emergency,
    }


def write_manifest(directory: Path, data: dict[str, Any]) -> None:
    (directory / "manifest.json").write_text(json.dumps(data, indent=1))


def check(path: Path, world: int) -> tuple[str | None, dict[str, Any]]:
    """Why ``path`` cannot be resumed by a job of ``world`` ranks (None: it can), and its manifest."""
    try:
        found = json.loads((path / "manifest.json").read_text())
    except (OSError, ValueError) as exc:
        return f"no readable manifest ({type(exc).__name__})", {}
    if not isinstance(found, dict) or found.get("format") != FORMAT:
        return f"format {found.get('format') if isinstance(found, dict) else '?'}, not {FORMAT}", {}
    if found.get("world_size") != world:
        return f"saved by a job of {found.get('world_size')} ranks, this one has {world}", found
    try:
        actual = digest_files(path) if found.get("layout") == "dcp" else digest(path / "state.pt")
    except OSError as exc:
        return f"no state.pt ({type(exc).__name__})", found
    if actual != found.get("sha256"):
        return "state.pt does not match the manifest's checksum", found
    return None, found


def digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fp:
        for block in iter(lambda: fp.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def digest_files(directory: Path) -> str:
    """One SHA-256 over every file of a DCP checkpoint but the manifest, names included."""
    h = hashlib.sha256()
    for path in sorted(p for p in directory.iterdir() if p.name != "manifest.json"):
        h.update(path.name.encode() + b"\0")
        with open(path, "rb") as fp:
            for block in iter(lambda: fp.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
