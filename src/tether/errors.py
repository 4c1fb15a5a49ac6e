"""Every exception tether raises, and the one exit-code table.

Hierarchy, split by who is at fault::

    RuntimeError
     └── TetherError                 anything tether raises about the job's state
          ├── PeerFailure            another rank failed; carries its original failure
          │    ├── PeerLost          ...and left no record: killed, frozen, or its host vanished
          │    └── PeerFinished      ...by finishing: it returned (or exited 0) while this rank
          │                          still waited for it in a sync
          ├── SyncTimeout            (also TimeoutError) a sync's timeout expired; names who was missing
          ├── SyncMismatch           ranks entered different syncs; names each rank's call
          ├── BackendError           the backend (gloo, nccl) failed and no peer's record explains it
          └── JobFailed              raised by a launcher (``tether.spawn``) when any worker failed

    ValueError / TypeError           misuse: bad arguments, raised identically on every rank,
                                     before any collective (see ``tether._checks``)

Why ``TetherError`` is a ``RuntimeError`` and not a ``BaseException``: before tether, the
same failures surfaced from torch.distributed as ``RuntimeError`` ("Connection closed by
peer"), so code that already handles them keeps doing so. A caller that swallows a
``PeerFailure`` with ``except Exception`` does not break the promise: the failure stays
recorded, every later tether call raises it again at once, and the watchdog ends the
process after its grace period if the rank keeps running (see ``_core/watchdog.py``).

The rank whose code raised is never handed a tether exception for its own failure: its
original exception propagates unchanged, and only the *other* ranks see ``PeerFailure``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._core.record import FailureRecord

__all__ = [
    "BackendError",
    "ExitCode",
    "JobFailed",
    "PeerFailure",
    "PeerFinished",
    "PeerLost",
    "SyncMismatch",
    "SyncTimeout",
    "TetherError",
]


class ExitCode(enum.IntEnum):
    """Exit status of a process that tether ends (``tether.spawn`` workers, the watchdog).

    ======================  ====  ===========================================================
    name                    code  meaning
    ======================  ====  ===========================================================
    OK                      0     the function returned
    RAISED                  1     this rank raised its own exception (it is the root cause
                                  or an independent failure)
    PEER_FAILED             3     this rank stopped because another rank failed or was lost
    TIMEOUT                 4     a sync timed out (``SyncTimeout``)
    MISMATCH                5     ranks entered different syncs (``SyncMismatch``)
    WATCHDOG                6     a peer failed while this rank's main thread was stuck
                                  outside tether (a raw collective, user code) and did not
                                  return within the grace period; the watchdog ended it
    LAUNCH_FAILED           7     ``tether.spawn`` itself: one or more workers failed
    128 + N                       killed by signal N (as the shell reports it)
    ======================  ====  ===========================================================
    """

    OK = 0
    RAISED = 1
    PEER_FAILED = 3
    TIMEOUT = 4
    MISMATCH = 5
    WATCHDOG = 6
    LAUNCH_FAILED = 7


class TetherError(RuntimeError):
    """Base of every error tether raises about the state of the job."""

    exit_code: ExitCode = ExitCode.PEER_FAILED


class PeerFailure(TetherError):
    """Another rank failed; this rank stopped waiting for it.

    ``str()`` starts with ``rank R failed: ExcType: message``. The attributes describe the
    original failure on the failing rank; ``traceback`` is its formatted traceback text.

    Attributes:
        rank: the failing rank.
        host: its hostname.
        pid: its process id.
        exc_type: the name of its exception type (``"ValueError"``), or of the way it died
            (``"Signal"``, ``"SystemExit"``, ``"Lost"``).
        message: the exception's message.
        traceback: the formatted traceback on the failing rank ("" when it left none).
        where: the tether call the failing rank was in, or ``"user code"``.
        record: the full record as it travelled.
    """

    def __init__(self, record: FailureRecord) -> None:
        self.record = record
        self.rank = record.rank
        self.host = record.host
        self.pid = record.pid
        self.exc_type = record.exc_type
        self.message = record.message
        self.traceback = record.traceback
        self.where = record.where
        where = f" (in {record.where}" + (f", at {record.frame}" if record.frame else "") + ")"
        super().__init__(record.headline + (where if record.where else ""))

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.record,))


class PeerLost(PeerFailure):
    """Another rank died or went silent without telling why (signal, heartbeat, host lost)."""


class PeerFinished(PeerFailure):
    """Another rank finished while this rank still waited for it in a sync or collective.

    It returned from the function, called ``sys.exit(0)`` or ``finalize()``, or its script
    ended, before it reached the sync this rank waits in: the sync can never complete. The
    usual cause is uneven data (one rank has fewer batches); see the migration guide and
    ``torch.distributed.algorithms.Join``. ``str()`` reads, e.g., ``rank 1 failed:
    Finished: it returned from the function while rank 0 waits in barrier #3``.
    """


class SyncTimeout(TetherError, TimeoutError):
    """A sync waited longer than its ``timeout``.

    Raised on every rank of the sync. Names the ranks that had not arrived and what each
    was doing when the timeout expired. A rank that had not arrived because it waits in
    another call (a raw ``dist.all_reduce`` on a subgroup, say) waits for someone too: it
    is named apart, and the root cause is a rank that was not inside any call. A rank can
    also arrive after the timeout expired but before the verdict asked where everyone
    was: then every rank is in the call, and the last to arrive is named as ``late``.

    Attributes:
        call: the sync that timed out (``"barrier"``, ``"one_rank_first(rank=0)"``).
        timeout: the timeout in seconds.
        missing: the ranks that had not arrived.
        whereabouts: rank -> what that rank was doing (its tether call and Python stack).
        waiting: the ranks of ``missing`` that were waiting in another call.
        late: the rank that arrived last, after the timeout (when no rank was missing).
        stalled: the ranks that stalled: ``missing`` less ``waiting``, and ``late``.
    """

    exit_code = ExitCode.TIMEOUT

    def __init__(
        self,
        call: str,
        timeout: float,
        missing: Sequence[int],
        whereabouts: Mapping[int, str],
        record: FailureRecord | None = None,
        waiting: Sequence[int] = (),
        late: Sequence[int] = (),
    ) -> None:
        self.call = call
        self.timeout = timeout
        self.missing = list(missing)
        self.whereabouts = dict(whereabouts)
        self.record = record
        self.waiting = [r for r in self.missing if r in waiting]
        self.late = [r for r in late if r not in self.missing]
        self.stalled = [r for r in self.missing if r not in waiting] + self.late
        if not self.missing and self.late:
            head = f"{call} timed out after {timeout:g} s: rank(s) {self.late} arrived only after it expired"
        elif not self.missing:
            head = f"{call} timed out after {timeout:g} s, although every rank was in it"
        else:
            head = f"{call} timed out after {timeout:g} s: rank(s) {self.stalled} did not arrive"
        if self.waiting:
            head += f" (nor did rank(s) {self.waiting}, waiting in other calls)"
        lines = [head]
        for rank in sorted(self.whereabouts):
            lines.append(f"  rank {rank}: {self.whereabouts[rank]}")
        super().__init__("\n".join(lines))

    def __reduce__(self) -> tuple[object, ...]:
        args = (self.call, self.timeout, self.missing, self.whereabouts, self.record, self.waiting, self.late)
        return (type(self), args)


class SyncMismatch(TetherError):
    """Ranks entered different syncs at the same point (barrier vs all_reduce, other targets).

    Attributes:
        calls: rank -> the sync call that rank entered.
    """

    exit_code = ExitCode.MISMATCH

    def __init__(self, calls: Mapping[int, str], record: FailureRecord | None = None) -> None:
        self.calls = dict(calls)
        self.record = record
        body = "; ".join(f"rank {r}: {c}" for r, c in sorted(self.calls.items()))
        super().__init__(f"ranks entered different syncs: {body}")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.calls, self.record))


class BackendError(TetherError):
    """The communication backend failed and no rank posted a failure that explains it."""


class JobFailed(TetherError):
    """A job launched by ``tether.spawn`` failed; raised in the launching process.

    Attributes:
        record: the root cause, as posted on the channel (None if no rank posted one).
        exit_codes: local rank -> exit code of each worker this launcher started.
        report: the root-cause report, as printed.
        cause: the report's one-line cause: ``record``'s headline, or ``"every rank raised
            ValueError: ..."`` when every rank failed alike (then ``record`` is just the
            first of them).
    """

    exit_code = ExitCode.LAUNCH_FAILED

    def __init__(
        self,
        record: FailureRecord | None,
        exit_codes: Mapping[int, int | None],
        report: str,
        cause: str | None = None,
    ) -> None:
        self.record = record
        self.exit_codes = dict(exit_codes)
        self.report = report
        if cause is None:
            cause = record.headline if record is not None else f"worker exit codes {self.exit_codes}"
        self.cause = cause
        super().__init__(f"job failed: {cause}")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.record, self.exit_codes, self.report, self.cause))
