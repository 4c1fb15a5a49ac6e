"""This rank's own failure: posting it once, waking its main thread, torchelastic's error file."""

from __future__ import annotations

import logging
import os
import threading
import time

from ..errors import BackendError, ExitCode, TetherError
from . import context, errorfile
from .channel import ROOT_WAIT
from .context import Context
from .hooks import Terminated, is_success
from .record import FailureRecord, error_from_record
from .verdicts import failure_behind_raw, failure_behind_stop, is_backend_error

log = logging.getLogger("tether")

# How long a rank that hosts the store and fails (on its own, or as a victim) keeps the
# store up for the others, until each marked how it ended. Without it, its exit closed
# the store before some survivors had read its record: they raised PeerLost "the store
# closed its connection" instead of PeerFailure naming its exception (1 run in 4 of the
# --full rows F1-raise-first-initialize-rank0-4r and F8-sigterm-outside-initialize-rank0-4r).
HOST_LINGER = 2.0


def report_failure(exc: BaseException) -> BaseException | None:
    """Post this rank's own failure once, and write torchelastic's error file.

    ``sys.exit(0)`` is no failure. A tether error is a consequence of a failure already
    posted: it is not posted again, and the error file names the root cause; one that no
    posted failure explains is this rank's own (``_explained``). A SIGTERM
    (``Terminated``) that another rank's failure explains is a consequence too: that
    failure is returned (see ``_failure_behind_stop``).
    """
    ctx = context.peek()
    if ctx is None or ctx.channel is None or is_success(exc):
        return None
    if ctx.hooks is None:
        behind = _report(ctx, exc)
        _after_post(ctx, behind or exc)
        return behind
    with ctx.hooks.posting() as stops:  # a launcher's SIGTERM must not land inside the post
        behind = _report(ctx, exc)
        _after_post(ctx, behind or exc)
    if stops:
        ctx.hooks.stop_after(stops[0], behind if isinstance(behind, TetherError) else exc)
    return behind


def _after_post(ctx: Context, failure: BaseException) -> None:
    """Run what waits for this rank's end on ``failure`` (``Context.on_failure``); never raises."""
    for call in list(ctx.on_failure):
        try:
            call(failure)
        except Exception as err:
            log.warning("tether: %r failed after this rank's failure: %s: %s", call, type(err).__name__, err)


def _report(ctx: Context, exc: BaseException) -> BaseException | None:
    assert ctx.channel is not None  # see report_failure
    if isinstance(exc, Terminated) and not any(seen is exc for seen, _ in ctx.posted):
        behind = failure_behind_stop(ctx)
        if behind is not None:
            report_failure(behind)
            return behind
    where = ctx.watchdog.current_call if ctx.watchdog is not None and ctx.watchdog.current_call else "user code"
    if not isinstance(exc, TetherError) and is_backend_error(exc):
        # a raw call's backend error reached the top: a victim, if a peer's failure is behind it
        behind = failure_behind_raw(ctx, exc, where)
        if behind is not None and not isinstance(behind, BackendError):
            report_failure(behind)
            return behind
    try:
        going = ctx.watchdog is not None and ctx.watchdog.store_going
        if isinstance(exc, TetherError) and (going or _explained(ctx)):
            if going:
                # nobody is left to read a mark, and a torch client that writes to a closed
                # store logs a warning with a C++ stack: the error file says what this rank knows
                known = getattr(exc, "record", None)
                root = known if isinstance(known, FailureRecord) else None
            else:
                ctx.channel.mark_done("failed")
                root = ctx.channel.root_cause()
                if ctx.hosts_store:  # a victim too: the store goes with this process (HOST_LINGER)
                    ctx.channel.wait_done(HOST_LINGER)
            _write_error_file(ctx, exc, root, victim=True)
        else:
            if isinstance(exc, TetherError):  # nothing explains it (``_explained``): this rank's own
                exc.exit_code = ExitCode.RAISED  # not PEER_FAILED, which says another rank failed
            record = ctx.post_own(exc, where)
            root = ctx.channel.root_cause() if record is not None and record.seq != 1 else record
            _write_error_file(ctx, exc, record, victim=False, root=root)
            if record is not None and threading.current_thread() is not threading.main_thread():
                _wake_main_thread(ctx, record)
            if record is not None and ctx.hosts_store:
                # the store goes with this process: let the others read the record first
                ctx.channel.wait_done(HOST_LINGER)
    except Exception as err:
        # the store may be gone (its host died): then this line is the only trace of why
        log.warning("tether: could not post this rank's failure (%s: %s): %s", type(exc).__name__, exc, err)
    return None


