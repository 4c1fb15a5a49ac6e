"""The replicated checkpoint's layout (``tether/_ckpt_tensors.py``): every tensor back bitwise, files checked.

One process, no process group: what is tested is the packing, the hash and the write.
"""

from __future__ import annotations

import collections
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from tether import _ckpt_tensors


def state() -> dict[str, Any]:
    torch.manual_seed(0)
    weights = collections.OrderedDict(w=torch.randn(3, 5), b=torch.randn(5))
    weights._metadata = {"": {"version": 1}}  # type: ignore[attr-defined]  # what a module's state_dict carries
    return {
        "objects": weights,
        "dtypes": [torch.randn(7).to(t) for t in (torch.float16, torch.bfloat16, torch.float64, torch.complex64)],
        "ints": (torch.arange(9, dtype=torch.int64), torch.tensor([True, False, True])),
        "scalar": torch.tensor(0.1),  # Adam's step counter is one of these
        "empty": torch.empty(0, 4),
        "strided": torch.randn(6, 4).t(),  # not contiguous: packed contiguous, same values
        "sparse": torch.eye(3).to_sparse(),  # not packable: stays in state.pt
        "plain": {"lr": 0.1, "name": "sgd"},
    }


def bytes_of(tensor: torch.Tensor) -> list[int]:
    return tensor.contiguous().reshape(-1).view(torch.uint8).tolist()  # type: ignore[no-any-return]


def assert_same(got: Any, want: Any) -> None:
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.dtype == want.dtype and got.shape == want.shape
        if want.is_sparse:
            assert torch.equal(got.to_dense(), want.to_dense())
        else:  # bitwise: the bytes, not a tolerance
            assert bytes_of(got) == bytes_of(want)
        return
    assert type(got) is type(want)
    if isinstance(want, dict):
        assert list(got) == list(want)
        for k in want:
            assert_same(got[k], want[k])
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert_same(g, w)
    else:
        assert got == want


def round_trip(arena: _ckpt_tensors.Arena, value: Any, path: Path) -> Any:
    skeleton = arena.pack(value)
    data = _ckpt_tensors.read(path, arena.write(path))
    assert data is not None
    return _ckpt_tensors.unpack(skeleton, data)


def test_every_tensor_comes_back_bitwise_with_its_dtype_shape_and_containers(tmp_path: Path) -> None:
    want = state()
    got = round_trip(_ckpt_tensors.Arena(), want, tmp_path / "tensors.bin")
    assert_same(got, want)
    assert got["objects"]._metadata == {"": {"version": 1}}
    assert got["objects"]["w"].untyped_storage().nbytes() == 60


def test_the_snapshot_is_taken_at_pack_time_not_at_write_time(tmp_path: Path) -> None:
    weight = torch.full((4,), 0.1)
    arena = _ckpt_tensors.Arena()
    skeleton = arena.pack({"w": weight})
    weight.add_(1.0)  # training goes on while the writer writes
    data = _ckpt_tensors.read(tmp_path / "tensors.bin", arena.write(tmp_path / "tensors.bin"))
    assert data is not None
    assert torch.equal(_ckpt_tensors.unpack(skeleton, data)["w"], torch.full((4,), 0.1))


def test_a_state_that_grows_between_saves_gets_a_larger_buffer(tmp_path: Path) -> None:
    arena = _ckpt_tensors.Arena()
    round_trip(arena, {"w": torch.randn(10)}, tmp_path / "a.bin")
    bigger = {"w": torch.randn(10), "momentum": torch.randn(100_000)}  # an optimizer's state appears
    assert_same(round_trip(arena, bigger, tmp_path / "b.bin"), bigger)


def test_one_flipped_bit_a_missing_block_or_a_wrong_size_is_refused(tmp_path: Path) -> None:
    arena = _ckpt_tensors.Arena()
    arena.pack({"w": torch.randn(5000)})
    path = tmp_path / "tensors.bin"
    found = arena.write(path)
    data = bytearray(path.read_bytes())
    data[12345] ^= 0x01
    path.write_bytes(bytes(data))
    assert _ckpt_tensors.read(path, found) is None
    data[12345] ^= 0x01
    path.write_bytes(bytes(data[:-4096]))
    assert _ckpt_tensors.read(path, found) is None
    path.write_bytes(bytes(data))
    assert _ckpt_tensors.read(path, found) is not None
    assert _ckpt_tensors.read(path, {**found, "tensors_bytes": found["tensors_bytes"] - 4}) is None


