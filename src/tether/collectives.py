"""The data-plane collectives: ``all_reduce``, ``all_gather``, ``broadcast`` and friends.

Type conversion lives here, once (the checks in ``_checks.py``); every wait goes through
``waits.run_work``, so a collective returns as soon as a failure anywhere is known.

* Numbers keep their Python type and precision: an int travels as int64, a float as
  float64 (as ignite's ``all_reduce``/``all_gather``), a complex as complex128, a bool
  as bool; ``broadcast`` too (ignite sends its numbers as float32).
* Tensors keep their dtype and device. A tensor the backend can send where it is (gloo:
  CPU or CUDA; NCCL: the current CUDA device) is sent as is; any other goes through a
  contiguous copy on the backend's device. Either way ``all_reduce`` and ``broadcast``
  fill the caller's tensor in place and return it (ignite does so for a tensor on its
  device, and returns a new tensor otherwise).
* Strings and other objects travel as bytes, with their length first, in one collective
  when they fit a frame (``_frame``), else in a second one sized for the longest;
  arbitrary objects use pickle, as ``dist.all_gather_object`` does, and only the caller's
  own objects are ever unpickled — never a failure record.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import pickle
import struct
from collections.abc import Callable
from numbers import Complex, Integral, Number, Real
from pathlib import Path
from typing import Any, TypeVar, cast

import torch
import torch.distributed.distributed_c10d as c10d  # torch's own: ``dist.*`` are tether's raw-call wrappers

from . import _checks, groups
from ._core import lent
from ._core.context import Context
from ._core.group import Group
from ._core.runtime import current
from ._core.verdicts import mismatch_of
from ._core.waits import in_call, run_work
from .backends import REDUCE_OPS


def _run(
    ctx: Context,
    issue: Callable[..., Any],
    args: tuple[Any, ...],
    lent_tensors: list[torch.Tensor],
    members: Group,
    signature: str,
    timeout: float | None,
    **kwargs: Any,
) -> None:
    """Issue ``issue(*args, **kwargs)``, an async collective, and wait for it (``waits.run_work``).

    ``lent_tensors`` are the tensors the backend's threads hold until the work is dropped
    (``_core/lent.py``): lent with their counts before the issue (an issue that raises
    leaves them at those counts, so the exit never waits for them), returned once the wait
    did.
    """
    loan = lent.lend(lent.counted(lent_tensors))
    run_work(ctx, functools.partial(issue, *args, **kwargs), members, signature, timeout)
    lent.returned(loan)


T = TypeVar("T")


def _read(ctx: Context, t: torch.Tensor, read: Callable[[torch.Tensor], T]) -> T:
    """A collective's result read on the CPU (``.item()``, ``.tolist()``, ``.cpu()``), then checked.

    On a GPU the copy runs under this rank's whereabouts (a copy that blocks is a wait the
    watchdog can name and end), and a failure known by the time it returns is raised
    instead of the value: after an abort a buffer can hold an unreduced value with no error
    from the backend, and a job that failed never returns a result. On the CPU the copy
    cannot block, and the check is one attribute read.
    """
    if t.is_cuda:
        with in_call(ctx, "reading a collective's result on the CPU"):
            value = read(t)
    else:
        value = read(t)
    ctx.check()
    return value


def _item(t: torch.Tensor) -> Any:
    return t.item()


def _tolist(t: torch.Tensor) -> Any:
    return t.tolist()


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return t.cpu()


_SIGNATURE_BYTES = 96  # what each rank tells the others of its call, with ``check_collectives``
_INLINE_BYTES = 4096  # a tensor of at most this many bytes a rank travels inside the check itself
_FRAME_BYTES = _SIGNATURE_BYTES + _INLINE_BYTES  # the same for every checked call: never a size mismatch


def _signature_bytes(signature: str) -> bytes:
    """``signature`` in 96 bytes; a longer one keeps its head and a digest of the whole, so two stay apart."""
    text = signature.encode()
    if len(text) > _SIGNATURE_BYTES:
        text = text[: _SIGNATURE_BYTES - 17] + b"#" + hashlib.blake2b(text, digest_size=8).hexdigest().encode()
    return text.ljust(_SIGNATURE_BYTES, b"\0")


def _agree(
    ctx: Context,
    group: Group,
    signature: str,
    timeout: float | None,
    payload: torch.Tensor | None = None,
    nbytes: int | None = None,
) -> torch.Tensor | None:
    """Raise ``SyncMismatch`` unless every member passes the same (with ``check_collectives``).

    Every member all-gathers a frame of 4,192 bytes: its call's signature
    (``all_reduce(SUM, float32[2, 3])``, 96 bytes), then ``payload``'s bytes when the call
    moves ``nbytes`` <= 4 KiB a rank (``payload`` None: this rank only receives). Every
    member learns every other's call and raises the same error before any data of a
    larger call moves: no rank crashes on mismatched buffers or returns garbage. The
    frame's size is the same for every checked call, whatever each rank passed.

    Returns:
        The members' payloads, one row of ``nbytes`` bytes each, when they travelled in
        the frames (the call is done: one round trip, not two); else None.
    """
    inline = nbytes if nbytes is not None and nbytes <= _INLINE_BYTES else None  # bytes carried in the frame
    device = ctx.backend.comm_device()
    mine = torch.zeros(_FRAME_BYTES, dtype=torch.uint8, device=device)
    mine[:_SIGNATURE_BYTES] = torch.frombuffer(bytearray(_signature_bytes(signature)), dtype=torch.uint8)
    if inline and payload is not None:
        with torch.no_grad():
            mine[_SIGNATURE_BYTES : _SIGNATURE_BYTES + inline] = payload.detach().reshape(-1).view(torch.uint8)
    rows = torch.empty(len(group.members), _FRAME_BYTES, dtype=torch.uint8, device=device)
    ctx.check()
    outs = list(rows.unbind(0))
    _run(ctx, c10d.all_gather, (outs, mine), [mine, *outs], group, signature, timeout, group=group.pg, async_op=True)
    signatures = rows[:, :_SIGNATURE_BYTES]
    if not _read(ctx, (signatures == signatures[0]).all(), _item):
        named = _read(ctx, signatures, _tolist)
        calls = {
            r: bytes(row).rstrip(b"\0").decode(errors="replace") for r, row in zip(group.members, named, strict=True)
        }
        raise mismatch_of(ctx, group, calls)
    return None if inline is None else rows[:, _SIGNATURE_BYTES : _SIGNATURE_BYTES + inline]


def _describe(t: torch.Tensor) -> str:
    return f"{t.dtype}{list(t.shape)}".replace("torch.", "")


def _staged(ctx: Context, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` itself when the backend can send it as it is, else a contiguous copy it can."""
    if ctx.backend.can_send(tensor) and tensor.is_contiguous():
        return tensor
    return tensor.detach().to(ctx.backend.comm_device(), memory_format=torch.contiguous_format, copy=True)


