"""The Checkpointer's files on disk: names, the manifest, the checks a resume makes, flushing.

A checkpoint is a directory ``step-<N>`` (``N`` optimizer steps done) holding
``manifest.json`` and the state: ``tensors.bin`` and ``state.pt`` for replicated state
(format 2, ``_ckpt_tensors``; format 3 when the save was split across the ranks: part
``r`` of the tensors in ``tensors-<r>.bin``, listed in the manifest's ``parts``), or DCP's
files plus ``state.pt`` for sharded state (``"layout": "dcp"``). It is written under a
``.tmp-`` name, flushed and renamed, so a directory named ``step-<N>`` is complete unless
its files were damaged afterwards, which the checksums find: an XXH3-64 of the tensors'
bytes (of each part's), a SHA-256 of ``state.pt``.

Format 1 (tether before format 2) kept every tensor inside ``state.pt``, checked by a
SHA-256 of the archive's directory of CRC-32s (``records_sha256``) or of the whole file
(``sha256``); such checkpoints are still resumed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import re
import zipfile
from pathlib import Path
from typing import Any

import torch

from . import _ckpt_tensors as _tensors

FORMAT = 2
SPLIT = 3  # format 2, the tensors in one file per part
READ = (1, 2, 3)  # the formats a resume takes
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


@dataclasses.dataclass(frozen=True)
class Read:
    """One checkpoint directory, as ``read`` found it."""

    why: str | None  # why it cannot be resumed; None: it can
    manifest: dict[str, Any]  # {} when unreadable
    state: dict[str, Any] | None = None  # what it holds, when it can be resumed


def read(path: Path, world: int, layout: str) -> Read:
    """The checkpoint at ``path``, checked, then loaded when a job of ``world`` ranks with
    ``layout`` state (``"replicated"``, ``"dcp"``) can resume it.

    Format 2's files are read once each, and what is loaded is the bytes that were checked;
    a DCP checkpoint's shards are left to ``dcp.load`` (``_sharded.load``).
    """
    try:
        found = json.loads((path / "manifest.json").read_text())
    except (OSError, ValueError) as exc:
        return Read(f"no readable manifest ({type(exc).__name__})", {})
    if not isinstance(found, dict) or found.get("format") not in READ:
        return Read(f"format {found.get('format') if isinstance(found, dict) else '?'}, not {FORMAT}", {})
    if found.get("world_size") != world:
        return Read(f"saved by a job of {found.get('world_size')} ranks, this one has {world}", found)
    if found.get("layout", "replicated") != layout:
        return Read(f"saved from {found.get('layout', 'replicated')} state, and this Checkpointer's is {layout}", found)
    try:
        if "tensors_xxh3" in found:
            return _read_format_2(path, found)
        damaged = _damaged(path, found)
        if damaged is not None:
            return Read(f"{damaged} does not match the manifest's checksum", found)
        return Read(None, found, torch.load(path / "state.pt", map_location="cpu", weights_only=False))
    except OSError as exc:
        return Read(f"a file is missing or unreadable ({type(exc).__name__}: {exc.strerror})", found)


def part_name(part: int) -> str:
    """The file of part ``part`` of a checkpoint's tensors."""
    return "tensors.bin" if part == 0 else f"tensors-{part}.bin"


def _read_format_2(path: Path, found: dict[str, Any]) -> Read:
    state = (path / "state.pt").read_bytes()
    if hashlib.sha256(state).hexdigest() != found.get("state_sha256"):
        return Read("state.pt does not match the manifest's checksum", found)
    parts = [found, *found.get("parts", [])] if found.get("format") == SPLIT else [found]
    if not all(isinstance(part, dict) for part in parts):
        return Read("the manifest's parts are unreadable", found)
    data = {}
    for part, described in enumerate(parts):
        tensors = _tensors.read(path / part_name(part), described)
        if tensors is None:
            return Read(f"{part_name(part)} does not match the manifest's checksum", found)
        data[part] = tensors
    skeleton = torch.load(io.BytesIO(state), map_location="cpu", weights_only=False)
    return Read(None, found, _tensors.unpack(skeleton, data))


def _damaged(path: Path, found: dict[str, Any]) -> str | None:
    """Which file of a DCP or format-1 checkpoint does not match the manifest ``found`` (None: none)."""
    if found.get("layout") == "dcp":
        return None if digest_files(path) == found.get("sha256") else "a DCP file"
    if "records_sha256" in found:
        return None if _records_intact(path / "state.pt", found) else "state.pt"
    return None if digest(path / "state.pt") == found.get("sha256") else "state.pt"


def _records(archive: zipfile.ZipFile) -> str:
    h = hashlib.sha256()
    for info in archive.infolist():
        h.update(f"{info.filename}\0{info.file_size}\0{info.CRC}\n".encode())
    return h.hexdigest()


def _records_intact(state: Path, found: dict[str, Any]) -> bool:
    if state.stat().st_size != found.get("bytes"):
        return False
    try:
        with zipfile.ZipFile(state) as archive:
            return _records(archive) == found["records_sha256"] and archive.testzip() is None
    except (zipfile.BadZipFile, EOFError, ValueError, RuntimeError, NotImplementedError):
        return False


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
    """Flush ``path`` to disk, then drop it from the page cache.

    Dropping it is what keeps a periodic save cheap: the next save's pages reuse these
    instead of fresh ones. ``torch.save`` of 100 MB into a new file took 0.28-0.32 s of CPU
    here while the earlier checkpoints stayed cached, 0.040-0.049 s once each was dropped
    (``benchmarks/results/save-cpu.md``, IQRs). It also keeps checkpoints from evicting what
    training reads (its data set); a resume reads the file once, from disk.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        if hasattr(os, "posix_fadvise"):  # not on macOS
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
