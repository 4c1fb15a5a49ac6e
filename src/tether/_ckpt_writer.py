"""The periodic save's writer: a child process that writes a snapshot held in shared memory.

Why a process. ``torch.save`` holds the GIL while it writes and checksums each record,
so a writer *thread* slows the training thread it was meant to spare: measured here, a
Python loop ran at ~35% of its speed while a thread saved 100 MB, and the step time
with a save every 10 steps was 1.06-1.09x (``benchmarks/results/resume-steptime.md``
before this module). A process has a GIL of its own.

How. The training thread copies the state into one anonymous shared-memory file
(``memfd_create``) that both processes map: one pass over the state, the only part of a
save the step pays for (the pages stay mapped, save after save, so it costs what a
``memcpy`` costs). The tensors' places and the rest of the state (pickled, with each
tensor replaced by a ``_Slot``) go into the same file; a datagram on a ``SOCK_SEQPACKET``
pair says where, and carries the file's descriptor when a larger file replaces it. The
child rebuilds each tensor as a view of its own mapping, writes the checkpoint through
``_ckpt_files.save`` (the same code as an in-process save), and answers with one
datagram. It runs at nice 19, and dies with the training process (``PR_SET_PDEATHSIG``):
a rank killed mid-save leaves a ``.tmp-`` directory, never a writer.

The child is ``python -c`` importing this module, not ``multiprocessing``: a spawn or
forkserver child would run the user's ``__main__`` again, and torchrun scripts seldom
guard it. Linux only (memfd, pdeathsig); elsewhere the Checkpointer writes from a thread.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import mmap
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
import weakref
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("tether")

_ALIGN = 64
_DATAGRAM = 4096  # a control message: two ints, a step, a path
_FINISH = 60.0  # seconds a save in progress may take when the Writer goes (then the child is killed)


def available() -> bool:
    """Whether this platform has what the writer process needs (Linux: memfd, pdeathsig)."""
    return sys.platform.startswith("linux") and hasattr(os, "memfd_create") and hasattr(socket, "send_fds")


@dataclasses.dataclass(frozen=True)
class _Slot:
    """Where the snapshot's tensor number ``index`` lies in the shared file."""

    index: int


