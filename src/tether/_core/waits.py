"""Every wait lives here: store syncs, waits on collectives, and their failure paths.

**Store syncs** (``barrier``, ``one_rank_first``, ``one_rank_only(with_barrier=True)``) run
on the job's store, not as collectives: measured in ``benchmarks/sync.py``, a store gate
costs two round trips per rank and beats ``dist.barrier`` on gloo. A gate on key
``P/sync/<group>/<seq>``:

* every member adds ``1 + (h << 20)`` to ``.../n``, where ``h`` is a 22-bit hash of the
  call's signature (``"barrier"``, ``"one_rank_first(rank=0)"``). The low 20 bits count
  arrivals, the high bits sum hashes: a member whose sum is not ``count * h`` has met a
  rank in a different call and raises ``SyncMismatch``. No extra round trip.
* the member that completes the gate (the last arrival, or the working rank of
  ``one_rank_first``) writes ``.../go`` = ``"ok"``; a working rank that raised writes
  ``"failed:<seq of its record>"`` instead, in ``finally``, *without* arriving (so no
  last arrival can release the gate before it); the watchdog writes
  ``"abort"`` to wake a waiter when any other failure is posted. All three use
  ``compare_set``, so the first value written is the one every member reads.
* every other member reads ``.../go`` (``get`` waits for it) and returns, or raises.

Costs per call and rank: 2 store round trips (the completer: add + compare_set, then it
deletes the previous gate's two keys, after the others are released).

**Collectives** are issued with ``async_op=True`` and waited on with a ``threading.Event``
that both the work's completion callback and the watchdog can set, so a failure posted
anywhere wakes the caller within a millisecond; gloo cannot be woken any other way.
A collective still waiting after ``check_after`` seconds adds its signature to the same
gate counter, so a rank in a different sync is found (the slow path; free when fast).

**Timeouts**: on expiry the rank asks every member what it is doing (its tether call and
stack, answered by its listener), posts a timeout record naming the ranks that had not
arrived, and raises ``SyncTimeout``; the record makes every member raise the same.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import socket
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from ..errors import BackendError, PeerLost, SyncMismatch, SyncTimeout, TetherError
from .context import Context
from .hooks import SignalStop
from .record import KIND_MISMATCH, KIND_TIMEOUT, FailureRecord, error_from_record, lost_record
from .watchdog import ABORT, EXPIRED

log = logging.getLogger("tether")

_COUNT_BITS = 20
_COUNT_MASK = (1 << _COUNT_BITS) - 1
_HASH_MASK = (1 << 22) - 1


@dataclass(frozen=True)
class Group:
    """The members of one sync: ``key`` names its sequence of syncs on the store."""

    key: str
    members: tuple[int, ...]
    pg: Any = None  # the torch ProcessGroup for collectives; None is the default group


def signature_hash(signature: str) -> int:
    return zlib.crc32(signature.encode()) & _HASH_MASK


@contextmanager
def in_call(ctx: Context, call: str) -> Iterator[None]:
    """Mark what this rank is doing, for whereabouts answers; checks for a known failure.

    Raises:
        RuntimeError: called from a thread other than the main thread (see ``check_thread``).
    """
    check_thread(call)
    ctx.check()
    watchdog = ctx.watchdog
    if watchdog is None:
        yield
        return
    previous, watchdog.current_call = watchdog.current_call, call
    try:
        yield
    except SignalStop as stop:
        # a launcher's SIGTERM while this rank waits: usually because a peer died
        behind = failure_behind_stop(ctx)
        if behind is None:
            raise
        raise watchdog.taken(behind) from stop
    finally:
        watchdog.current_call = previous


def check_thread(call: str) -> None:
    """tether's syncs run on the main thread only; elsewhere they raise at once.

    The watchdog wakes one waiting thread per rank (the main thread: signals, the
    ladder and whereabouts answers are about it), and the main thread's store connection
    serialises its calls; a sync from another thread could neither be woken nor be told
    apart. Raising at once, on every rank that does it, is the honest answer.
    """
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            f"tether: {call.split(' [', 1)[0]} was called from thread "
            f"{threading.current_thread().name!r}; tether's syncs and collectives run on the main thread only"
        )


def _tag(group: Group, seq: int) -> str:
    return f"[sync #{seq} on {group.key}]"


# --- store gates ------------------------------------------------------------------------


def gate(
    ctx: Context,
    group: Group,
    signature: str,
    role: str,
    *,
    failed: BaseException | None = None,
    timeout: float | None = None,
) -> None:
    """One store gate; see the module docstring.

    Args:
        role: "member" (a barrier: the last arrival writes ``go``, every member waits),
            "waiter" (waits for the leader's ``go``; never writes it) or "leader"
            (writes ``go`` and does not wait).
        failed: this member's own exception: it is posted, ``go`` becomes "failed", and
            the caller re-raises it.
        timeout: seconds before ``SyncTimeout``; None uses the context's default.
    """
    assert ctx.store is not None and ctx.channel is not None and ctx.watchdog is not None
    seq = ctx.next_seq(group.key)
    call = f"{signature} {_tag(group, seq)}"
    base = ctx.channel.key("sync", group.key, seq)
    h = signature_hash(signature)
    if failed is not None:
        # Write "failed" before arriving, never after: once counted, this member could
        # complete the gate for the others, and a last arrival could write "ok" first.
        # It never arrives at all: the gate cannot complete without it.
        status = ABORT  # a consequence of a failure already posted: point at that one
        record = None if isinstance(failed, TetherError) else ctx.post_own(failed, call)
        if record is not None:
            status = f"failed:{record.seq}"
        with contextlib.suppress(dist.DistNetworkError):  # store gone: the caller re-raises its own
            ctx.store.compare_set(base + "/go", "", status)
        return
    with in_call(ctx, call):
        try:
            value = int(ctx.store.add(base + "/n", 1 + (h << _COUNT_BITS)))
        except dist.DistNetworkError as exc:
            raise ctx.watchdog.taken(ctx.watchdog.store_lost(exc)) from exc
        count = value & _COUNT_MASK
        if value >> _COUNT_BITS != count * h:
            raise ctx.watchdog.taken(_mismatch(ctx, group, signature))
        if role == "leader" or (role == "member" and count == len(group.members)):
            status = ctx.store.compare_set(base + "/go", "", "ok").decode()
        else:
            status = wait_key(ctx, base + "/go", group, seq, signature, timeout)
        if status != "ok":
            raise ctx.watchdog.taken(_status_error(ctx, status))
        previous = ctx.last_gate.get(group.key)
        ctx.last_gate[group.key] = seq
        if count == len(group.members) and previous is not None:
            _forget(ctx, group, previous)


def _forget(ctx: Context, group: Group, seq: int) -> None:
    """Delete the keys of gate ``seq``, so a job's store does not grow with every sync.

    Called by the rank that saw every member arrive at the next gate of the same group
    (collectives in between take sequence numbers too): each member has then finished
    gate ``seq``. The two deletions follow the release of the others.
    """
    assert ctx.store is not None and ctx.channel is not None
    for suffix in ("n", "go"):
        ctx.store.delete_key(ctx.channel.key("sync", group.key, seq, suffix))


def _status_error(ctx: Context, status: str) -> TetherError:
    assert ctx.channel is not None and ctx.watchdog is not None
    if ctx.watchdog.failure is not None:  # the listener was first
        return ctx.watchdog.failure
    if status.startswith("failed:"):
        record = ctx.channel.record(int(status.split(":", 1)[1]))
        if record is not None:
            error = error_from_record(record)
            ctx.watchdog.deliver(error, None)
            return ctx.watchdog.failure or error
    failure = ctx.watchdog.failure or ctx.watchdog.wait_for_failure(1.0)
    return failure or BackendError(f"sync ended with status {status!r} and no failure record")


def wait_key(ctx: Context, key: str, group: Group, seq: int, signature: str, timeout: float | None) -> str:
    """Wait on the main connection for ``key``; the watchdog can wake it by writing it.

    The ``get`` itself has no timeout (a timed-out c10d wait logs a warning): the keeper
    thread writes ``EXPIRED`` at ``timeout``, ``ABORT`` on a failure or a signal, and
    reports a stall at ``warn_after`` without waking this thread.
    """
    assert ctx.store is not None and ctx.watchdog is not None
    timeout = ctx.settings.timeout if timeout is None else timeout
    start = time.monotonic()
    ctx.watchdog.begin_wait(
        key=key,
        deadline=None if timeout is None else start + timeout,
        stall_at=start + ctx.settings.warn_after,
        on_stall=lambda: _warn_stall(ctx, group, seq, signature, time.monotonic() - start),
    )
    try:
        try:
            status = ctx.store.get(key).decode()
        except dist.DistNetworkError as exc:
            raise ctx.watchdog.taken(ctx.watchdog.store_lost(exc)) from exc
        if status == EXPIRED and timeout is not None:
            raise ctx.watchdog.taken(_expire(ctx, group, seq, signature, timeout))
        if status == ABORT:
            ctx.watchdog.check()
        return str(status)
    finally:
        ctx.watchdog.end_wait()


# --- collectives ------------------------------------------------------------------------


def wait_work(ctx: Context, work: Any, group: Group, signature: str, timeout: float | None) -> None:
    """Wait for an async collective; return when it is done, raise when a failure is known."""
    assert ctx.watchdog is not None
    seq = ctx.next_seq(group.key)
    with in_call(ctx, f"{signature} {_tag(group, seq)}"):
        if not _fast_wait(ctx, work):
            done = threading.Event()
            work.get_future().add_done_callback(lambda _: done.set())
            _wait_event(ctx, done, group, seq, signature, timeout)
        try:
            work.wait()
        except RuntimeError as exc:
            if isinstance(exc, TetherError):
                raise
            raise ctx.watchdog.taken(_explain_backend_error(ctx, group, exc)) from exc


_FAST = datetime.timedelta(milliseconds=5)


def _fast_wait(ctx: Context, work: Any) -> bool:
    """Wait up to 5 ms inside the backend (gloo); True when the work is done (or failed).

    Most collectives finish within this slice, and a wait inside C++ wakes without the
    two GIL hand-offs of a completion callback (measured: the callback path alone cost
    1.2-1.8x of a raw 1 KiB all_reduce on this 2-core machine). A failure posted during
    the slice is noticed when it ends, so it adds at most 5 ms to the notice time.
    """
    if work.is_completed():
        return True
    if ctx.backend.backend() != "gloo":  # NCCL: a timed wait blocks the CPU and can trip its watchdog
        return False
    with contextlib.suppress(RuntimeError):  # "Operation timed out!" leaves the work valid
        work.wait(timeout=_FAST)
    return bool(work.is_completed())


def _wait_event(
    ctx: Context, done: threading.Event, group: Group, seq: int, signature: str, timeout: float | None
) -> None:
    assert ctx.watchdog is not None
    timeout = ctx.settings.timeout if timeout is None else timeout
    start = time.monotonic()
    checked = warned = False
    added = 0
    ctx.watchdog.begin_wait(event=done)
    try:
        while True:
            elapsed = time.monotonic() - start
            marks = [ctx.settings.warn_after if not warned else None, timeout]
            marks.append(ctx.settings.check_after if not checked else None)
            nxt = min((m for m in marks if m is not None and m > elapsed), default=elapsed + 60.0)
            if done.wait(nxt - elapsed):
                ctx.watchdog.check()
                return
            elapsed = time.monotonic() - start
            if not checked and elapsed >= ctx.settings.check_after:
                checked = True
                added = _check_signature(ctx, group, seq, signature)
            if timeout is not None and elapsed >= timeout:
                raise ctx.watchdog.taken(_expire(ctx, group, seq, signature, timeout))
            if not warned and elapsed >= ctx.settings.warn_after:
                warned = True
                _warn_stall(ctx, group, seq, signature, elapsed)
    finally:
        ctx.watchdog.end_wait()
        if added:
            _uncheck(ctx, group, seq, added)


def _check_signature(ctx: Context, group: Group, seq: int, signature: str) -> int:
    """The mismatch check's slow path: add this call's signature to the sync's counter.

    Returns what was added, for ``_uncheck`` to take back once the collective is done, so
    that the counter's key is deleted by whichever member brings it back to zero.
    """
    assert ctx.store is not None and ctx.channel is not None
    assert ctx.watchdog is not None
    h = signature_hash(signature)
    amount = 1 + (h << _COUNT_BITS)
    try:
        value = int(ctx.store.add(ctx.channel.key("sync", group.key, seq, "n"), amount))
    except dist.DistNetworkError as exc:
        raise ctx.watchdog.taken(ctx.watchdog.store_lost(exc)) from exc
    if value >> _COUNT_BITS != (value & _COUNT_MASK) * h:
        raise ctx.watchdog.taken(_mismatch(ctx, group, signature))
    return amount


def _uncheck(ctx: Context, group: Group, seq: int, amount: int) -> None:
    assert ctx.store is not None and ctx.channel is not None
    key = ctx.channel.key("sync", group.key, seq, "n")
    with contextlib.suppress(dist.DistError):
        if int(ctx.store.add(key, -amount)) == 0:
            ctx.store.delete_key(key)


# --- failure paths --------------------------------------------------------------------


def _first_line(where: str) -> str:
    return where.splitlines()[0].removeprefix("in ") if where else "?"


def post_and_pick(ctx: Context, record: FailureRecord, own: TetherError) -> TetherError:
    """Post ``record``; return ``own`` if it is the root cause, else the root cause's error."""
    assert ctx.channel is not None and ctx.watchdog is not None
    posted = ctx.channel.post(record)
    root = ctx.channel.root_cause()
    error = own if root is None or root.seq == posted.seq else error_from_record(root)
    ctx.watchdog.deliver(error, None)
    return ctx.watchdog.failure or error


def _expire(ctx: Context, group: Group, seq: int, signature: str, timeout: float) -> TetherError:
    assert ctx.channel is not None and ctx.watchdog is not None and ctx.store is not None
    if ctx.watchdog.failure is not None:
        return ctx.watchdog.failure
    # Only the first member to expire asks the others where they are (one query, not N):
    # the rest take the record it posts.
    if int(ctx.store.add(ctx.channel.key("sync", group.key, seq, "expired"), 1)) > 1:
        failure = ctx.watchdog.wait_for_failure(ctx.settings.answer_within + 2.0)
        if failure is not None:
            return failure
    me = ctx.channel.rank
    answers = ctx.channel.ask_whereabouts(group.members, ctx.settings.answer_within)
    tag = _tag(group, seq)
    missing = [r for r in group.members if r != me and tag not in answers.get(r, "").split("\n", 1)[0]]
    where = {r: answers.get(r, "no answer: frozen, dead, or holding the GIL") for r in missing}
    call = f"{signature} on {group.key}"
    own = SyncTimeout(call, timeout, missing, where)
    record = FailureRecord(
        rank=me,
        kind=KIND_TIMEOUT,
        exc_type="SyncTimeout",
        message=str(own).splitlines()[0],
        where=f"{signature} {tag}",
        time=time.time(),
        host=socket.gethostname(),
        pid=os.getpid(),
        reporter=me,
        detail={"call": call, "timeout": timeout, "missing": missing, "whereabouts": where},
    )
    own.record = record
    return post_and_pick(ctx, record, own)


def _mismatch(ctx: Context, group: Group, signature: str) -> TetherError:
    assert ctx.channel is not None and ctx.watchdog is not None
    if ctx.watchdog.failure is not None:
        return ctx.watchdog.failure
    me = ctx.channel.rank
    answers = ctx.channel.ask_whereabouts(group.members, ctx.settings.answer_within)
    calls = {r: _first_line(answers[r]) if r in answers else "no answer" for r in group.members if r != me}
    calls[me] = signature
    own = SyncMismatch(calls)
    record = FailureRecord(
        rank=me,
        kind=KIND_MISMATCH,
        exc_type="SyncMismatch",
        message=str(own),
        where=signature,
        time=time.time(),
        host=socket.gethostname(),
        pid=os.getpid(),
        reporter=me,
        detail={"calls": {str(k): v for k, v in calls.items()}},
    )
    own.record = record
    return post_and_pick(ctx, record, own)


def _warn_stall(ctx: Context, group: Group, seq: int, signature: str, elapsed: float) -> None:
    assert ctx.channel is not None
    answers = ctx.channel.ask_whereabouts(group.members, ctx.settings.answer_within)
    lines = [f"tether: rank {ctx.channel.rank} has waited {elapsed:.0f} s in {signature} on {group.key}:"]
    for r in group.members:
        if r != ctx.channel.rank:
            lines.append(f"  rank {r}: {answers.get(r, 'no answer: frozen, dead, or holding the GIL')}")
    log.warning("\n".join(lines))


def _explain_backend_error(ctx: Context, group: Group, exc: RuntimeError) -> TetherError:
    """Turn a backend error ("Connection closed by peer") into the failure behind it.

    A peer that raised has posted its record before its process ended, so it is usually
    here already. A peer that was killed has not: the ranks that do not answer a
    whereabouts query within ``answer_within`` are posted as lost.
    """
    assert ctx.watchdog is not None and ctx.channel is not None
    failure = ctx.watchdog.wait_for_failure(0.2)
    if failure is not None:
        return failure
    try:
        answers = ctx.channel.ask_whereabouts(group.members, ctx.settings.answer_within)
    except dist.DistNetworkError as lost:
        return ctx.watchdog.store_lost(lost)
    if ctx.watchdog.failure is not None:
        return ctx.watchdog.failure
    silent = [r for r in group.members if r != ctx.channel.rank and r not in answers]
    if not silent:
        return BackendError(f"{type(exc).__name__}: {exc}")
    record = lost_record(
        silent[0], f"its process stopped answering (the backend said: {str(exc).splitlines()[0]})", ctx.channel.rank
    )
    return post_and_pick(ctx, record, PeerLost(record))


def failure_behind_stop(ctx: Context) -> TetherError | None:
    """The peer failure that explains a SIGTERM, or None when the stop is this rank's own.

    torchrun's agent SIGTERMs every other worker 0.1 s after one worker's process ended.
    A judge's sweep of this host's ranks (from /proc, milliseconds) finds a rank that
    died without a word; for ranks on other hosts a whereabouts query does: a rank that
    neither answers within ``answer_within`` nor left cleanly is posted as lost. Runs on
    the main thread after the signal's exception left the handler, never inside it.
    """
    watchdog, channel = ctx.watchdog, ctx.channel
    if watchdog is None or channel is None:
        return None
    try:
        if watchdog.failure is not None or watchdog.sweep() is not None:
            return watchdog.failure
        answers = channel.ask_whereabouts(range(channel.world_size), ctx.settings.answer_within)
        if watchdog.failure is not None:
            return watchdog.failure
        silent = [
            r for r in range(channel.world_size) if r != channel.rank and r not in answers and channel.done(r) is None
        ]
        if not silent:
            return None
        record = lost_record(
            silent[0],
            "its process stopped answering (this rank got SIGTERM, as a launcher sends once a worker died)",
            channel.rank,
        )
        return post_and_pick(ctx, record, error_from_record(record))
    except dist.DistNetworkError as err:  # the store's host died: that is the failure behind the stop
        return watchdog.store_lost(err)
    except Exception as err:  # another failure: the stop stays this rank's own
        log.warning("tether: could not tell whether a peer's failure caused this SIGTERM: %s", err)
        return watchdog.failure
