"""The one process-wide context: backend, channel, watchdog and sync state.

``launch`` sets it, ``finalize`` clears it, and every getter only reads it. Without a
context the process is serial: every getter answers for one process and every
collective returns its input. A process group created by the user with
``torch.distributed.init_process_group`` is adopted once, on first use (ignite does the
same through ``idist.sync()``).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import torch.distributed as dist

from .backends import Backend
from .channel import Channel
from .watchdog import Watchdog


@dataclasses.dataclass(frozen=True)
class SyncSettings:
    """How tether waits, in seconds.

    Args:
        timeout: default ``timeout`` of every sync when its call gives none (None: wait
            as long as it takes, with a stall report every ``warn_after``).
        warn_after: a wait without timeout logs a stall report once after this long.
        answer_within: how long a whereabouts query waits for answers.
        check_after: a collective still waiting after this long checks, on the store,
            that every rank entered the same call (the mismatch check's slow path).
    """

    timeout: float | None = None
    warn_after: float = 300.0
    answer_within: float = 1.0
    check_after: float = 0.2


@dataclasses.dataclass
class Context:
    """Everything tether knows about this process's job."""

    backend: Backend
    channel: Channel | None = None
    watchdog: Watchdog | None = None
    store: dist.Store | None = None  # the main thread's own connection to the job's store
    settings: SyncSettings = SyncSettings()
    hosts_store: bool = False  # wait for every rank to leave before closing the store
    error_file: str | None = None  # torchelastic's error file for this worker
    seqs: dict[str, int] = dataclasses.field(default_factory=dict)
    groups: dict[tuple[int, ...], Any] = dataclasses.field(default_factory=dict)  # list -> ProcessGroup
    hooks: Any = None  # hooks.Hooks, installed while this context is
    posted: list[BaseException] = dataclasses.field(default_factory=list)  # own failures already posted
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def next_seq(self, group: str) -> int:
        """The number of this process's next sync on ``group`` (same on every member)."""
        with self.lock:
            seq = self.seqs.get(group, 0) + 1
            self.seqs[group] = seq
        return seq

    def first_report(self, exc: BaseException) -> bool:
        """True the first time ``exc`` is reported on this rank (each is posted once)."""
        with self.lock:
            if any(e is exc for e in self.posted):
                return False
            self.posted.append(exc)
            return True

    @property
    def failed(self) -> bool:
        """This rank failed, or knows that another did."""
        return bool(self.posted) or (self.watchdog is not None and self.watchdog.failure is not None)

    def check(self) -> None:
        """Raise the failure this rank already knows of, if any."""
        if self.watchdog is not None:
            self.watchdog.check()


_SERIAL = Context(Backend())
_current: Context | None = None
local_rank_hint: int | None = None  # set_local_rank(), for a process group made outside tether


def current() -> Context:
    """The process's context; adopts a process group the user created, once."""
    if _current is not None:
        return _current
    if dist.is_available() and dist.is_initialized():
        from .launch import adopt_process_group

        return adopt_process_group()
    return _SERIAL


def install(context: Context) -> None:
    global _current
    if _current is not None:
        raise RuntimeError("tether is already initialized in this process; call tether.finalize() first")
    _current = context


def uninstall() -> Context | None:
    global _current
    context, _current = _current, None
    return context


def peek() -> Context | None:
    """The installed context, without adopting anything."""
    return _current
