"""The data-plane collectives: ``all_reduce``, ``all_gather``, ``broadcast`` and friends.

Validation and type conversion live here, once; every wait goes through
``waits.wait_work``, so a collective returns as soon as a failure anywhere is known.
Numbers keep their Python type: an int travels as int64, a float as float64 (ignite
sends ``broadcast`` numbers as float32). Strings and other objects travel as bytes,
with their length first; arbitrary objects use pickle, as ``dist.all_gather_object``
does, and only the caller's own objects are ever unpickled — never a failure record.
"""

from __future__ import annotations

import json
import pickle
import struct
from numbers import Number
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist

from . import groups
from ._core.context import Context
from ._core.runtime import current
from ._core.waits import Group, wait_work
from .backends import REDUCE_OPS
from .syncs import check_rank, check_timeout


def _run(ctx: Context, work: Any, group: Group, signature: str, timeout: float | None) -> None:
    wait_work(ctx, work, group, signature, timeout)


def _describe(t: torch.Tensor) -> str:
    return f"{t.dtype}{list(t.shape)}".replace("torch.", "")


def _to_device(ctx: Context, tensor: torch.Tensor) -> torch.Tensor:
    device = ctx.backend.device()
    return tensor if tensor.device == device else tensor.to(device)


def all_reduce(
    tensor: torch.Tensor | float, op: str = "SUM", group: Any = None, timeout: float | None = None
) -> torch.Tensor | float:
    """Reduce ``tensor`` (or a number) across ranks; every rank gets the result.

    Args:
        tensor: a tensor (reduced in place when it is on the backend's device) or a number.
        op: "SUM", "PRODUCT", "MIN", "MAX", "AND" or "OR".
        group: None (all ranks), a list of ranks, or a ProcessGroup.
        timeout: seconds; on expiry every rank raises ``SyncTimeout``.

    Returns:
        The reduced tensor, or a number of the input's type.

    Raises:
        TypeError, ValueError: unsupported input type or op, on every rank alike.
        PeerFailure, SyncTimeout, SyncMismatch: see ``tether.barrier``.
    """
    if not isinstance(tensor, (torch.Tensor, Number)):
        raise TypeError(f"all_reduce: unhandled input type {type(tensor).__name__}; pass a tensor or a number")
    if op not in REDUCE_OPS:
        raise ValueError(f"all_reduce: unsupported reduction operation {op!r}; choose one of {sorted(REDUCE_OPS)}")
    timeout = check_timeout(timeout, "all_reduce")
    ctx = current()
    members = groups.resolve(ctx, group) if ctx.backend.distributed else None
    if members is None:
        return tensor
    number = not isinstance(tensor, torch.Tensor)
    t = torch.tensor(tensor, device=ctx.backend.device()) if number else _to_device(ctx, tensor)
    ctx.check()  # never send into a job that already failed: the work would outlive the rank
    work = dist.all_reduce(t, REDUCE_OPS[op], group=members.pg, async_op=True)
    _run(ctx, work, members, f"all_reduce({op}, {_describe(t)})", timeout)
    if number:
        return cast(float, t.item())
    if isinstance(tensor, torch.Tensor) and t is not tensor:
        tensor.copy_(t)
        return tensor
    return t


def _gather_tensor(
    ctx: Context, t: torch.Tensor, members: Group, signature: str, timeout: float | None
) -> torch.Tensor:
    if t.ndim == 0:
        t = t.unsqueeze(0)
    out = [torch.empty_like(t) for _ in members.members]
    ctx.check()
    work = dist.all_gather(out, t, group=members.pg, async_op=True)
    _run(ctx, work, members, f"{signature}({_describe(t)})", timeout)
    return torch.cat(out, dim=0)