def test_what_a_resume_unpacks_is_the_buffer_it_checked_not_the_file_read_again(tmp_path: Path) -> None:
    weights = {"w": torch.full((1000,), 0.1)}
    arena = _ckpt_tensors.Arena()
    skeleton = arena.pack(weights)
    path = tmp_path / "tensors.bin"
    data = _ckpt_tensors.read(path, arena.write(path))
    assert data is not None
    path.write_bytes(bytes(len(path.read_bytes())))  # the file changes after the check: zeros
    got = _ckpt_tensors.unpack(skeleton, data)
    assert torch.equal(got["w"], weights["w"])
    assert got["w"].untyped_storage().nbytes() == 4000  # its own storage, not a view of the buffer


@pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="no O_DIRECT (macOS)")
def test_a_write_that_o_direct_refuses_is_done_again_through_the_page_cache(tmp_path: Path) -> None:
    # a buffer not aligned to a block: the kernel's O_DIRECT write fails with EINVAL, as on a
    # file system without O_DIRECT; the same bytes are written the plain way
    data = bytearray(os.urandom(3 * _ckpt_tensors.ALIGN + 1))
    unaligned = memoryview(data)[1:]
    with pytest.raises(OSError, match="Invalid argument"):
        fd = os.open(tmp_path / "probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT)
        try:
            os.write(fd, unaligned)
        finally:
            os.close(fd)
    with _ckpt_tensors._File(tmp_path / "tensors.bin") as out:
        out.write(unaligned, 0)
    assert (tmp_path / "tensors.bin").read_bytes() == bytes(unaligned)


# --- tensors left to the write (a periodic save's: what only the optimizers change) ---------


def later_state() -> dict[str, Any]:
    torch.manual_seed(1)
    return {
        "odd": torch.randn(3_000_001)[1:],  # 12 MB starting 4 bytes into a page: two runs in place
        "strided": torch.randn(300, 400).t(),  # left to the write, but not contiguous: copied by it
        "bias": torch.randn(100),  # under two pages: copied by it
        "buffer": torch.randn(5000),  # not left: copied by pack
    }


def left(state: dict[str, Any]) -> set[int]:
    return {state[k].data_ptr() for k in ("odd", "strided", "bias")}


class HurryAfter(threading.Event):
    """An event that reads as set from its ``n``-th check on: training wants its tensors back mid-write."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.checks, self.n = 0, n

    def is_set(self) -> bool:
        self.checks += 1
        return self.checks >= self.n


def test_a_tensor_left_to_the_write_goes_to_disk_from_its_own_memory_but_for_its_part_pages(
    tmp_path: Path,
) -> None:
    want = later_state()
    arena = _ckpt_tensors.Arena()
    skeleton = arena.pack(want, left(want))
    released = []
    data = _ckpt_tensors.read(tmp_path / "t.bin", arena.write(tmp_path / "t.bin", None, lambda: released.append(1)))
    assert data is not None
    assert_same(_ckpt_tensors.unpack(skeleton, data), want)
    assert released == [1]
    odd = want["odd"].numel() * 4
    copied_by_write = arena.copied - 5000 * 4  # pack copied the buffer
    # the strided one and the bias whole, of the odd one two part pages at most
    assert 0 < copied_by_write - (300 * 400 + 100) * 4 < 2 * _ckpt_tensors.ALIGN, (arena.copied, odd)


def test_a_hurried_write_copies_what_is_left_releases_then_writes_it_from_the_copy(tmp_path: Path) -> None:
    want = later_state()
    arena = _ckpt_tensors.Arena()
    skeleton = arena.pack(want, left(want))
    hurry = HurryAfter(2)  # the second of the odd tensor's two runs: its 8 MB after the first
    released: list[int] = []
    found = arena.write(tmp_path / "t.bin", hurry, lambda: released.append(hurry.checks))
    assert released == [2]  # at the hurry, before the rest was written
    data = _ckpt_tensors.read(tmp_path / "t.bin", found)
    assert data is not None
    assert_same(_ckpt_tensors.unpack(skeleton, data), want)
    odd = want["odd"].numel() * 4
    assert odd - (8 << 20) <= arena.copied - (5000 + 300 * 400 + 100) * 4 < odd - (8 << 20) + 2 * _ckpt_tensors.ALIGN


def test_a_tensor_left_to_the_write_that_changed_before_it_was_done_raises_moved_once_released(
    tmp_path: Path,
) -> None:
    want = later_state()
    arena = _ckpt_tensors.Arena()
    arena.pack(want, left(want))
    want["bias"].add_(0.1)  # outside an optimizer step, before the write
    released = []
    with pytest.raises(_ckpt_tensors.Moved, match="1 tensor"):
        arena.write(tmp_path / "t.bin", None, lambda: released.append(1))
    assert released == [1]  # training is not kept waiting by a save that is dropped


def test_a_tensor_left_to_the_write_whose_storage_is_swapped_is_written_as_it_was_at_pack(tmp_path: Path) -> None:
    # ``.data =`` moves no version: the write reads the memory the tensor had at pack time,
    # through an alias that keeps it alive (read through the tensor itself, the file held
    # the new values, or part of them: seen)
    weight = torch.nn.Parameter(torch.full((5000,), 0.1))
    arena = _ckpt_tensors.Arena()
    skeleton = arena.pack({"w": weight}, {weight.data_ptr()})
    weight.data = torch.full((5000,), 0.7)
    found = arena.write(tmp_path / "t.bin")
    data = _ckpt_tensors.read(tmp_path / "t.bin", found)
    assert data is not None
    assert torch.equal(_ckpt_tensors.unpack(skeleton, data)["w"], torch.full((5000,), 0.1))


def test_a_write_that_fails_releases_the_tensors_and_raises_its_own_error(tmp_path: Path) -> None:
    want = later_state()
    arena = _ckpt_tensors.Arena()
    arena.pack(want, left(want))
    want["bias"].add_(0.1)  # moved too: the disk's error is the one that says what happened
    released = []
    with pytest.raises(FileNotFoundError):
        arena.write(tmp_path / "gone" / "t.bin", None, lambda: released.append(1))
    assert released == [1]  # the next optimizer step does not wait forever


# --- a save split across replicas (every rank writes its part) -----------------------------


def split_state() -> dict[str, Any]:
    torch.manual_seed(1)
    return {
        "big": torch.randn(3000),  # 12000 bytes
        "buffer": torch.randn(10),  # not shared (a buffer): part 0's
        "a": torch.randn(1000),
        "b": torch.randn(1500),
        "c": torch.randn(700),
        "plain": {"lr": 0.1},
    }


def shared(state: dict[str, Any]) -> set[int]:
    return {state[k].data_ptr() for k in ("big", "a", "b", "c")}


def write_parts(state: dict[str, Any], path: Path, parts: int, later: bool) -> tuple[Any, list[Any], list[int]]:
    """Part 0's skeleton, resolved, every part's bytes as read back, and how many tensors
    each part placed (each part packed by its own arena)."""
    skeletons, placed, data = [], {}, []
    for part in range(parts):
        arena = _ckpt_tensors.Arena()
        split = _ckpt_tensors.Split(part, parts, shared(state))
        skeletons.append(arena.pack(state, shared(state) if later else None, split))
        found = arena.write(path / f"part-{part}.bin")
        placed[part] = arena.placed
        data.append(_ckpt_tensors.read(path / f"part-{part}.bin", found))
    counts = [len(placed[part]) for part in range(parts)]
    del placed[0]
    return _ckpt_tensors.resolve(skeletons[0], placed), data, counts


@pytest.mark.parametrize("later", [False, True])
def test_a_split_save_deals_the_shared_tensors_across_parts_and_comes_back_bitwise(tmp_path: Path, later: bool) -> None:
    want = split_state()
    skeleton, data, counts = write_parts(want, tmp_path, 2, later)
    assert all(d is not None for d in data)
    assert_same(_ckpt_tensors.unpack(skeleton, dict(enumerate(data))), want)
    # in the state's order, each to the part with fewer bytes: big -> 0, a -> 1, b -> 1, c -> 1
    slots = _ckpt_tensors._walk(skeleton, lambda x: x)
    assert {k: slots[k].part for k in ("big", "buffer", "a", "b", "c")} == {
        "big": 0,
        "buffer": 0,
        "a": 1,
        "b": 1,
        "c": 1,
    }
    assert counts == [2, 3]  # nothing written twice


def test_a_split_save_whose_parts_hold_other_tensors_than_dealt_is_refused(tmp_path: Path) -> None:
    want = split_state()
    arena0, arena1 = _ckpt_tensors.Arena(), _ckpt_tensors.Arena()
    skeleton = arena0.pack(want, None, _ckpt_tensors.Split(0, 2, shared(want)))
    other = {**want, "c": torch.randn(701)}  # a replica of another structure
    arena1.pack(other, None, _ckpt_tensors.Split(1, 2, shared(other)))
    with pytest.raises(ValueError, match="part 1 of the checkpoint holds other tensors than part 0 dealt it"):
        _ckpt_tensors.resolve(skeleton, {1: arena1.placed})
    fewer = {k: v for k, v in want.items() if k != "c"}
    arena1.pack(fewer, None, _ckpt_tensors.Split(1, 2, {fewer[k].data_ptr() for k in ("big", "a", "b")}))
    with pytest.raises(ValueError, match="part 1 of the checkpoint holds other tensors"):
        _ckpt_tensors.resolve(skeleton, {1: arena1.placed})
