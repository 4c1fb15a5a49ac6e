"""Every wait lives here: store syncs and waits on collectives (their verdicts: ``verdicts.py``).

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
  last arrival can release the gate before it); the watchdog's threads write
  ``"abort"`` to wake a waiter when any other failure is posted or a signal arrives, and
  ``"expired"`` at the waiter's timeout. All use ``compare_set``, so the first value
  written is the one every member reads.
* every other member reads ``.../go`` (a ``get`` without timeout: a timed-out c10d wait
  logs a warning) and returns, or raises.

Costs per call and rank: 2 store round trips (the completer: add + compare_set, then it
hands the two keys of the group's previous gate to the watchdog's janitor thread, which
deletes them while this rank goes on: ``janitor.py``).

**Collectives** are issued with ``async_op=True`` and waited on with a ``threading.Event``
that both the work's completion callback and the watchdog can set, so a failure posted
anywhere wakes the caller within milliseconds (``benchmarks/results/faults.md``); gloo
cannot be woken any other way. On gloo the first 5 ms are a wait in C++ (``_fast_wait``),
and a collective that ended within them never set this rank's whereabouts; one whose last
run outlived them goes to the event at once (``run_work``).
The callback runs on gloo's thread, which it first makes keep its Python thread state,
and until every gloo thread of the group has (at most its first 100), each collective
carries one more callback that does only that (``threadstates.py``: else a fork can hang
its child). On NCCL, whose futures complete when the kernel is enqueued, the wait polls
``work.is_completed()`` instead, in short slices on an event only the watchdog sets
(``_wait_polled``; ``docs/nccl.md``). A collective still waiting after ``check_after``
seconds adds its signature to the same gate counter, so a rank in a different sync is
found (the slow path; free when fast), and takes it back once done: the last to leave
deletes it.

**Threads**: syncs run on the main thread only (``check_thread``).

**Timeouts**: on expiry the rank asks every member what it is doing (its tether call and
stack, answered by its listener), posts a timeout record naming the ranks that had not
arrived, and raises ``SyncTimeout``; the record makes every member raise the same.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import logging
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch.distributed as dist
from torch._C._distributed_c10d import Work

from ..errors import BackendError, TetherError
from .context import Context
from .crossed import CrossedWaits
from .group import Group, tag
from .hooks import Terminated
from .record import error_from_record
from .threadstates import keep_thread_state
from .verdicts import (
    expire,
    explain_backend_error,
    failure_behind_stop,
    is_backend_error,
    mismatch,
    raise_behind_stop,
    warn_stall,
)
from .watchdog import ABORT, EXPIRED, SIGNALLED

log = logging.getLogger("tether")

# A wait still going after this long checks, every keeper period, whether a member finished
# before it reached this sync (``verdicts.left_behind``), and later whether a member waits for
# this rank in a raw call (``crossed.py``); a wait that ends sooner costs nothing.
LEFT_CHECK_AFTER = 0.5

# torch's own ``Work.wait``, taken as tether is imported, before ``rawcalls`` wraps it to name
# the waits of the user's async works: tether's waits run inside a tether call, where the
# wrapper would only pass the call on, for 0.7 us more each (timed here with ``perf_counter``)
_work_wait = Work.wait


def _wait_on(work: Any, **kwargs: Any) -> Any:
    """``work.wait(**kwargs)``; torch's own, past the wrapper, unless the work's class has its own."""
    if type(work).wait is Work.wait:  # a backend's work (a subclass of Python's may override wait)
        return _work_wait(work, **kwargs)
    return work.wait(**kwargs)


_COUNT_BITS = 20
_COUNT_MASK = (1 << _COUNT_BITS) - 1
_HASH_MASK = (1 << 22) - 1


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
    with _marked(ctx, call):
        try:
            yield
        except Terminated as stop:  # a launcher's SIGTERM while this rank waits: usually because a peer died
            raise_behind_stop(ctx, stop)


@contextmanager
def _marked(ctx: Context, call: str) -> Iterator[None]:
    """This rank's whereabouts are ``call`` in this block, then what they were."""
    watchdog = ctx.watchdog
    if watchdog is None:
        yield
        return
    previous = watchdog.call_state
    watchdog.current_call = call
    try:
        yield
    finally:
        watchdog.call_state = previous


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
    call = f"{signature} {tag(group, seq)}"
    base = ctx.channel.key("sync", group.key, seq)
    h = signature_hash(signature)
    if failed is not None:
        # Write "failed" before arriving, never after: once counted, this member could
        # complete the gate for the others, and a last arrival could write "ok" first.
        # It never arrives at all: the gate cannot complete without it.
        status = ABORT  # a consequence of a failure already posted: point at that one
        # a launcher's SIGTERM because a peer failed is a consequence too (see failure_behind_stop)
        consequence = isinstance(failed, TetherError) or (
            isinstance(failed, Terminated) and failure_behind_stop(ctx) is not None
        )
        record = None if consequence else ctx.post_own(failed, call)
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
            raise ctx.watchdog.taken(mismatch(ctx, group, signature))
        if role == "leader" or (role == "member" and count == len(group.members)):
            status = _release(ctx, base + "/go")
        else:
            status = wait_key(ctx, base + "/go", group, seq, signature, timeout)
        if status != "ok":
            raise ctx.watchdog.taken(_status_error(ctx, status))
        previous = ctx.last_gate.get(group.key)
        ctx.last_gate[group.key] = seq
        if count == len(group.members) and previous is not None:
            _forget(ctx, group, previous)


