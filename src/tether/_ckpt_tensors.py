"""A replicated checkpoint's tensors: packed into one page-aligned file, hashed, written past the page cache.

A periodic save runs beside training, on the cores training uses, so its CPU time is the
step time it costs. ``torch.save`` of a 100 MB state, flushed and dropped from the page
cache as tether did, cost 0.069 s of CPU here (median; 0.019 s this way, with a copy:
``benchmarks/results/save-cpu.md``): its zip records' CRC-32s, then the copy of every
byte into the page cache. This path costs the hash and little more:

* the tensors that must be taken at once (the snapshot is of this moment) are copied into
  one page-aligned buffer (``Arena``), reused save after save; those only the optimizers
  change are left to the writer (``pack``'s ``later``), which reads them before the next
  optimizer step: their whole pages go to disk from their own memory, with no copy;
* what is written is hashed with XXH3-64 on the way (9.4 ms of CPU for 100 MB here, about
  what reading the bytes costs at all; the GIL left to training;
  ``benchmarks/results/save-parts.md``);
* ``O_DIRECT`` writes hand it to the disk without the page cache, so no CPU copies it
  there, and no page of it is left behind for training to evict. A file system that
  refuses ``O_DIRECT`` (tmpfs) gets plain writes, then ``fsync`` and a drop.

``tensors.bin`` holds the bytes; ``state.pt`` (``torch.save``) holds everything else, each
tensor replaced by a ``Slot`` naming its bytes. A resume reads ``tensors.bin`` once, checks
the hash of what it read, and unpacks that.

**A save split across replicas** (``Split``): the tensors every replica holds alike (what
the optimizers step) are dealt across the ranks, each rank packing, hashing and writing its
share as a file of its own (part ``r``: ``tensors-<r>.bin``; part 0 keeps ``tensors.bin``
and everything else), as ``torch.distributed.checkpoint`` dedups replicated tensors. The
deal depends only on the state's structure and sizes, the same on every replica, so no rank
has to tell another which tensors it took; only where it put them (an in-place tensor's
offset follows its own address), which part 0 learns after the write (``resolve``).
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import dataclasses
import errno
import mmap
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import xxhash

ALIGN = 4096  # O_DIRECT: address, offset and length in multiples of the block size (4096 covers 512)
_SLOT_ALIGN = 64  # each tensor's offset: every dtype's element size divides it
_CHUNK = 64 << 20  # one write() at most (Linux writes at most ~2 GiB at a time)
_IN_PLACE_RUN = 8 << 20  # one write() from a tensor's memory at most: a hurry waits for one (~5 ms here)


@dataclasses.dataclass(frozen=True)
class Slot:
    """Where one tensor's bytes are in ``tensors.bin``."""

    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    part: int = 0  # the file: 0 is tensors.bin, r is tensors-<r>.bin (a split save)


@dataclasses.dataclass(frozen=True)
class Elsewhere:
    """A tensor of another part in a split save: the ``index``-th tensor of part ``part``
    (``resolve`` makes it a ``Slot`` once that part's offsets are known)."""

    part: int
    index: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Split:
    """A save shared by ``parts`` ranks; the arena packs part ``part``.

    The tensors whose ``data_ptr()`` is in ``shared`` (the same on every replica) are
    dealt, in the state's order, each to the part with the fewest bytes so far (ties: the
    lowest); every other tensor is part 0's, and so is everything not a tensor.
    """

    part: int
    parts: int
    shared: set[int]


class Moved(RuntimeError):
    """A tensor left to the write changed in place before the write was done with it."""


@dataclasses.dataclass(frozen=True)
class _Later:
    """A tensor ``pack`` left to ``write``: read then, as it is, with its version at ``pack``."""

    slot: Slot
    tensor: torch.Tensor
    version: int
    in_place: bool  # its whole pages go to disk from its own memory, not through the buffer


