"""A replicated checkpoint's tensors: packed into one page-aligned buffer, hashed, written past the page cache.

A periodic save runs beside training, on the cores training uses, so its CPU time is the
step time it costs. ``torch.save`` of a 100 MB state, flushed and dropped from the page
cache as tether did, cost 0.069 s of CPU here (median; 0.019 s this way): its zip
records' CRC-32s, then the copy of every byte into the page cache
(``benchmarks/results/save-cpu.md``). This path costs what the snapshot's copy costs,
plus a few milliseconds:

* the snapshot copies every dense tensor into one page-aligned buffer (``Arena``), the
  copy a snapshot makes anyway, reused save after save;
* the buffer is hashed with XXH3-64 (~3 ms for 100 MB, the GIL left to training);
* one ``O_DIRECT`` write hands it to the disk without the page cache, so no CPU copies it
  there, and no page of it is left behind for training to evict. A file system that
  refuses ``O_DIRECT`` (tmpfs) gets a plain write, then ``fsync`` and a drop.

``tensors.bin`` holds the buffer; ``state.pt`` (``torch.save``) holds everything else, each
tensor replaced by a ``Slot`` naming its bytes. A resume reads ``tensors.bin`` once, checks
the hash of what it read, and unpacks that.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import errno
import mmap
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import xxhash

ALIGN = 4096  # O_DIRECT: address, offset and length in multiples of the block size (4096 covers 512)
_SLOT_ALIGN = 64  # each tensor's offset: every dtype's element size divides it
_CHUNK = 64 << 20  # one write() at most (Linux writes at most ~2 GiB at a time)


@dataclasses.dataclass(frozen=True)
class Slot:
    """Where one tensor's bytes are in ``tensors.bin``."""

    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]