def _release(ctx: Context, key: str) -> str:
    """Write ``ok`` to a gate's key; returns its value then (another, if one was there first).

    ``ok`` replaces a member's wake for a handled signal (``SIGNALLED``), which its
    waiters poll meanwhile (``wait_key``).
    """
    assert ctx.store is not None
    status = ctx.store.compare_set(key, "", "ok").decode()
    if status == SIGNALLED:
        status = ctx.store.compare_set(key, SIGNALLED, "ok").decode()
    return status


def _forget(ctx: Context, group: Group, seq: int) -> None:
    """Delete the keys of gate ``seq``, so a job's store does not grow with every sync.

    Called by the rank that saw every member arrive at the next gate of the same group
    (collectives in between take sequence numbers too): each member has then finished
    gate ``seq``. The two deletions follow the release of the others, on the watchdog's
    janitor thread (``janitor.py``): two round trips this rank no longer waits for.
    """
    assert ctx.channel is not None and ctx.watchdog is not None
    ctx.watchdog.janitor.discard(*(ctx.channel.key("sync", group.key, seq, suffix) for suffix in ("n", "go")))


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
    # "abort" is a member's wake for its own stop (a SIGTERM whose handler raises): its
    # record comes once it has decided whether a peer's failure caused the stop, which may
    # take lost_after (``verdicts._silent``). At 1 s, two ranks of a 4-rank job raised
    # BackendError here before the stopped rank 0 had decided (tests/test_two_nodes.py,
    # a rank of another host silent meanwhile)
    within = ctx.watchdog.config.lost_after + ctx.settings.answer_within + 1.0 if status == ABORT else 1.0
    failure = ctx.watchdog.failure or ctx.watchdog.wait_for_failure(within)
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
    crossed = CrossedWaits(ctx, group, seq, signature, start)
    ctx.watchdog.begin_wait(
        key=key,
        deadline=None if timeout is None else start + timeout,
        stall_at=start + ctx.settings.warn_after,
        on_stall=lambda: warn_stall(ctx, group, seq, signature, time.monotonic() - start),
        check_at=start + LEFT_CHECK_AFTER,
        check=crossed,
    )
    try:
        try:
            status = ctx.store.get(key).decode()
            pause = 0.001
            while status == SIGNALLED:
                # a member's signal whose handler returned (one that raised left its wait):
                # the gate goes on. Its key no longer blocks a get, nor takes another wake,
                # so it is polled until the last member writes "ok" over the mark (``_release``)
                ctx.watchdog.check()
                if timeout is not None and time.monotonic() - start >= timeout:
                    status = EXPIRED
                    break
                time.sleep(pause)
                pause = min(2 * pause, 0.05)
                status = ctx.store.get(key).decode()
        except dist.DistNetworkError as exc:
            raise ctx.watchdog.taken(ctx.watchdog.store_lost(exc)) from exc
        if status == EXPIRED and timeout is not None:
            raise ctx.watchdog.taken(expire(ctx, group, seq, signature, timeout))
        if status == ABORT:
            ctx.watchdog.check()
        return str(status)
    finally:
        ctx.watchdog.end_wait()
        crossed.done()


# --- collectives ------------------------------------------------------------------------