class Arena:
    """The snapshot's buffer, reused save after save; grown when the state grows.

    Reuse is what keeps the copy cheap: memory already mapped, where a fresh buffer first
    faults in every page. The buffer is the file's image: ``tensors.bin`` is written from
    it, but for the tensors written in place (``pack``'s ``later``), whose pages go to
    disk from the tensors' own memory.
    """

    def __init__(self) -> None:
        self._map: mmap.mmap | None = None
        self._bytes = torch.empty(0, dtype=torch.uint8)
        self.used = 0  # bytes the last pack filled
        self.pending: list[_Later] = []  # left by pack to write
        self.copied = 0  # bytes of tensors the last pack and write copied into the buffer
        self.placed: list[tuple[int, int]] = []  # (offset, nbytes) of each tensor the last pack placed, in order

    def pack(self, state: Any, later: set[int] | None = None, split: Split | None = None) -> Any:
        """A copy of ``state`` whose dense tensors are copied into the buffer, as ``Slot``s.

        A tensor whose ``data_ptr()`` is in ``later`` is not copied now but left, with its
        version, to ``write``, which reads it: it must not change until ``write`` says it
        is done with it (its ``released``). Such a tensor, if a contiguous one in CPU
        memory of two pages or more, gets a slot at the same offset within a page as its
        memory has, so that its whole pages can go to disk from that memory (``O_DIRECT``
        wants both page-aligned), only its first and last part page through the buffer.

        With ``split``, only this part's tensors are packed; the others become
        ``Elsewhere`` in the skeleton, and a part other than 0 copies nothing but its
        tensors (its skeleton is of no use).
        """
        later = later or set()
        placed: list[tuple[Slot, torch.Tensor]] = []
        skeleton = _place(state, placed, lambda t: t.data_ptr() in later and _in_place(t), _dealer(split))
        self.placed = [(slot.offset, slot.nbytes) for slot, _ in placed]
        self.used = placed[-1][0].offset + placed[-1][0].nbytes if placed else 0
        size = file_size(self.used)
        if size > len(self._bytes):
            self._map = mmap.mmap(-1, size)  # anonymous memory: page-aligned, as O_DIRECT needs
            self._bytes = torch.frombuffer(self._map, dtype=torch.uint8)
        self.pending, self.copied = [], 0
        with torch.no_grad():
            for slot, tensor in placed:
                if tensor.data_ptr() in later:
                    # an alias of its memory at this moment, kept alive whatever the tensor
                    # becomes (``.data =`` moves no version), sharing its version counter
                    alias = tensor.detach()
                    self.pending.append(_Later(slot, alias, alias._version, _in_place(alias)))
                else:
                    self._copy(tensor, slot, 0, slot.nbytes)
        return skeleton

    def write(
        self, path: Path, hurry: threading.Event | None = None, released: Callable[[], None] | None = None
    ) -> dict[str, Any]:
        """The packed bytes to a new file at ``path``, flushed; what the manifest records of it.

        The tensors ``pack`` left are read here: copied into the buffer (the part pages of
        those written in place, and the others whole), their whole pages written from
        their memory. When ``hurry`` is set (training wants them back), what is left of
        them is copied into the buffer at once, and written from there. ``released`` is
        called once no byte of theirs will be read again.

        Raises:
            Moved: one of them changed in place since ``pack`` (its version moved): the
                file may hold a later value, or part of one. ``released`` was called.
        """
        pending, self.pending = self.pending, []
        padded = file_size(self.used)
        digest = xxhash.xxh3_64()
        done = False

        def release() -> None:
            nonlocal done
            if not done:
                done = True
                moved = [p.slot for p in pending if p.tensor._version != p.version]
                if released is not None:
                    released()
                if moved:
                    raise Moved(f"{len(moved)} tensor(s) changed in place before the checkpoint was written")

        try:
            with torch.no_grad():
                for p in pending:
                    for start, end in _part_pages(p) if p.in_place else [(0, p.slot.nbytes)]:
                        self._copy(p.tensor, p.slot, start, end)
            runs = _runs(pending, padded)
            last = max((i for i, (_, _, owner) in enumerate(runs) if owner is not None), default=-1)
            if last < 0:
                release()
            with _File(path) as out:
                for i, (start, end, owner) in enumerate(runs):
                    if owner is not None and hurry is not None and hurry.is_set():
                        runs[i:] = self._take_back(runs[i:])
                        release()
                        start, end, owner = runs[i]
                    data = self._buffer(start, end) if owner is None else _memory(owner, start, end)
                    digest.update(data[: max(0, min(end, self.used) - start)])
                    out.write(data, start)
                    if i == last:
                        release()  # (a no-op after a hurry)
        except BaseException:
            if not done:  # training must not wait for a write that failed; its own error goes on
                done = True
                if released is not None:
                    released()
            raise
        return {"tensors_bytes": self.used, "tensors_xxh3": digest.hexdigest()}

    def _copy(self, tensor: torch.Tensor, slot: Slot, start: int, end: int) -> None:
        """Bytes ``[start, end)`` of ``tensor`` (contiguous, or all of it) into its slot."""
        if start == 0 and end == slot.nbytes:
            _view(self._bytes, slot).copy_(tensor)  # the GIL is left to training meanwhile
        else:
            flat = tensor.detach().reshape(-1).view(torch.uint8)
            self._bytes[slot.offset + start : slot.offset + end].copy_(flat[start:end])
        self.copied += end - start

    def _take_back(self, runs: list[tuple[int, int, _Later | None]]) -> list[tuple[int, int, _Later | None]]:
        """``runs`` with their tensors' pages copied into the buffer, to be written from there."""
        with torch.no_grad():
            for start, end, owner in runs:
                if owner is not None:
                    self._copy(owner.tensor, owner.slot, start - owner.slot.offset, end - owner.slot.offset)
        return [(start, end, None) for start, end, _ in runs]

    def _buffer(self, start: int, end: int) -> memoryview:
        assert self._map is not None
        return memoryview(self._map)[start:end]