class Writer:
    """The training process's side: copy a state into shared memory, hand it to the child.

    When the Writer is collected, or at the interpreter's exit, the child finishes the
    save in progress (up to ``_FINISH`` seconds) and ends; a training process that dies
    takes it along at once.
    """

    def __init__(self) -> None:
        self._child = _Child()
        self._map: mmap.mmap | None = None
        self._bytes: torch.Tensor | None = None
        self._pending: int | None = None  # the step being written
        weakref.finalize(self, self._child.stop, _FINISH)

    def start(self) -> None:
        """Start the child now (it imports torch, ~1-2 s, while training goes on)."""
        if not self._child.running():
            self._child.spawn()

    def submit(self, state: dict[str, Any], found: dict[str, Any], dirname: Path, keep: int | None) -> None:
        """Snapshot ``state`` (on this thread) and have the child save it; call after ``wait``."""
        tensors: list[torch.Tensor] = []
        tree = _flatten(state, tensors)
        places, end = [], 0
        for t in tensors:
            places.append((end, t.dtype, tuple(t.shape)))
            end = -(-(end + t.numel() * t.element_size()) // _ALIGN) * _ALIGN
        payload = pickle.dumps({"tree": tree, "places": places, "found": found, "dirname": str(dirname), "keep": keep})
        self._fit(end + len(payload))
        assert self._map is not None and self._bytes is not None
        with torch.no_grad():
            for (offset, dtype, shape), t in zip(places, tensors, strict=True):
                _view(self._bytes, offset, dtype, shape).copy_(t)
        self._map[end : end + len(payload)] = payload
        self.start()
        self._child.send(pickle.dumps((end, len(payload))))
        self._pending = int(found["step"])

    def wait(self) -> None:
        """Wait for the save in progress; a failed one is logged (training goes on)."""
        if self._pending is None:
            return
        step, self._pending = self._pending, None
        reply = self._child.receive()
        if reply is None:
            code = self._child.stop(0.0)
            log.warning("tether: the checkpoint writer ended (exit %s) before it saved step %d", code, step)
            return
        kind, detail = pickle.loads(reply)
        if kind != "saved":
            log.warning("tether: the periodic checkpoint of step %d failed: %s", step, detail)

    def _fit(self, nbytes: int) -> None:
        """Make the shared file hold ``nbytes`` (a larger file replaces a small one)."""
        if self._map is not None and len(self._map) >= nbytes:
            return
        size = -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE
        fd = os.memfd_create("tether-checkpoint", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        self._bytes = torch.frombuffer(self._map, dtype=torch.uint8)
        self._child.share(fd)


class _Child:
    """The writer process, its socket, and the shared file it is to map (apart from the
    Writer, so that the Writer's finalizer can end it)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.sock: socket.socket | None = None
        self.fd = -1  # the shared file
        self.sent = False  # whether this child has been sent ``fd``

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self.sock is not None

    def spawn(self) -> None:
        self.stop(0.0)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        root = str(Path(__file__).resolve().parents[1])  # tether's own directory, whatever sys.path was
        code = f"import sys; sys.path.insert(0, {root!r}); from tether._ckpt_writer import main; main()"
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code, str(theirs.fileno()), str(os.getpid())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.sock, self.sent = ours, False

    def share(self, fd: int) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # a child keeps its mapping of the old file until it maps the new one
        self.fd, self.sent = fd, False

    def send(self, message: bytes) -> None:
        assert self.sock is not None
        if self.sent:
            self.sock.send(message)
        else:
            socket.send_fds(self.sock, [message], [self.fd])
            self.sent = True

    def receive(self) -> bytes | None:
        """The child's answer; None when it has ended."""
        if self.sock is None:
            return None
        try:
            return self.sock.recv(_DATAGRAM) or None
        except OSError:
            return None

    def stop(self, finish: float) -> int | None:
        """Close the socket (the child ends once its save is done), wait ``finish`` s, then kill it."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        code = None
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=finish)
            if self.proc.poll() is None:
                self.proc.kill()
            code = self.proc.wait()
            self.proc = None
        return code


def _flatten(value: Any, tensors: list[torch.Tensor]) -> Any:
    """``value`` with each dense tensor replaced by a ``_Slot`` (appended to ``tensors``)."""
    if isinstance(value, torch.Tensor) and value.layout == torch.strided and not value.is_quantized:
        tensors.append(value.detach())
        return _Slot(len(tensors) - 1)
    if isinstance(value, dict):
        out = copy.copy(value)  # the same mapping type, with its attributes (a module's ``_metadata``)
        for k, v in value.items():
            out[k] = _flatten(v, tensors)
        return out
    if isinstance(value, list):
        return [_flatten(v, tensors) for v in value]
    if type(value) is tuple:
        return tuple(_flatten(v, tensors) for v in value)
    return value  # pickled below, at this very moment


def _unflatten(value: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(value, _Slot):
        return tensors[value.index]
    if isinstance(value, dict):
        for k, v in value.items():
            value[k] = _unflatten(v, tensors)
        return value
    if isinstance(value, list):
        return [_unflatten(v, tensors) for v in value]
    if type(value) is tuple:
        return tuple(_unflatten(v, tensors) for v in value)
    return value


def _view(data: torch.Tensor, offset: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    nbytes = dtype.itemsize * torch.Size(shape).numel()
    return data[offset : offset + nbytes].view(dtype).view(shape)


def _on(shared: mmap.mmap, offset: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    count = torch.Size(shape).numel()
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(shared, dtype=dtype, count=count, offset=offset).view(shape)


# --- the child ------------------------------------------------------------------------------------


def main() -> None:
    """The writer process: save each snapshot it is sent, until the socket closes."""
    sock_fd, parent = int(sys.argv[1]), int(sys.argv[2])
    _die_with(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the training process, which ends this
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, 19)
    torch.set_num_threads(1)
    _serve(socket.socket(fileno=sock_fd))
    os._exit(0)  # nothing to tear down: every save is flushed and answered


def _serve(sock: socket.socket) -> None:
    from tether import _ckpt_files

    shared: mmap.mmap | None = None
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, _DATAGRAM, 1)
        except OSError:
            return
        if not message:
            return
        if fds:
            shared = mmap.mmap(fds[0], 0)
            os.close(fds[0])
        assert shared is not None
        end, length = pickle.loads(message)
        job = pickle.loads(shared[end : end + length])
        started = time.monotonic()
        try:
            # tensors on the mapping itself, each its own storage (torch.save writes a storage whole);
            # the parent writes the next snapshot into it only after this reply
            tensors = [_on(shared, *place) for place in job["places"]]
            state = _unflatten(job["tree"], tensors)
            path = _ckpt_files.save(state, Path(job["dirname"]), job["found"], job["keep"])
            reply: tuple[str, str] = ("saved", f"{path} in {time.monotonic() - started:.2f} s")
        except Exception as exc:  # a full disk: the next save tries again
            reply = ("failed", f"{type(exc).__name__}: {exc}")
        try:
            sock.send(pickle.dumps(reply))
        except OSError:
            return


def _die_with(parent: int) -> None:
    """SIGKILL this process when the training process ends (Linux), and check it has not already."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(0)