def run_work(
    ctx: Context,
    issue: Callable[[], Any],
    group: Group,
    signature: str,
    timeout: float | None,
    *,
    polled: bool | None = None,
) -> None:
    """Issue an async collective (``issue()`` returns its work) and wait for it; return when
    it is done, raise when a failure is known.

    On NCCL the issue is part of the wait, under this rank's whereabouts: a communicator's
    first collective connects its ranks on the calling thread, so the issue blocks until
    every member issued it, in C++, where only the ladder's abort ends it (seen on one
    GPU, ``benchmarks/results/nccl.md``: a peer 2 s late held the issue 2 s). gloo's issue
    only queues the work: it comes first, and the transfer overlaps the wait's set-up.
    Either way, the error an issue raises after an abort ("NCCL error ... internal error")
    gets the true story, as one out of the wait does.

    On gloo, the whereabouts are set only once the first slice of the wait
    (``_fast_wait``, 5 ms in C++) has passed without the work's end: nothing asks where a
    rank is that soon (a stall report, a timeout's verdict and a crossed wait come seconds
    later), and most collectives end within it. With the call marked before the slice,
    an all_reduce of one int cost the calling thread 15.7 / 29.1 us of CPU more than torch's
    own call at 2 / 4 ranks; marked after it, 8.3 / 18.6 us (``benchmarks/sync.py``'s CPU
    section, ``results/sync-5946562.md`` and ``results/sync-35e0db7.md``).

    A slice that expires costs more than it saves: gloo raises "Operation timed out!" as a
    C++ error. So a collective whose last run with the same signature on the same group
    outlived the slice waits on the event at once, and gets the slice back once a run ends
    within 5 ms (``ctx.outlived``). A 64 MiB all_reduce cost the calling thread 337 / 308 us
    of CPU more than torch's own call at 2 / 4 ranks with the slice, 166 / 156 us without
    it (``results/sync-77c0318.md`` and ``results/sync-9d0b7b3.md``).

    Args:
        polled: wait by polling ``work.is_completed()`` (see ``_wait_polled``); None: when
            the backend's futures complete at enqueue (NCCL).
    """
    assert ctx.watchdog is not None
    if polled is None:
        polled = ctx.backend.completes_at_enqueue
    work = None if polled else _issue(ctx, issue, group)
    if work is not None and (keep := ctx.keeper.callback(group.key, group.pg)) is not None:
        work.get_future().add_done_callback(keep)  # a gloo thread has not kept its state: threadstates.py
    seq = ctx.next_seq(group.key)
    state = _PENDING
    kind = (group.key, signature)
    skipped = work is not None and kind in ctx.outlived
    began = time.monotonic() if skipped else None
    if work is not None and not skipped:
        check_thread(signature)
        try:
            state = _fast_wait(ctx, work)
        except Terminated as stop:  # its handler ran as the slice ended: a launcher's stop
            with _marked(ctx, f"{signature} {tag(group, seq)}"):
                raise_behind_stop(ctx, stop)
        if state == _SUCCEEDED:
            return  # the timed wait returned without raising: nothing more to ask the work
    with in_call(ctx, f"{signature} {tag(group, seq)}"):
        if work is None:
            work = _issue(ctx, issue, group)
            _wait_polled(ctx, work, group, seq, signature, timeout)
        elif state in (_PENDING, _EXPIRED):
            done = threading.Event()
            work.get_future().add_done_callback(functools.partial(_woken, done))
            _wait_event(ctx, done, group, seq, signature, timeout)
            _remember_length(ctx, kind, state, began)
        try:
            _wait_on(work)  # after completion: raises the work's error, if any (NCCL: orders the current stream)
        except RuntimeError as exc:
            if isinstance(exc, TetherError):
                raise
            raise ctx.watchdog.taken(explain_backend_error(ctx, group, exc)) from exc


_OUTLIVED_MAX = 256  # signatures remembered (shapes are part of one): past it, all are forgotten


def _remember_length(ctx: Context, kind: tuple[str, str], state: str, began: float | None) -> None:
    """Note whether a collective outlived the 5 ms slice: it expired (``state``), or the
    collective skipped it (``began`` its wait then) and ended within 5 ms after all."""
    if state == _EXPIRED:
        if len(ctx.outlived) >= _OUTLIVED_MAX:
            ctx.outlived.clear()
        ctx.outlived.add(kind)
    elif began is not None and time.monotonic() - began < _FAST_S:
        ctx.outlived.discard(kind)


def _woken(done: threading.Event, _: object) -> None:
    """A work's completion callback, on gloo's thread: keep that thread's Python state first
    (``threadstates.py``: a fork while it makes one hangs the child), then wake the wait."""
    keep_thread_state()
    done.set()


def _issue(ctx: Context, issue: Callable[[], Any], group: Group) -> Any:
    """``issue()``'s work; a backend's error out of it becomes the failure behind it."""
    assert ctx.watchdog is not None
    try:
        return issue()
    except RuntimeError as exc:
        if isinstance(exc, TetherError) or (ctx.watchdog.failure is None and not is_backend_error(exc)):
            raise  # the caller's own error (gloo checks its arguments as it issues)
        raise ctx.watchdog.taken(explain_backend_error(ctx, group, exc)) from exc


# Polling slices: the first check comes at once (a collective may have finished while it
# was issued), then after 20 us, doubling to 2 ms: a short collective costs a few checks,
# a long one a check every 2 ms (``is_completed`` queries one CUDA event; not measured
# here, where no GPU runs).
_POLL_FIRST = 20e-6
_POLL_MAX = 2e-3


