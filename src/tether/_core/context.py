"""The one process-wide context: backend, channel, watchdog and sync state.

``runtime`` installs it and ``ending`` retires it; every getter only reads it. A context is bound to
the default process group it serves (``pg``): when that group is destroyed or replaced,
``runtime.current`` notices (an identity comparison, no communication) and retires the
context before anything else uses it. Without a context the process is serial: every
getter answers for one process and every collective returns its input.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
from torch._C._distributed_c10d import Store

from ..backends import Backend
from .channel import Channel
from .futures import FINISHED_KEY
from .group import Group
from .record import FailureRecord, error_from_record, record_from_exception
from .threadstates import Keeper
from .watchdog import Watchdog


@dataclasses.dataclass(frozen=True)
class SyncSettings:
    """How tether waits, in seconds.

    Args:
        timeout: default ``timeout`` of every sync when its call gives none (None: wait
            as long as it takes, with a stall report every ``warn_after``).
        warn_after: a wait without timeout logs a stall report once after this long.
        answer_within: how long a whereabouts query waits for answers (for a report or a
            timeout's verdict; one that decides a loss waits the watchdog's ``lost_after``).
        check_after: a collective still waiting after this long checks, on the store,
            that every rank entered the same call (the mismatch check's slow path).
        check_collectives: before each collective, every rank learns what every other
            passed (one all_gather of a 4 KiB frame, which carries a call of up to 4 KiB
            a rank itself): different shapes, dtypes or kinds raise ``SyncMismatch`` on
            every rank instead of corrupting data. Off by default: it costs an all_gather
            per collective (``benchmarks/results/sync.md``).
    """

    timeout: float | None = None
    warn_after: float = 300.0
    answer_within: float = 1.0
    check_after: float = 0.2
    check_collectives: bool = False


@dataclasses.dataclass
class Context:
    """Everything tether knows about this process's job."""

    backend: Backend
    channel: Channel | None = None
    watchdog: Watchdog | None = None
    store: Store | None = None  # the main thread's own connection to the job's store
    # torch's default store's keys on ``store``'s connection, where the default group is on the
    # job's store: a wake of a wait on the default store needs no connection of its own (storewaits)
    default_store_twin: Store | None = None
    settings: SyncSettings = dataclasses.field(default_factory=SyncSettings)
    hosts_store: bool = False  # wait for every rank to leave before closing the store
    error_file: str | None = None  # torchelastic's error file for this worker
    pg: Any = None  # the default ProcessGroup this context serves (None: serial)
    owns_group: bool = False  # created by tether (initialize, spawn), not adopted
    keep_alive: Any = None  # objects whose lifetime is the context's (a channel's own TCPStore)
    seqs: dict[str, int] = dataclasses.field(default_factory=dict)
    last_gate: dict[str, int] = dataclasses.field(default_factory=dict)  # group -> seq of its last store gate
    groups: dict[tuple[int, ...], Any] = dataclasses.field(default_factory=dict)  # list -> ProcessGroup
    world: Group | None = None  # every rank, made on first use (``groups.world``)
    hooks: Any = None  # hooks.Hooks, installed while this context is
    posted: list[tuple[BaseException, FailureRecord]] = dataclasses.field(default_factory=list)  # own failures
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    leaving: str = "called finalize()"  # how this rank finishes, for a peer still waiting for it
    left: bool = False  # its clean exit is recorded (``ending._main_thread_ended``: before the exit functions)
    # called with the failure this rank ends on, once posted (``failures.report_failure``):
    # a Checkpointer's emergency save, for a failure that came between its steps
    on_failure: list[Callable[[BaseException], None]] = dataclasses.field(default_factory=list)
    stop_was_own: bool = False  # a SIGTERM's cause was asked for: none but this rank (``verdicts``)
    wrote_own_error: bool = False  # tether wrote the error file for this rank's own failure, or for its blame
    keeper: Keeper = dataclasses.field(default_factory=Keeper)  # gloo threads' Python states (threadstates.py)
    # (group, signature) of collectives whose last run outlived gloo's 5 ms timed wait: the
    # next skips it (``waits.run_work``)
    outlived: set[tuple[str, str]] = dataclasses.field(default_factory=set)

    def next_seq(self, group: str) -> int:
        """The number of this process's next sync on ``group`` (same on every member)."""
        with self.lock:
            seq = self.seqs.get(group, 0) + 1
            self.seqs[group] = seq
        return seq

    def post_own(self, exc: BaseException, where: str) -> FailureRecord | None:
        """Post this rank's own failure ``exc`` once; repeats return the same record."""
        with self.lock:
            for seen, record in self.posted:
                if seen is exc:
                    return record
        if self.channel is None:
            return None
        record = record_from_exception(self.channel.rank, exc, where)
        if self.watchdog is not None and self.watchdog.failables.finished:  # see _core/futures.py
            detail = {**record.detail, FINISHED_KEY: self.watchdog.failables.finished}
            record = dataclasses.replace(record, detail=detail)
        record = self.channel.post(record)
        self.channel.mark_done("failed")  # its process may end now: that is no loss
        with self.lock:
            self.posted.append((exc, record))
        return record

    @property
    def failed(self) -> bool:
        """This rank failed, or knows that another did."""
        return bool(self.posted) or (self.watchdog is not None and self.watchdog.failure is not None)

    def check(self) -> None:
        """Raise the failure this rank already knows of, if any.

        That includes this rank's own failure once it was posted and its caller caught it
        (``one_rank_first``'s block raised, the caller handled it and went on): every other
        rank was told to stop, so no later sync can complete. The rank raises that failure
        (as ``PeerFailure`` naming itself) at once, instead of waiting on ranks that will
        never come.
        """
        if self.watchdog is None:
            return
        if self.watchdog.failure is None and self.posted:
            self.watchdog.deliver(error_from_record(self.posted[0][1]), None)
        self.watchdog.check()


_current: Context | None = None
local_rank_hint: int | None = None  # set_local_rank(), for a process group made outside tether
_abandoned: object = None  # a group tether left undestroyed after a failure: never adopt it


def install(context: Context) -> None:
    global _current
    if _current is not None:
        raise RuntimeError("tether is already initialized in this process; call tether.finalize() first")
    _current = context


def uninstall() -> Context | None:
    global _current
    context, _current = _current, None
    return context


def abandon_process_group() -> None:
    """Remember that the live default group was left behind after a failure."""
    global _abandoned
    _abandoned = dist.group.WORLD if dist.is_available() and dist.is_initialized() else None


def abandoned() -> object:
    return _abandoned


def peek() -> Context | None:
    """The installed context, without adopting anything."""
    return _current


def set_local_rank_hint(index: int) -> None:
    global local_rank_hint
    local_rank_hint = index