class Arena:
    """The snapshot's buffer, reused save after save; grown when the state grows.

    Reuse is what keeps the copy cheap: memory already mapped, where a fresh buffer first
    faults in every page. The price is one copy of the state kept between saves.
    """

    def __init__(self) -> None:
        self._map: mmap.mmap | None = None
        self._bytes = torch.empty(0, dtype=torch.uint8)
        self.used = 0  # bytes the last pack filled
        self.pending: list[tuple[Slot, torch.Tensor, int]] = []  # left by pack for copy_pending: slot, tensor, version

    def pack(self, state: Any, later: set[int] | None = None) -> Any:
        """A copy of ``state`` whose dense tensors are copied into the buffer, as ``Slot``s.

        A tensor whose ``data_ptr()`` is in ``later`` is not copied now but left, with its
        version, to ``copy_pending``.
        """
        placed: list[tuple[Slot, torch.Tensor]] = []
        skeleton = _place(state, placed)
        self.used = placed[-1][0].offset + placed[-1][0].nbytes if placed else 0
        size = -(-self.used // ALIGN) * ALIGN
        if size > len(self._bytes):
            self._map = mmap.mmap(-1, size)  # anonymous memory: page-aligned, as O_DIRECT needs
            self._bytes = torch.frombuffer(self._map, dtype=torch.uint8)
        self.pending = []
        with torch.no_grad():
            for slot, tensor in placed:
                if later is not None and tensor.data_ptr() in later:
                    self.pending.append((slot, tensor, tensor._version))
                else:
                    _view(self._bytes, slot).copy_(tensor)
        return skeleton

    def copy_pending(self) -> bool:
        """Copy the tensors ``pack`` left; False when one changed in place since ``pack``
        (its version moved, so the copy may hold a later value, or part of one)."""
        pending, self.pending = self.pending, []
        with torch.no_grad():
            for slot, tensor, _ in pending:
                _view(self._bytes, slot).copy_(tensor)  # the GIL is left to training meanwhile
        return all(tensor._version == version for _, tensor, version in pending)

    def write(self, path: Path) -> dict[str, Any]:
        """The packed bytes to a new file at ``path``, flushed; what the manifest records of it."""
        padded = -(-self.used // ALIGN) * ALIGN
        data = memoryview(self._map)[:padded] if self._map is not None else memoryview(b"")
        digest = xxhash.xxh3_64_hexdigest(data[: self.used])
        _write(path, data)
        return {"tensors_bytes": self.used, "tensors_xxh3": digest}


def read(path: Path, found: dict[str, Any]) -> torch.Tensor | None:
    """The tensors' bytes of ``tensors.bin`` at ``path``, read once; None unless they are
    the bytes the manifest ``found`` hashed.

    A resume unpacks this very buffer (``unpack``): the bytes it loads are the bytes it
    checked, read from disk once. The file's pages are dropped after: a resume leaves
    nothing in the page cache for training to evict.
    """
    used = found.get("tensors_bytes")
    if not isinstance(used, int) or path.stat().st_size != -(-used // ALIGN) * ALIGN:
        return None
    data = torch.empty(used, dtype=torch.uint8)
    view = data.numpy().data.cast("B")
    with open(path, "rb", buffering=0) as fp:
        done = 0
        while done < used:
            got = fp.readinto(view[done:])
            if not got:
                return None
            done += got
        with contextlib.suppress(AttributeError, OSError):  # no posix_fadvise on macOS
            os.posix_fadvise(fp.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    return data if xxhash.xxh3_64_hexdigest(view) == found.get("tensors_xxh3") else None


def unpack(skeleton: Any, data: torch.Tensor) -> Any:
    """``skeleton`` with each ``Slot`` replaced by a tensor of its own, copied out of ``data``
    (``read``'s buffer)."""
    return _restore(skeleton, data)


def _place(value: Any, placed: list[tuple[Slot, torch.Tensor]]) -> Any:
    def leaf(item: Any) -> Any:
        if _packable(item):
            end = placed[-1][0].offset + placed[-1][0].nbytes if placed else 0
            offset = -(-end // _SLOT_ALIGN) * _SLOT_ALIGN
            slot = Slot(offset, item.numel() * item.element_size(), item.dtype, tuple(item.shape))
            placed.append((slot, item))
            return slot
        if isinstance(item, torch.Tensor):  # sparse, quantized, a subclass: torch.save keeps it
            return item.detach().clone()
        return copy.deepcopy(item)

    return _walk(value, leaf)


def _walk(value: Any, leaf: Callable[[Any], Any]) -> Any:
    """``value`` with its dicts, lists and tuples copied and ``leaf`` applied to everything else."""
    if isinstance(value, dict):
        out = copy.copy(value)  # the same mapping type, with its attributes (a module's ``_metadata``)
        for k, v in value.items():
            out[k] = _walk(v, leaf)
        return out
    if isinstance(value, list):
        return [_walk(v, leaf) for v in value]
    if type(value) is tuple:  # not a named tuple: leaf() copies those whole
        return tuple(_walk(v, leaf) for v in value)
    return leaf(value)


def _packable(value: Any) -> bool:
    return (
        type(value) in (torch.Tensor, torch.nn.Parameter)
        and value.layout == torch.strided
        and not value.is_quantized
        and value.device.type != "meta"
    )


def _view(data: torch.Tensor, slot: Slot) -> torch.Tensor:
    return data[slot.offset : slot.offset + slot.nbytes].view(slot.dtype).view(slot.shape)


def _restore(value: Any, data: torch.Tensor) -> Any:
    def leaf(item: Any) -> Any:
        return _view(data, item).clone() if isinstance(item, Slot) else item  # its own storage, as torch.load gives

    return _walk(value, leaf)


def _write(path: Path, data: memoryview) -> None:
    """``data`` (page-aligned, whole blocks) to a new file, on disk when this returns."""
    direct = getattr(os, "O_DIRECT", 0)  # none on macOS
    if direct:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | direct, 0o644)
        except OSError as exc:
            if exc.errno != errno.EINVAL:  # EINVAL: this file system takes no O_DIRECT
                raise
        else:
            try:
                _write_all(fd, data)
                os.fsync(fd)  # the file's size and blocks: the data went past the cache already
                return
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
            finally:
                os.close(fd)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, data)
        os.fsync(fd)
        with contextlib.suppress(AttributeError, OSError):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _write_all(fd: int, data: memoryview) -> None:
    done = 0
    while done < len(data):
        done += os.write(fd, data[done : done + _CHUNK])