def _wait_polled(ctx: Context, work: Any, group: Group, seq: int, signature: str, timeout: float | None) -> None:
    """Wait until ``work.is_completed()``, in slices on an event only the watchdog sets.

    NCCL marks a work's future completed when its kernel is *enqueued*, so a completion
    callback would return at once, and a timed ``work.wait(timeout)`` busy-waits and aborts
    the communicator when it expires: ``is_completed()`` (the GPU finished the kernel) is
    the only safe test. Between slices the event wakes the wait at once on a failure, and
    timeouts, stall reports and the mismatch check apply as on gloo. This gives up the
    CPU's run-ahead for tether's own collectives, whose results the caller reads anyway.
    """
    assert ctx.watchdog is not None
    if work.is_completed():
        ctx.watchdog.check()
        return
    woken = threading.Event()  # set by the watchdog only, on a failure (a signal's handler runs in the wait)
    _wait_event(ctx, woken, group, seq, signature, timeout, poll=work.is_completed)


_FAST_S = 0.005
_FAST = datetime.timedelta(seconds=_FAST_S)
_SUCCEEDED, _ENDED, _PENDING, _EXPIRED = "succeeded", "ended", "pending", "expired"


def _fast_wait(ctx: Context, work: Any) -> str:
    """Wait up to 5 ms inside the backend (gloo): "succeeded", "ended" (maybe failed),
    "expired" (still running after 5 ms) or "pending" (not waited: not gloo).

    Most collectives finish within this slice, and a wait inside C++ wakes without the
    two GIL hand-offs of a completion callback (measured: the callback path alone cost
    1.2-1.8x of a raw 1 KiB all_reduce on this 2-core machine). A timed wait that returns
    has seen the work succeed (it raises for a failed one), so the caller asks nothing
    more: one backend call per collective, as a raw synchronous one makes. A failure
    posted during the slice is noticed when it ends: it adds at most 5 ms to the notice.
    """
    if work.is_completed():
        return _ENDED
    if ctx.backend.backend() != "gloo":  # only gloo's timed wait is known to leave the work valid
        return _PENDING
    try:
        finished = _wait_on(work, timeout=_FAST)
    except RuntimeError:  # "Operation timed out!" leaves the work valid; a failed work says so below
        finished = False
    if finished is False:  # gloo raises on a timeout; a backend that answers False is not trusted either
        return _ENDED if work.is_completed() else _EXPIRED
    return _SUCCEEDED


def _wait_event(
    ctx: Context,
    done: threading.Event,
    group: Group,
    seq: int,
    signature: str,
    timeout: float | None,
    poll: Callable[[], bool] | None = None,
) -> None:
    """Wait until ``done`` is set (or, with ``poll``, until it answers True), with every deadline applied."""
    assert ctx.watchdog is not None
    timeout = ctx.settings.timeout if timeout is None else timeout
    start = time.monotonic()
    checked = warned = False
    added = 0
    step = _POLL_FIRST
    crossed = CrossedWaits(ctx, group, seq, signature, start)
    ctx.watchdog.begin_wait(event=done, check_at=start + LEFT_CHECK_AFTER, check=crossed)
    try:
        while True:
            elapsed = time.monotonic() - start
            marks = [ctx.settings.warn_after if not warned else None, timeout]
            marks.append(ctx.settings.check_after if not checked else None)
            nxt = min((m for m in marks if m is not None and m > elapsed), default=elapsed + 60.0)
            pause = nxt - elapsed if poll is None else min(nxt - elapsed, step)
            if done.wait(pause):
                ctx.watchdog.check()
                if poll is None or poll():
                    return
                done.clear()  # not done yet: go on polling
            elif poll is not None and poll():
                ctx.watchdog.check()
                return
            step = min(step * 2, _POLL_MAX)
            elapsed = time.monotonic() - start
            if not checked and elapsed >= ctx.settings.check_after:
                checked = True
                added = _check_signature(ctx, group, seq, signature)
            if timeout is not None and elapsed >= timeout:
                raise ctx.watchdog.taken(expire(ctx, group, seq, signature, timeout))
            if not warned and elapsed >= ctx.settings.warn_after:
                warned = True
                warn_stall(ctx, group, seq, signature, elapsed)
    finally:
        ctx.watchdog.end_wait()
        crossed.done()
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
        raise ctx.watchdog.taken(mismatch(ctx, group, signature))
    return amount


def _uncheck(ctx: Context, group: Group, seq: int, amount: int) -> None:
    assert ctx.store is not None and ctx.channel is not None
    key = ctx.channel.key("sync", group.key, seq, "n")
    with contextlib.suppress(dist.DistError):
        if int(ctx.store.add(key, -amount)) == 0:
            ctx.store.delete_key(key)