def _explained(ctx: Context) -> bool:
    """Whether a failure is posted, waited for up to ``ROOT_WAIT``: a tether error this
    rank ends on is a victim's only if some rank's failure explains it.

    One that nothing explains is this rank's own story, and the only one there is: a
    ``BackendError`` ("no rank posted a failure that explains it") is posted like any
    exception. Before, it passed as a victim's: every rank ended with code 3 and nothing
    posted, and the report said "rank 0 failed: SystemExit: process exited with code 3",
    the launcher's guess (CI, stop 51: ``test_a_rank_stalled_in_training_costs_no_progress
    _under_spawn_with_max_restarts``, after its restart; ``tests/jobs/lifecycle_root.py``,
    ``weird backend``). The wait lets a death a launcher or judge is about to post (a
    peer killed, whose closed connections raised this error) come first, as the root
    cause it is.
    """
    assert ctx.channel is not None
    deadline = time.monotonic() + ROOT_WAIT
    while ctx.channel.failure_count() == 0:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def _same_node(ctx: Context, record: FailureRecord) -> bool:
    """Whether the rank ``record`` is about ran on this rank's node (under this torchrun).

    torchrun numbers ranks node by node, so this node's are the ``nproc_per_node`` from
    ``rank - local_rank`` on, whatever other nodes run.
    """
    return record.rank in ctx.backend.topology.node_ranks


def blamed(ctx: Context, record: FailureRecord) -> None:
    """A peer's timeout names this rank as the one that stalled: its error file says so now.

    This rank is alive, stalled outside tether, and may never raise: torchrun SIGTERMs it
    once a survivor has exited, and a SIGTERM leaves no error file. Its "Root Cause" then
    showed exit code 143 and no story, or a survivor's file, by the timing of the run.
    Written now, on the watchdog's thread, with the verdict's time (a survivor's file says
    that time + 1), torchrun's root cause is this rank, with the timeout's message and
    where this rank was (its whereabouts, in the message).
    """
    path = ctx.error_file
    if path is None or os.path.exists(path):
        return
    error = error_from_record(record)
    try:
        errorfile.write(path, f"{type(error).__name__}: {error}", int(record.time or time.time()))
        ctx.wrote_own_error = True
    except OSError as err:
        log.warning("tether: could not write this rank's error file: %s", err)


def _wake_main_thread(ctx: Context, record: FailureRecord) -> None:
    """A thread of this rank failed: stop the main thread's wait too, as every peer's.

    The post wakes only the other ranks; without this, the main thread would wait for
    peers that have all stopped because of this very failure.
    """
    assert ctx.watchdog is not None and ctx.channel is not None
    ctx.watchdog.deliver(error_from_record(record), ctx.channel.connection)


def _write_error_file(
    ctx: Context,
    exc: BaseException,
    record: FailureRecord | None,
    victim: bool,
    root: FailureRecord | None = None,
) -> None:
    """torchelastic's error file (see ``errorfile.py``).

    torchrun names the failure with the smallest timestamp (whole seconds, ties to the
    lowest rank) as its root cause. So a victim's file says the root cause's time + 1, and
    so does the file of a rank that failed on its own *after* another (its record is not
    seq 1): two failures within the same second then still show the first one.

    A victim never covers the file tether wrote for this rank's own failure or blame. It
    does cover one torch's ``@record`` wrote as the exception left ``main``: that file is
    stamped with the time it was written, which can tie with the root cause's second, and
    then torchrun named the lowest rank, a victim, as the root cause.
    """
    path = ctx.error_file
    if path is None or (victim and ctx.wrote_own_error):
        return
    stamp = int(record.time if record is not None and record.time else time.time()) + (1 if victim else 0)
    if not victim and root is not None and record is not None and root.seq != record.seq and root.time:
        stamp = max(stamp, int(root.time) + 1)
    message = f"{type(exc).__name__}: {exc}" if victim or record is None else record.headline
    if victim and record is not None and _same_node(ctx, record):
        # the root cause's file, which the same torchrun prints, has the rest (a timeout's
        # whereabouts: the staller's stack, once, not again under every victim of the node)
        message = message.splitlines()[0]
    errorfile.write(path, message, stamp, "" if victim or record is None else record.traceback)
    ctx.wrote_own_error = ctx.wrote_own_error or not victim
