"""The Checkpointer's files on disk: names, the manifest, the checks a resume makes, flushing.

A checkpoint is a directory ``step-<N>`` (``N`` optimizer steps done) holding
``manifest.json`` and the state: ``state.pt`` for replicated state, or DCP's files plus
``state.pt`` for sharded state (``"layout": "dcp"``). It is written under a ``.tmp-``
name, flushed and renamed, so a directory named ``step-<N>`` is complete unless its files
were damaged afterwards, which the checksum finds.

The checksum of ``state.pt`` costs the save no second pass over the state. ``torch.save``
writes a zip archive and computes each record's CRC-32 as it writes it; the manifest keeps
the file's size and a SHA-256 of the archive's directory (every record's name, size and
CRC-32), read in well under a millisecond. A resume checks the size, the directory's digest
and every record's bytes against its CRC-32 (``zipfile.testzip``). A SHA-256 of the whole
file, as before, read the whole state again on the writer's thread, in 1 MiB blocks, each
taking the GIL back from the training thread. Manifests with that ``sha256`` are still
read; it is also what a save writes when torch's CRC-32s are switched off
(``torch.serialization.set_crc32_options(False)``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import zipfile
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
    state = path / "state.pt"
    try:
        if found.get("layout") == "dcp":
            intact = digest_files(path) == found.get("sha256")
        elif "records_sha256" in found:
            intact = _records_intact(state, found)
        else:
            intact = digest(state) == found.get("sha256")
    except OSError as exc:
        return f"no state.pt ({type(exc).__name__})", found
    if not intact:
        return "state.pt does not match the manifest's checksum", found
    return None, found


def fingerprint(state: Path) -> dict[str, Any]:
    """What the manifest records of ``state.pt`` (see the module docstring)."""
    import torch.serialization

    if not torch.serialization.get_crc32_options():  # no CRC-32s in the archive: hash the file
        return {"sha256": digest(state)}
    with zipfile.ZipFile(state) as archive:
        records = _records(archive)
    return {"bytes": state.stat().st_size, "records_sha256": records}


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
    instead of fresh ones. ``torch.save`` of 100 MB into a new file took 0.24-0.32 s of CPU
    here while the earlier checkpoints stayed cached, 0.043 s once each was dropped
    (``benchmarks/results/save-cpu.md``). It also keeps checkpoints from evicting what
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