def file_size(used: int) -> int:
    """The size of the file that holds ``used`` bytes of tensors: whole pages (``O_DIRECT``)."""
    return -(-used // ALIGN) * ALIGN


def read(path: Path, found: dict[str, Any]) -> torch.Tensor | None:
    """The tensors' bytes of ``tensors.bin`` at ``path``, read once; None unless they are
    the bytes the manifest ``found`` hashed.

    A resume unpacks this very buffer (``unpack``): the bytes it loads are the bytes it
    checked, read from disk once. The file's pages are dropped after: a resume leaves
    nothing in the page cache for training to evict.
    """
    used = found.get("tensors_bytes")
    if not isinstance(used, int) or path.stat().st_size != file_size(used):
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


def unpack(skeleton: Any, data: torch.Tensor | dict[int, torch.Tensor]) -> Any:
    """``skeleton`` with each ``Slot`` replaced by a tensor of its own, copied out of ``data``
    (``read``'s buffer; of a split save, part -> its buffer)."""
    return _restore(skeleton, data if isinstance(data, dict) else {0: data})


def _place(
    value: Any,
    placed: list[tuple[Slot, torch.Tensor]],
    in_place: Callable[[torch.Tensor], bool],
    dealer: _Dealer | None = None,
) -> Any:
    def leaf(item: Any) -> Any:
        if _packable(item) and dealer is not None and (ref := dealer.deal(item)) is not None:
            return ref
        if not _packable(item) and dealer is not None and dealer.part != 0:
            return None  # part 0 writes the rest
        if _packable(item):
            end = placed[-1][0].offset + placed[-1][0].nbytes if placed else 0
            # in place: the same offset within a page as its memory (Arena.pack)
            offset = end + (item.data_ptr() - end) % ALIGN if in_place(item) else -(-end // _SLOT_ALIGN) * _SLOT_ALIGN
            slot = Slot(offset, item.numel() * item.element_size(), item.dtype, tuple(item.shape))
            placed.append((slot, item))
            return slot
        if isinstance(item, torch.Tensor):  # sparse, quantized, a subclass: torch.save keeps it
            return item.detach().clone()
        return copy.deepcopy(item)

    return _walk(value, leaf)


class _Dealer:
    """``Split``'s deal, tensor by tensor in the state's order."""

    def __init__(self, split: Split) -> None:
        self.part = split.part
        self._split = split
        self._bytes = [0] * split.parts  # dealt to each part so far
        self._count = [0] * split.parts  # tensors dealt to each part so far

    def deal(self, tensor: torch.Tensor) -> Elsewhere | None:
        """None for a tensor of this part; else where it is."""
        nbytes = tensor.numel() * tensor.element_size()
        part = 0
        if tensor.data_ptr() in self._split.shared:
            part = min(range(self._split.parts), key=self._bytes.__getitem__)
        index = self._count[part]
        self._bytes[part] += nbytes
        self._count[part] += 1
        if part == self.part:
            return None
        return Elsewhere(part, index, nbytes, tensor.dtype, tuple(tensor.shape))


def _dealer(split: Split | None) -> _Dealer | None:
    return None if split is None or split.parts == 1 else _Dealer(split)


def resolve(skeleton: Any, parts: dict[int, list[tuple[int, int]]]) -> Any:
    """Part 0's ``skeleton`` with each ``Elsewhere`` made the ``Slot`` its part placed it
    at; ``parts``: part -> that part's ``Arena.placed``.

    Raises:
        ValueError: a part placed other tensors than the deal gave it (its replica's
            state has another structure).
    """
    counted: dict[int, int] = {}

    def leaf(item: Any) -> Any:
        if not isinstance(item, Elsewhere):
            return item
        counted[item.part] = counted.get(item.part, 0) + 1
        placed = parts.get(item.part, [])
        if item.index >= len(placed) or placed[item.index][1] != item.nbytes:
            raise ValueError(f"part {item.part} of the checkpoint holds other tensors than part 0 dealt it")
        return Slot(placed[item.index][0], item.nbytes, item.dtype, item.shape, item.part)

    resolved = _walk(skeleton, leaf)
    for part, placed in parts.items():
        if counted.get(part, 0) != len(placed):
            raise ValueError(f"part {part} of the checkpoint holds other tensors than part 0 dealt it")
    return resolved


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


def _in_place(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s pages can go to disk from its own memory (``Arena.pack``)."""
    big = tensor.numel() * tensor.element_size() >= 2 * ALIGN  # one whole page at least, wherever it starts
    return tensor.device.type == "cpu" and tensor.is_contiguous() and big


def _part_pages(p: _Later) -> list[tuple[int, int]]:
    """The bytes of an in-place tensor (offsets in it) on pages it shares: its first and last."""
    head = -(-p.slot.offset // ALIGN) * ALIGN - p.slot.offset
    tail = (p.slot.offset + p.slot.nbytes) // ALIGN * ALIGN - p.slot.offset
    return [(0, head), (tail, p.slot.nbytes)]


def _runs(pending: list[_Later], size: int) -> list[tuple[int, int, _Later | None]]:
    """The file ``[0, size)`` in page-aligned runs: ``(start, end, tensor)`` for whole pages
    of an in-place tensor (at most ``_IN_PLACE_RUN`` bytes each), ``(start, end, None)`` for
    the buffer's (at most ``_CHUNK``)."""
    runs: list[tuple[int, int, _Later | None]] = []
    at = 0
    for p in sorted((p for p in pending if p.in_place), key=lambda p: p.slot.offset):
        head, tail = _part_pages(p)
        first, last = p.slot.offset + head[1], p.slot.offset + tail[0]  # its whole pages
        runs += [(s, e, None) for s, e in _pieces(at, first, _CHUNK)]
        runs += [(s, e, p) for s, e in _pieces(first, last, _IN_PLACE_RUN)]
        at = last
    return runs + [(s, e, None) for s, e in _pieces(at, size, _CHUNK)]


def _pieces(start: int, end: int, most: int) -> list[tuple[int, int]]:
    return [(at, min(at + most, end)) for at in range(start, end, most)]


def _memory(owner: _Later, start: int, end: int) -> memoryview:
    """Bytes ``[start, end)`` of the file, in ``owner``'s own memory."""
    address = owner.tensor.data_ptr() + start - owner.slot.offset
    return memoryview((ctypes.c_char * (end - start)).from_address(address)).cast("B")


def _restore(value: Any, data: dict[int, torch.Tensor]) -> Any:
    def leaf(item: Any) -> Any:
        if isinstance(item, Slot):
            return _view(data[item.part], item).clone()  # its own storage, as torch.load gives
        return item

    return _walk(value, leaf)


class _File:
    """A new file written in page-aligned pieces, on disk when the ``with`` block ends.

    With ``O_DIRECT`` where the file system takes it: the pieces go to the disk without
    the page cache, so no CPU copies them there and no page of them is left behind for
    training to evict. Where it refuses (tmpfs; ``EINVAL`` at the open or at a write), the
    file is written the plain way, then flushed and its pages dropped.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._direct = getattr(os, "O_DIRECT", 0)  # none on macOS
        self._fd = self._open(os.O_TRUNC)

    def _open(self, flags: int) -> int:
        if self._direct:
            try:
                return os.open(self._path, os.O_WRONLY | os.O_CREAT | flags | self._direct, 0o644)
            except OSError as exc:
                if exc.errno != errno.EINVAL:  # EINVAL: this file system takes no O_DIRECT
                    raise
                self._direct = 0
        return os.open(self._path, os.O_WRONLY | os.O_CREAT | flags, 0o644)

    def write(self, data: memoryview, offset: int) -> None:
        done = 0
        while done < len(data):
            try:
                done += os.pwrite(self._fd, data[done:], offset + done)
            except OSError as exc:
                if exc.errno != errno.EINVAL or not self._direct:
                    raise
                os.close(self._fd)  # the same file, the plain way from here on
                self._direct = 0
                self._fd = self._open(0)

    def __enter__(self) -> _File:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if exc[0] is None:
                os.fsync(self._fd)
                if not self._direct:
                    with contextlib.suppress(AttributeError, OSError):  # no posix_fadvise on macOS
                        os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(self._fd)