def _fill(target: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """Copy ``source`` into the caller's ``target`` (a leaf that requires grad included)."""
    if source is not target:
        with torch.no_grad():
            target.copy_(source)
    return target


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _number(x: object, device: torch.device) -> torch.Tensor:
    """A 0-d tensor holding ``x`` exactly: int64, float64, complex128 or bool.

    A plain int or float takes ``scalar_tensor`` (about 1 us here, ``torch.tensor`` 2.5):
    this runs before the collective is issued, and Python there delays every rank's
    send. With about 5 us more of it, an all_reduce of one int cost 1.29x / 1.24x of raw
    ``dist.all_reduce`` at 2 / 4 ranks on this 2-core machine (``benchmarks/results/sync.md``
    as of commit fcd5391).
    """
    if type(x) is int and _INT64_MIN <= x <= _INT64_MAX:  # out of range: torch.tensor's error
        return torch.scalar_tensor(x, dtype=torch.int64, device=device)
    if type(x) is float:
        return torch.scalar_tensor(x, dtype=torch.float64, device=device)
    if isinstance(x, bool):
        return torch.tensor(x, dtype=torch.bool, device=device)
    if isinstance(x, Integral):
        return torch.tensor(int(x), dtype=torch.int64, device=device)
    if isinstance(x, Real):
        return torch.tensor(float(x), dtype=torch.float64, device=device)
    if isinstance(x, Complex):
        return torch.tensor(complex(x), dtype=torch.complex128, device=device)
    return torch.tensor(x, device=device)


# A plain int, float or bool is reduced as a 0-d tensor tether made itself, on the member
# group it resolved: torch's ``dist.all_reduce`` would only repeat those checks (a tensor
# subclass, a rank outside the group, a complex view, a coalescing block), and its Python
# costs about 4 us before the send. The group's own ``allreduce`` is what it calls in the end.
_PLAIN = frozenset({int, float, bool})
_OPTIONS: dict[str, c10d.AllreduceOptions] = {}


def allreduce_options(op: str) -> c10d.AllreduceOptions:
    """The options of an asynchronous all-reduce by ``op`` (made once per op, never changed;
    also DDP's hook's, ``ddp.py``)."""
    options = _OPTIONS.get(op)
    if options is None:
        options = c10d.AllreduceOptions()
        options.reduceOp = c10d.ReduceOp(REDUCE_OPS[op])
        options.asyncOp = True
        _OPTIONS[op] = options
    return options


def all_reduce(
    tensor: torch.Tensor | float, op: str = "SUM", group: Any = None, timeout: float | None = None
) -> torch.Tensor | float:
    """Reduce ``tensor`` (or a number) across ranks; every rank gets the result.

    Args:
        tensor: a tensor (reduced in place, and returned) or a number (an int is
            reduced as int64, a float as float64).
        op: "SUM", "PRODUCT", "MIN", "MAX", "AND" or "OR".
        group: None (all ranks), a list of ranks, or a ProcessGroup.
        timeout: seconds; on expiry every rank raises ``SyncTimeout``.

    Returns:
        ``tensor``, reduced, or a number of the input's type. A rank outside ``group``
        gets its input back.

    Raises:
        TypeError, ValueError: unsupported input type or op, or a bad ``group``, on every
            rank alike (ignite's messages: "Unhandled input type", "Unsupported reduction
            operation", "Argument group should be list of int or ProcessGroup").
        PeerFailure, SyncTimeout, SyncMismatch: see ``tether.barrier``.
    """
    _checks.check_input(tensor, (torch.Tensor, Number), "all_reduce")
    _checks.check_reduce_op(op, REDUCE_OPS)
    timeout = _checks.check_timeout(timeout, "all_reduce")
    ctx = current()
    members = groups.resolve(ctx, group) if ctx.backend.distributed else None
    if members is None:
        return tensor
    if op in ("AND", "OR"):  # only these need the group's backend: the happy path of the others asks nothing
        backend = c10d.get_backend(members.pg) if members.pg is not None else ctx.backend.backend()
        _checks.check_op_on_backend(op, backend)
    t = _staged(ctx, tensor) if isinstance(tensor, torch.Tensor) else _number(tensor, ctx.backend.comm_device())
    signature = f"all_reduce({op}, {_describe(t)})"
    if ctx.settings.check_collectives:
        _agree(ctx, members, signature, timeout)
    ctx.check()  # never send into a job that already failed: the work would outlive the rank
    if type(tensor) in _PLAIN:  # tether's own 0-d tensor: straight to the group (see _OPTIONS)
        pg = members.pg if members.pg is not None else ctx.pg
        _run(ctx, pg.allreduce, ([t], allreduce_options(op)), [t], members, signature, timeout)
    else:
        _run(
            ctx, c10d.all_reduce, (t, REDUCE_OPS[op]), [t], members, signature, timeout, group=members.pg, async_op=True
        )
    if isinstance(tensor, torch.Tensor):
        return _fill(tensor, t)
    return cast(float, _read(ctx, t, _item))


def _gather_tensor(
    ctx: Context, t: torch.Tensor, members: Group, signature: str, timeout: float | None
) -> torch.Tensor:
    if t.ndim == 0:
        t = t.unsqueeze(0)
    if ctx.settings.check_collectives:
        inline = _agree(ctx, members, f"{signature}({_describe(t)})", timeout, t, t.nbytes)
        if inline is not None:  # the data came with the check
            return inline.contiguous().view(t.dtype).reshape(len(members.members) * t.shape[0], *t.shape[1:])
    out = [torch.empty_like(t) for _ in members.members]
    ctx.check()
    signature = f"{signature}({_describe(t)})"
    _run(ctx, c10d.all_gather, (out, t), [t, *out], members, signature, timeout, group=members.pg, async_op=True)
    return torch.cat(out, dim=0)


# A str's or an object's bytes travel in a frame of fixed size: their length, then the bytes
# when they fit. Measured here (gloo, 2 and 4 ranks): an all_gather or a broadcast of 8 B
# costs what one of 64 KiB does, so one frame makes a small object one collective, not
# two. An all_gather's frame shrinks as the group grows (each rank receives them all).
_LENGTH = struct.Struct("<q")
_FRAME_MAX = 16 * 1024  # bytes: the frame of a broadcast, and of an all_gather of up to 4 ranks
_GATHER_BUDGET = 64 * 1024  # bytes a rank receives in the frames of one all_gather, at most
_FRAME_MIN = 256


def _frame(data: bytes, size: int, device: torch.device) -> torch.Tensor:
    """A frame of ``size`` bytes: ``data``'s length, then ``data`` if it fits."""
    frame = torch.zeros(size, dtype=torch.uint8)
    frame[: _LENGTH.size] = torch.frombuffer(bytearray(_LENGTH.pack(len(data))), dtype=torch.uint8)
    if 0 < len(data) <= size - _LENGTH.size:
        frame[_LENGTH.size : _LENGTH.size + len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return frame.to(device)


def _unframe(frame: torch.Tensor) -> bytes | int:
    """A frame's bytes (on the CPU), or their length when they did not fit."""
    n = _LENGTH.unpack(_bytes_of(frame[: _LENGTH.size]))[0]
    return _bytes_of(frame[_LENGTH.size : _LENGTH.size + n]) if n <= frame.numel() - _LENGTH.size else int(n)


def _bytes_of(t: torch.Tensor) -> bytes:
    """A uint8 CPU tensor's bytes (``bytes(t.tolist())`` makes a Python int per byte)."""
    t = t.contiguous()
    return ctypes.string_at(t.data_ptr(), t.numel()) if t.numel() else b""


def _gather_bytes(ctx: Context, data: bytes, members: Group, signature: str, timeout: float | None) -> list[bytes]:
    """Every member's ``data``: one all_gather of frames, and a second, sized for the longest,
    only when some member's did not fit its frame (every member sees that in the frames)."""
    device = ctx.backend.comm_device()
    size = max(_FRAME_MIN, min(_FRAME_MAX, _GATHER_BUDGET // len(members.members)))
    frames = _gather_tensor(ctx, _frame(data, size, device).unsqueeze(0), members, signature, timeout)
    got = [_unframe(row) for row in _read(ctx, frames, _cpu)]
    if all(isinstance(g, bytes) for g in got):
        return cast(list[bytes], got)
    sizes = [g if isinstance(g, int) else len(g) for g in got]
    padded = torch.zeros(max(sizes), dtype=torch.uint8, device=device)
    padded[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else padded[:0]
    rows = _read(ctx, _gather_tensor(ctx, padded.unsqueeze(0), members, signature + "/data", timeout), _cpu)
    return [_bytes_of(row[:n]) for row, n in zip(rows, sizes, strict=True)]


def all_gather(tensor: Any, group: Any = None, timeout: float | None = None) -> Any:
    """Gather ``tensor`` from every rank.

    Args:
        tensor: a tensor (same shape and dtype on every rank), a number (an int gathers
            as int64, a float as float64), a str, or any picklable object.
        group: None (all ranks), a list of ranks, or a ProcessGroup.
        timeout: seconds; on expiry every rank raises ``SyncTimeout``.

    Returns:
        For a tensor, one tensor of shape ``(group_size * tensor.shape[0], ...)`` (a 0-d
        tensor counts as shape ``(1,)``); otherwise a list with one item per rank. A rank
        outside ``group`` gets its input back. Tensors keep their dtype and device.

    Raises:
        ValueError: a bad ``group`` (ignite's message first), on every rank alike.
    """
    timeout = _checks.check_timeout(timeout, "all_gather")
    ctx = current()
    members = groups.resolve(ctx, group) if ctx.backend.distributed else None
    if members is None:
        return tensor if isinstance(tensor, torch.Tensor) or ctx.backend.distributed else [tensor]
    if isinstance(tensor, torch.Tensor):
        gathered = _gather_tensor(ctx, _staged(ctx, tensor), members, "all_gather", timeout)
        return _read(ctx, gathered, lambda t: t.to(tensor.device))
    if isinstance(tensor, Number):
        number = _number(tensor, ctx.backend.comm_device())
        return _read(ctx, _gather_tensor(ctx, number, members, "all_gather", timeout), _tolist)
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
        group: None (all ranks), a list of ranks, or a ProcessGroup.
        timeout: seconds; on expiry every rank raises ``SyncTimeout``.

    Returns:
        One tensor per member, each with its own shape, on ``tensor``'s device. A rank
        outside ``group`` gets ``[tensor]``.

    Raises:
        TypeError, ValueError: ``tensor`` is not a tensor, ``shapes`` does not describe
            one tensor per member with ``tensor``'s number of dims, or a bad ``group``.
    """
    _checks.check_shapes_input(tensor)
    timeout = _checks.check_timeout(timeout, "all_gather_tensors_with_shapes")
    ctx = current()
    members = groups.resolve(ctx, group) if ctx.backend.distributed else None
    if members is None:
        return [tensor]
    index = members.members.index(ctx.backend.topology.rank)
    rows = _checks.check_shapes(tensor, shapes, len(members.members), index)
    biggest = torch.tensor(rows).amax(dim=0).tolist()
    padded = torch.zeros([1, *biggest], dtype=tensor.dtype, device=ctx.backend.comm_device())
    padded[0][tuple(slice(0, n) for n in tensor.shape)] = tensor
    gathered = _gather_tensor(ctx, padded, members, "all_gather_tensors_with_shapes", timeout)
    out = _read(ctx, gathered, lambda t: t.to(tensor.device))
    return [out[i][tuple(slice(0, n) for n in shape)] for i, shape in enumerate(rows)]


# A number travels as three int64: [kind, 64 bits, 64 bits] (the second word: a complex's imaginary part).
_INT, _FLOAT, _BOOL, _COMPLEX = 0, 1, 2, 3
_WORD = struct.Struct("<q")


def _bits(x: float) -> int:
    return cast(int, _WORD.unpack(struct.pack("<d", x))[0])


def _float(bits: int) -> float:
    return cast(float, struct.unpack("<d", _WORD.pack(bits))[0])


def _encode_number(x: Number) -> list[int]:
    if isinstance(x, bool):
        return [_BOOL, int(x), 0]
    if isinstance(x, Integral):
        return [_INT, int(x), 0]
    if isinstance(x, Real):
        return [_FLOAT, _bits(float(x)), 0]
    z = complex(cast(complex, x))
    return [_COMPLEX, _bits(z.real), _bits(z.imag)]


def _decode_number(kind: int, a: int, b: int) -> int | float | bool | complex:
    if kind == _BOOL:
        return bool(a)
    if kind == _INT:
        return a
    if kind == _FLOAT:
        return _float(a)
    return complex(_float(a), _float(b))


def _kind(x: object) -> str:
    if isinstance(x, torch.Tensor):
        return "tensor"
    if isinstance(x, Path):
        return "path"
    return "str" if isinstance(x, str) else "number"


def broadcast(
    tensor: torch.Tensor | float | str | Path | None,
    src: int = 0,
    safe_mode: bool = False,
    group: Any = None,
    timeout: float | None = None,
) -> torch.Tensor | float | str | Path:
    """Send ``tensor`` (a tensor, number, str or Path) from rank ``src`` to every rank.

    A tensor is filled in place on the receiving ranks and returned, as ignite does (a
    tensor the backend cannot send where it is goes through a copy, then is filled). A
    number keeps its type and 64 bits (ignite sends it as float32).

    Args:
        tensor: the value on ``src``; elsewhere a placeholder of the same type (and, for
            tensors, shape and dtype), or anything (None included) with ``safe_mode``.
        src: the sending rank (a global rank).
        safe_mode: the other ranks learn type, shape and dtype from ``src`` first (two
            more small collectives); a receiving rank's tensor is filled only if it has
            that shape and dtype, else a new one is made on ``tether.device()``.
        group: None (all ranks), a list of ranks, or a ProcessGroup containing ``src``.
        timeout: seconds; on expiry every rank raises ``SyncTimeout``.

    Raises:
        TypeError: unsupported type ("Unhandled input type"). ValueError: ``src`` out of
            range or not in ``group``; None on ``src`` ("Source data can not be None"), or
            None elsewhere without ``safe_mode``; raised before any communication.

    Example::

        weights = tether.broadcast(weights, src=0)  # the same tensor object, filled
    """
    timeout = _checks.check_timeout(timeout, "broadcast")
    ctx = current()
    topo = ctx.backend.topology
    distributed = ctx.backend.distributed
    _checks.check_broadcast(tensor, src, topo.rank, topo.world_size, safe_mode, distributed)
    members = groups.resolve(ctx, group) if distributed else None
    if members is None:
        return cast(torch.Tensor | float | str | Path, tensor)
    _checks.check_src_in_group(src, members.members)
    is_src = topo.rank == src
    device = ctx.backend.comm_device()

    def send(t: torch.Tensor, what: str) -> torch.Tensor:
        if ctx.settings.check_collectives:
            inline = _agree(ctx, members, f"broadcast(src={src}, {what})", timeout, t if is_src else None, t.nbytes)
            if inline is not None:  # the data came with the check, in the source's row
                if not is_src:
                    with torch.no_grad():
                        t.copy_(inline[members.members.index(src)].view(t.dtype).reshape(t.shape))
                return t
        ctx.check()
        signature = f"broadcast(src={src}, {what})"
        _run(ctx, c10d.broadcast, (t,), [t], members, signature, timeout, src=src, group=members.pg, async_op=True)
        return t

    def send_bytes(data: bytes, what: str) -> bytes:
        got = _unframe(_read(ctx, send(_frame(data, _FRAME_MAX, device), what), _cpu))
        if isinstance(got, bytes):  # it fitted the frame: one collective
            return got
        buf = torch.zeros(got, dtype=torch.uint8, device=device)
        if is_src:
            buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        return _bytes_of(_read(ctx, send(buf, what + "/data"), _cpu))

    kind = _kind(tensor)
    if safe_mode:
        header: dict[str, Any] = {"kind": kind}
        if isinstance(tensor, torch.Tensor):
            header.update(dtype=str(tensor.dtype).removeprefix("torch."), shape=list(tensor.shape))
        got = json.loads(send_bytes(json.dumps(header).encode() if is_src else b"", "header"))
        kind = got["kind"]
        if kind == "tensor" and not is_src:
            dtype = getattr(torch, got["dtype"], None)
            if not isinstance(dtype, torch.dtype):
                raise TypeError(f"broadcast: unknown dtype {got['dtype']!r} from rank {src}")
            fits = isinstance(tensor, torch.Tensor) and tensor.dtype == dtype and list(tensor.shape) == got["shape"]
            if not fits:
                tensor = torch.empty(got["shape"], dtype=dtype, device=ctx.backend.device())
    if kind == "tensor":
        target = cast(torch.Tensor, tensor)
        buf = _staged(ctx, target)
        send(buf, _describe(buf))
        return target if is_src else _fill(target, buf)
    if kind in ("str", "path"):
        text = send_bytes(str(tensor).encode() if is_src else b"", "str").decode()
        return text if kind == "str" else Path(text)
    words = _encode_number(cast(Number, tensor)) if is_src else [0, 0, 0]
    code, a, b = _read(ctx, send(torch.tensor(words, dtype=torch.int64, device=device), "number"), _tolist)
    return cast(float, _decode_number(code, a, b))