def _gather_bytes(ctx: Context, data: bytes, members: Group, signature: str, timeout: float | None) -> list[bytes]:
    device = ctx.backend.device()
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    sizes = _gather_tensor(ctx, size, members, signature + "/size", timeout).tolist()
    padded = torch.zeros(max(sizes), dtype=torch.uint8, device=device)
    padded[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else padded[:0]
    rows = _gather_tensor(ctx, padded.unsqueeze(0), members, signature + "/data", timeout).cpu()
    return [bytes(row[:n].tolist()) for row, n in zip(rows, sizes, strict=True)]


def all_gather(tensor: Any, group: Any = None, timeout: float | None = None) -> Any:
    """Gather ``tensor`` from every rank.

    Args:
        tensor: a tensor (same shape on every rank), a number, a str, or any picklable object.
        group: None (all ranks), a list of ranks, or a ProcessGroup.
        timeout: seconds; on expiry every rank raises ``SyncTimeout``.

    Returns:
        For a tensor, one tensor of shape ``(group_size * tensor.shape[0], ...)`` (a 0-d
        tensor counts as shape ``(1,)``); otherwise a list with one item per rank. A rank
        outside ``group`` gets its input back.
    """
    timeout = check_timeout(timeout, "all_gather")
    ctx = current()
    members = groups.resolve(ctx, group) if ctx.backend.distributed else None
    if members is None:
        return tensor if isinstance(tensor, torch.Tensor) or ctx.backend.distributed else [tensor]
    if isinstance(tensor, torch.Tensor):
        return _gather_tensor(ctx, _to_device(ctx, tensor), members, "all_gather", timeout).to(tensor.device)
    if isinstance(tensor, Number) and not isinstance(tensor, bool):
        return _gather_tensor(
            ctx, torch.tensor([tensor], device=ctx.backend.device()), members, "all_gather", timeout
        ).tolist()
    if isinstance(tensor, str):
        return [b.decode() for b in _gather_bytes(ctx, tensor.encode(), members, "all_gather[str]", timeout)]
    blobs = _gather_bytes(ctx, pickle.dumps(tensor), members, "all_gather[object]", timeout)
    return [pickle.loads(b) for b in blobs]  # the caller's own objects, from its own job


def all_gather_tensors_with_shapes(
    tensor: torch.Tensor, shapes: list[list[int]], group: Any = None, timeout: float | None = None
) -> list[torch.Tensor]:
    """Gather tensors whose shapes differ across ranks but whose number of dims is the same.

    Args:
        tensor: this rank's tensor.
        shapes: the shape of every member's tensor, in rank order within ``group``.

    Returns:
        One tensor per member, each with its own shape.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"all_gather_tensors_with_shapes: tensor must be a torch.Tensor, got {type(tensor).__name__}")
    ctx = current()
    members = groups.resolve(ctx, group) if ctx.backend.distributed else None
    if members is None:
        return [tensor]
    if len(shapes) != len(members.members) or any(len(s) != tensor.ndim for s in shapes):
        raise ValueError(
            f"all_gather_tensors_with_shapes: need {len(members.members)} shapes of {tensor.ndim} dims, got {shapes}"
        )
    index = members.members.index(ctx.backend.topology.rank)
    if list(tensor.shape) != list(shapes[index]):
        raise ValueError(
            f"all_gather_tensors_with_shapes: tensor has shape {list(tensor.shape)}, shapes says {shapes[index]}"
        )
    biggest = torch.tensor(shapes).amax(dim=0).tolist()
    padded = torch.zeros([1, *biggest], dtype=tensor.dtype, device=ctx.backend.device())
    padded[0][tuple(slice(0, n) for n in tensor.shape)] = tensor
    rows = _gather_tensor(ctx, padded, members, "all_gather_tensors_with_shapes", timeout)
    return [rows[i][tuple(slice(0, n) for n in shape)].to(tensor.device) for i, shape in enumerate(shapes)]


_NUMBER = struct.Struct("<q")  # a number travels as [kind, 64 bits]: int, float or bool


def _encode_number(x: Number) -> list[int]:
    if isinstance(x, bool):
        return [2, int(x)]
    if isinstance(x, int):
        return [0, x]
    return [1, _NUMBER.unpack(struct.pack("<d", float(cast(float, x))))[0]]


def _decode_number(kind: int, bits: int) -> int | float | bool:
    if kind == 2:
        return bool(bits)
    if kind == 0:
        return bits
    return cast(float, struct.unpack("<d", _NUMBER.pack(bits))[0])


def broadcast(
    tensor: torch.Tensor | float | str | Path | None,
    src: int = 0,
    safe_mode: bool = False,
    group: Any = None,
    timeout: float | None = None,
) -> torch.Tensor | float | str | Path:
    """Send ``tensor`` (a tensor, number, str or Path) from rank ``src`` to every rank.

    Args:
        tensor: the value on ``src``; elsewhere a placeholder of the same type (and, for
            tensors, shape and dtype), or anything (None included) with ``safe_mode``.
        src: the sending rank (a global rank).
        safe_mode: the other ranks learn type, shape and dtype from ``src`` first (two
            more small collectives).
        group: None (all ranks), a list of ranks, or a ProcessGroup containing ``src``.
        timeout: seconds; on expiry every rank raises ``SyncTimeout``.

    Raises:
        TypeError: unsupported type. ValueError: ``src`` out of range or not in ``group``;
            None on ``src``, or None elsewhere without ``safe_mode``.
    """
    if not (isinstance(tensor, (torch.Tensor, Number, str, Path)) or tensor is None):
        raise TypeError(f"broadcast: unhandled input type {type(tensor).__name__}")
    timeout = check_timeout(timeout, "broadcast")
    ctx = current()
    topo = ctx.backend.topology
    check_rank(src, topo.world_size, "broadcast")
    is_src = topo.rank == src
    if tensor is None and (is_src or not safe_mode):
        raise ValueError(
            "broadcast: source data can not be None" if is_src else "broadcast: pass safe_mode=True to use None"
        )
    members = groups.resolve(ctx, group) if ctx.backend.distributed else None
    if members is None:
        return cast(torch.Tensor | float | str | Path, tensor)
    if src not in members.members:
        raise ValueError(f"broadcast: src {src} is not in the group {list(members.members)}")
    device = ctx.backend.device()

    def send(t: torch.Tensor, what: str) -> torch.Tensor:
        ctx.check()
        work = dist.broadcast(t, src=src, group=members.pg, async_op=True)
        _run(ctx, work, members, f"broadcast(src={src}, {what})", timeout)
        return t

    def send_bytes(data: bytes, what: str) -> bytes:
        size = send(torch.tensor([len(data)], dtype=torch.int64, device=device), what + "/size")
        buf = torch.zeros(int(size.item()), dtype=torch.uint8, device=device)
        if is_src and data:
            buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        return bytes(send(buf, what + "/data").cpu().tolist())

    kind = type(tensor).__name__
    if safe_mode:
        header: dict[str, Any] = {
            "kind": "tensor" if isinstance(tensor, torch.Tensor) else "path" if isinstance(tensor, Path) else kind
        }
        if isinstance(tensor, torch.Tensor):
            header.update(dtype=str(tensor.dtype).removeprefix("torch."), shape=list(tensor.shape))
        got = json.loads(send_bytes(json.dumps(header).encode() if is_src else b"", "header"))
        kind = got["kind"]
        if kind == "tensor" and not is_src:
            dtype = getattr(torch, got["dtype"], None)
            if not isinstance(dtype, torch.dtype):
                raise TypeError(f"broadcast: unknown dtype {got['dtype']!r} from rank {src}")
            tensor = torch.empty(got["shape"], dtype=dtype, device=device)
    if isinstance(tensor, torch.Tensor) and kind in ("tensor", "Tensor", "Parameter"):
        t = send(_to_device(ctx, tensor) if is_src else torch.empty_like(tensor, device=device), _describe(tensor))
        return t.to(tensor.device)
    if kind in ("str", "path", "PosixPath", "WindowsPath"):
        text = send_bytes(str(tensor).encode() if is_src else b"", "str").decode()
        return text if kind == "str" else Path(text)
    pair = torch.tensor(_encode_number(cast(Number, tensor)) if is_src else [0, 0], dtype=torch.int64, device=device)
    kind_code, bits = send(pair, "number").tolist()
    return _decode_number(kind_code, bits)
