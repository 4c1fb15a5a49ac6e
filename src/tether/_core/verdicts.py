"""What a wait that did not end well means: the failure behind a timeout, a mismatch, a
backend error or a launcher's SIGTERM, posted once so that every rank raises the same.

Each function returns the exception the caller raises. When another failure was posted
first it returns that one instead (``post_and_pick``): the root cause is always record 1.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any, NoReturn

import torch.distributed as dist
from torch._C._distributed_c10d import Store

from ..errors import BackendError, PeerLost, SyncMismatch, SyncTimeout, TetherError
from .channel import ROOT_WAIT, Answers
from .context import Context
from .group import Group, all_ranks, tag
from .liveness import node_beats, running_here
from .record import KIND_FINISHED, KIND_MISMATCH, KIND_TIMEOUT, FailureRecord, error_from_record, lost_record

log = logging.getLogger("tether")


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


def expire(ctx: Context, group: Group, seq: int, signature: str, timeout: float, at: str | None = None) -> TetherError:
    """A sync's timeout expired: name who did not arrive, post it, return the error to raise.

    A member has arrived when its whereabouts' first line ends with ``at`` (default: the
    sync's tag, ``barrier #3``). The record is about the first member that did not
    arrive, not this waiting rank: the report's root cause is the rank that stalled.
    """
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
    label = tag(group, seq)
    at = f" {label}" if at is None else at
    answers, missing, where, waiting = _who_is_missing(ctx, group, at)
    if waiting and len(waiting) == len(missing):
        # Every missing member waits in a call of its own, for a rank this sync does not
        # hold (a DeviceMesh's column, made while the stalled rank's row waits for it): the
        # verdict of the wait that began first names that rank. Give it time to come.
        failure = ctx.watchdog.wait_for_failure(_hold_for_other_verdicts(ctx, answers, waiting, timeout))
        if failure is not None:
            return failure
        # None came: ask again. The answers are seconds old by now, and a member may have
        # left its call meanwhile (one still making a group, in ``new_group``, when this
        # sync expired on a loaded machine; by the post it waited in a reduce for the rank
        # that stalled, which the old answers left unnamed: ``pytest --full``, 2026-12-06)
        answers, missing, where, waiting = _who_is_missing(ctx, group, at)
    if len(waiting) == len(missing):  # all inside calls: waiting on each other, none is the one
        waiting = []
    # Every rank is in the sync by now: one came after the timeout expired and before the
    # question (a few ms on a loaded machine). The last to come is the one that stalled if
    # it came after this rank's deadline: it has been in the sync for less than this rank
    # less the timeout (each rank's answer says for how long; no clocks are compared).
    mine = ctx.watchdog.in_call_for()
    arrived = {r: s for r, s in answers.seconds.items() if r in group.members and r != me}
    last = min(arrived, key=arrived.__getitem__) if arrived else None
    late = [last] if not missing and last is not None and mine is not None and arrived[last] < mine - timeout else []
    where.update({r: answers[r] for r in late})
    call = f"{signature} {label}" if seq else signature
    own = SyncTimeout(call, timeout, missing, where, waiting=waiting, late=late)
    culprit = own.stalled[0] if own.stalled else me
    record = FailureRecord(
        rank=culprit,
        kind=KIND_TIMEOUT,
        exc_type="SyncTimeout",
        message=str(own).splitlines()[0],
        where=_first_line(where[culprit]) if culprit in where else call,
        time=time.time(),
        **_placed(ctx, culprit),
        reporter=me,
        detail={
            "call": call,
            "timeout": timeout,
            "missing": missing,
            "whereabouts": where,
            "waiting": waiting,
            "late": late,
        },
    )
    own.record = record
    return post_and_pick(ctx, record, own)


NO_ANSWER = "no answer: frozen, dead, or holding the GIL"
NOT_STARTED = "no answer: not started (it has not reached tether.initialize)"


def _whereabouts(ctx: Context, answers: Answers, ranks: list[int]) -> dict[int, str]:
    """rank -> its answer, for ``ranks``; one that did not answer is told apart from one not
    yet started, which never said where it runs (one store read, only then)."""
    assert ctx.channel is not None
    where = {r: answers.get(r, NO_ANSWER) for r in ranks}
    if any(r not in answers for r in ranks):
        registered = ctx.channel.registered()
        where.update({r: NOT_STARTED for r in ranks if r not in answers and r not in registered})
    return where


def _who_is_missing(ctx: Context, group: Group, at: str) -> tuple[Answers, list[int], dict[int, str], list[int]]:
    """Ask ``group``'s members where they are: the answers, the members not at ``at``, their
    whereabouts, and those of them that wait inside a call of their own."""
    assert ctx.channel is not None
    me = ctx.channel.rank
    answers = ctx.channel.ask_whereabouts(group.members, ctx.settings.answer_within)
    missing = [r for r in group.members if r != me and not answers.get(r, "").split("\n", 1)[0].endswith(at)]
    where = _whereabouts(ctx, answers, missing)
    waiting = [r for r in missing if _in_a_call(where[r])]
    return answers, missing, where, waiting


def _hold_for_other_verdicts(ctx: Context, answers: Answers, waiting: list[int], timeout: float) -> float:
    """Seconds to wait for the verdict of the calls ``waiting`` are in, before posting this one.

    The member that has waited longest expires first, if its call has this sync's timeout:
    in ``timeout`` less the seconds it has waited, then asks and posts. One with a longer
    timeout, or none, is not waited for past this sync's own ``timeout`` again.
    """
    began = max((answers.seconds.get(r) or 0.0 for r in waiting), default=0.0)
    return min(timeout, max(0.0, timeout - began)) + ctx.settings.answer_within + 1.0


def _placed(ctx: Context, rank: int, client: Store | None = None) -> dict[str, Any]:
    """``host`` and ``pid`` of ``rank`` for its record: its own, or as it registered (read on
    ``client``, the calling thread's connection, when given)."""
    assert ctx.channel is not None
    if rank == ctx.channel.rank:
        return {"host": socket.gethostname(), "pid": os.getpid()}
    found = ctx.channel.placed(rank, client)
    return {"host": found[0], "pid": found[1]} if found is not None else {"host": "", "pid": 0}


def _in_a_call(whereabouts: str) -> bool:
    """Whether a rank's whereabouts answer puts it inside a call (waiting for someone).

    The watchdog answers ``in <call>`` or ``in user code`` (``Watchdog.whereabouts``); a
    rank that did not answer (frozen, dead, holding the GIL) is in no call it can name.
    """
    first = whereabouts.split("\n", 1)[0]
    return first.startswith("in ") and first != "in user code"


def mismatch(ctx: Context, group: Group, signature: str) -> TetherError:
    assert ctx.channel is not None and ctx.watchdog is not None
    if ctx.watchdog.failure is not None:
        return ctx.watchdog.failure
    me = ctx.channel.rank
    answers = ctx.channel.ask_whereabouts(group.members, ctx.settings.answer_within)
    calls = {r: _first_line(answers[r]) if r in answers else "no answer" for r in group.members if r != me}
    calls[me] = signature
    own, record = _mismatch(me, calls)
    return post_and_pick(ctx, record, own)


def _mismatch(me: int, calls: dict[int, str]) -> tuple[SyncMismatch, FailureRecord]:
    """The error, and the record it travels as, for ranks that entered ``calls``."""
    own = SyncMismatch(calls)
    own.record = record = FailureRecord(
        rank=me,
        kind=KIND_MISMATCH,
        exc_type="SyncMismatch",
        message=str(own),
        where=calls[me],
        time=time.time(),
        host=socket.gethostname(),
        pid=os.getpid(),
        reporter=me,
        detail={"calls": {str(k): v for k, v in calls.items()}},
    )
    return own, record


def left_behind(ctx: Context, client: Store, group: Group, seq: int, call: str) -> None:
    """Post a rank of ``group`` that finished before it reached sync ``seq`` (this rank waits there).

    Called by the keeper thread while a wait lasts (``watchdog._Wait.check``), on its own
    connection: one or two store reads per period. The record wakes this rank too.
    """
    assert ctx.channel is not None and ctx.watchdog is not None
    channel = ctx.channel
    for rank, (how, seqs, lingers) in sorted(channel.finished(client).items()):
        if rank in group.members and rank != channel.rank and seqs.get(group.key, 0) < seq:
            if channel.claim_loss(rank, client):
                ctx.watchdog.post_and_deliver([finished_record(ctx, rank, how, call, lingers, client)], client)
            else:
                ctx.watchdog.wait_for_failure(ROOT_WAIT)  # another waiter won the claim: its post is coming
            return


def nobody_left(ctx: Context, client: Store, call: str) -> None:
    """Post the lowest other rank when every other rank finished (this rank waits in ``call``,
    for a key on a store: ``storewaits.py``).

    Such a wait is for no group: any rank might set its key, so one rank's finish does not
    end it (the others would meet that rank's finish in their own next wait, and its
    failure would wake this one). Once every other rank finished, nobody of the job is left
    to set it. Called by the keeper, on its own connection: one or two reads per period.
    """
    assert ctx.channel is not None and ctx.watchdog is not None
    channel = ctx.channel
    finished = channel.finished(client)
    others = [r for r in range(channel.world_size) if r != channel.rank]
    if not others or not all(r in finished for r in others):
        return
    rank = others[0]
    how, _, lingers = finished[rank]
    if channel.claim_loss(rank, client):
        ctx.watchdog.post_and_deliver([finished_record(ctx, rank, how, call, lingers, client)], client)
    else:
        ctx.watchdog.wait_for_failure(ROOT_WAIT)


def finished_record(
    ctx: Context, rank: int, how: str, call: str, lingers: bool, client: Store | None = None
) -> FailureRecord:
    """``rank`` finished while this rank waits in ``call``; placed as it registered, so that a
    victim on its host can wait for its exit, unless its process ``lingers`` in a thread
    (``hooks.after_finished_peer``). ``client``: the keeper's own connection, where it asks."""
    assert ctx.channel is not None
    me = ctx.channel.rank
    message = f"it {how} while rank {me} waits in {call}"
    host, pidns, pid = ctx.channel.registered(client).get(rank) or ("", "", 0)
    record = lost_record(rank, message, me, kind=KIND_FINISHED, exc_type="Finished", host=host, pid=pid)
    record.detail["pidns"] = pidns  # its pid means the same process only in that namespace
    if lingers:
        record.detail["lingers"] = True
    return record


def mismatch_of(ctx: Context, group: Group, calls: dict[int, str]) -> TetherError:
    """Every member knows every member's call (``check_collectives``): the same error on each.

    The group's lowest rank posts it (for the report); the others take that record, or
    raise their own identical error if it is slow to come.
    """
    assert ctx.channel is not None and ctx.watchdog is not None
    own, record = _mismatch(ctx.channel.rank, calls)
    if ctx.channel.rank == min(calls):
        return ctx.watchdog.taken(post_and_pick(ctx, record, own))
    return ctx.watchdog.taken(ctx.watchdog.wait_for_failure(ctx.settings.answer_within) or own)


def warn_stall(ctx: Context, group: Group, seq: int, signature: str, elapsed: float) -> None:
    assert ctx.channel is not None
    answers = ctx.channel.ask_whereabouts(group.members, ctx.settings.answer_within)
    where = f"{signature} {tag(group, seq)}" if seq else signature  # seq 0: a wait outside tether
    lines = [f"tether: rank {ctx.channel.rank} has waited {elapsed:.0f} s in {where}:"]
    others = [r for r in group.members if r != ctx.channel.rank]
    lines.extend(f"  rank {r}: {text}" for r, text in _whereabouts(ctx, answers, others).items())
    log.warning("\n".join(lines))


def stall_warner(ctx: Context, call: str, start: float) -> Callable[[], None]:
    """The ``on_stall`` of a wait outside tether's calls (a raw call, a store wait), begun at
    ``start``: its report asks every rank where it is, since such a wait names no group."""
    assert ctx.channel is not None
    world = ctx.channel.world_size
    return lambda: warn_stall(ctx, all_ranks(world), 0, call, time.monotonic() - start)


# What torch's backends say when a peer is gone or late (gloo, NCCL, the c10d store).
_BACKEND_WORDS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "gloo", "NCCL", "Timed out")


def is_backend_error(exc: BaseException) -> bool:
    """True for an error raised by torch.distributed's communication, not by user code."""
    if isinstance(exc, dist.DistError):
        return True
    try:
        text = str(exc)
    except Exception:  # a broken __str__ is the user's, never the backend's
        return False
    return any(word in text for word in _BACKEND_WORDS)


def explain_backend_error(ctx: Context, group: Group, exc: BaseException) -> TetherError:
    """Turn a backend error ("Connection closed by peer") into the failure behind it.

    A peer that raised has posted its record before its process ended, so it is usually
    here already. A peer that finished cleanly closed its connections as it ended: that is
    the story. A peer that was killed has posted nothing: the ranks that are lost by
    ``_silent``'s rule are posted as lost.
    """
    assert ctx.watchdog is not None and ctx.channel is not None
    failure = ctx.watchdog.wait_for_failure(0.2)
    if failure is not None:
        return failure
    me = ctx.channel.rank
    try:
        finished = ctx.channel.finished()
        left = [r for r in group.members if r != me and r in finished]
        silent = [] if left else _silent(ctx, [r for r in group.members if r != me])
    except dist.DistNetworkError as lost:
        return ctx.watchdog.store_lost(lost)
    if ctx.watchdog.failure is not None:
        return ctx.watchdog.failure
    if left:  # it left cleanly: its process ended, and the backend's connections with it
        how, _, lingers = finished[left[0]]
        call = ctx.watchdog.current_call or "a torch.distributed call"
        record = finished_record(ctx, left[0], how, call, lingers)
        return post_and_pick(ctx, record, error_from_record(record))
    if not silent:
        return BackendError(f"{type(exc).__name__}: {exc}")
    record = lost_record(
        silent[0], f"its process stopped answering (the backend said: {str(exc).splitlines()[0]})", ctx.channel.rank
    )
    return post_and_pick(ctx, record, PeerLost(record))


def _silent(ctx: Context, ranks: list[int]) -> list[int]:
    """Of ``ranks``, those that may be lost: not running on this host, not answering, and
    on a node that stopped beating.

    A rank whose process runs on this host is alive (``liveness.running_here``): it is
    not asked. The others are asked where they are, for as long as a judge takes to find a
    rank lost (``lost_after``: a frozen process, a silent node), or until a failure is
    posted (a judge on their host finds a dead process within a second). One that stays
    silent on a node whose heartbeat moved meanwhile is alive too: its node's beater
    (``beater.py``) beats while local rank 0 lives, and its host's judges would have
    posted its death. Silence alone proved nothing: a rank 1 busy on a loaded machine was
    once posted lost after 1 s, as the cause of rank 0's own SIGTERM.
    """
    assert ctx.channel is not None and ctx.watchdog is not None
    watchdog, channel = ctx.watchdog, ctx.channel
    alive = running_here(channel, ranks)
    asked = [r for r in ranks if r not in alive]
    if not asked:
        return []
    topo = ctx.backend.topology
    nodes = {r: r // topo.nproc_per_node for r in asked} if topo.nnodes > 1 else {}
    before = node_beats(channel, set(nodes.values()))
    answers = channel.ask_whereabouts(asked, watchdog.config.lost_after, until=lambda: watchdog.failure is not None)
    silent = [r for r in asked if r not in answers]
    if silent and nodes:
        after = node_beats(channel, {nodes[r] for r in silent})
        silent = [r for r in silent if after[nodes[r]] == before[nodes[r]]]
    return silent


OUTSIDE = "(outside tether)"  # how a rank in a torch.distributed call ends its whereabouts' first line


def _is_timeout(exc: BaseException, creating: bool = False) -> bool:
    """A backend's timeout ("Timed out waiting 4000ms for recv operation"); while a group
    is made (``creating``), also its rendezvous's store wait ("DistStoreError: wait
    timeout after 3000ms, keys: ...": a member never published its address, as one that
    starts late does). A store wait of the user's that times out is the user's error."""
    try:
        text = str(exc).lower()
    except Exception:
        return False
    return "timed out" in text or (creating and isinstance(exc, dist.DistStoreError) and "timeout" in text)


MIN_OWN_TIMEOUT = 0.1  # seconds: see failure_behind_raw


def failure_behind_raw(
    ctx: Context,
    exc: BaseException,
    call: str,
    members: tuple[int, ...] | None = None,
    waited: float | None = None,
    bound: float | None = None,
) -> TetherError | None:
    """The failure behind an error out of a torch.distributed call tether did not make.

    None when ``exc`` is not the backend's (a user's own error passes unchanged) and no
    failure is known. A known failure wins; else a backend timeout (gloo's, set from
    ``sync_timeout``: ``rawcalls.py``) becomes a ``SyncTimeout`` naming the ranks that
    were not in a torch.distributed call (of ``members``, the ranks of the call's group,
    when known; else of all ranks); else the peers are asked where they are
    (``explain_backend_error``).

    ``waited``: how long the call waited, when the caller knows. Without ``sync_timeout``
    the timeout that expired is the group's own (the user's ``timeout=``, or torch's 30
    minutes): it is a ``SyncTimeout`` too, after the time the call waited. It was a
    ``BackendError`` naming nobody, and the report's root cause the launcher's guess,
    "rank 0 failed: SystemExit: process exited with code 3" (``tests/jobs/lifecycle_root.py``,
    ``group-timeout``). A "timed out" sooner than ``MIN_OWN_TIMEOUT`` is no call's timeout.

    ``bound``: the timeout a group's creation ran under (the job's own group is made under
    the set-up's timeout, which ``sync_timeout`` does not bound: ``runtime.start``); its
    rendezvous's store timeout is a ``SyncTimeout`` naming the ranks that did not come.
    It was a ``PeerLost`` for a rank that was alive, still in its imports: "rank 1 failed:
    Lost: its process stopped answering (the backend said: wait timeout after 3000ms ...)",
    after ``lost_after`` more (``tests/jobs/setup_late.py``, ``timeout``).
    """
    watchdog = ctx.watchdog
    if watchdog is None or ctx.channel is None:
        return None
    if watchdog.failure is not None:
        return watchdog.taken(watchdog.failure)
    if not is_backend_error(exc):
        return None
    world = all_ranks(ctx.channel.world_size)
    try:
        timeout = ctx.settings.timeout if bound is None else bound
        if timeout is None and waited is not None and waited >= MIN_OWN_TIMEOUT:
            timeout = round(waited, 1)
        if _is_timeout(exc, creating=bound is not None) and timeout is not None:
            # a call on a subgroup waited for that group's members only: the verdict is theirs
            on = world if members is None else Group("g" + ".".join(map(str, members)), members, None)
            return watchdog.taken(expire(ctx, on, 0, call, timeout, at=OUTSIDE))
        return watchdog.taken(explain_backend_error(ctx, world, exc))
    except dist.DistNetworkError as err:
        return watchdog.taken(watchdog.store_lost(err))


def failure_behind_stop(ctx: Context) -> TetherError | None:
    """The peer failure that explains a SIGTERM, or None when the stop is this rank's own.

    torchrun's agent SIGTERMs every other worker 0.1 s after one worker's process ended.
    A record already posted explains it (the listener may not have delivered it yet).
    A judge's sweep of this host's ranks (from /proc, milliseconds) finds a rank that
    died without a word. A rank still running on this host is no cause. The others are
    asked where they are: one that did not leave cleanly, stays silent for ``lost_after``
    and whose node stopped beating meanwhile is posted as lost (``_silent``). Asked once
    per context: a later stop finds the answer (``Context.stop_was_own``). Runs on the
    main thread after the signal's exception left the handler, never inside it.

    A DataLoader's worker that a stop to the whole process group ended cannot cut this query
    short ("could not tell whether a peer's failure caused this SIGTERM: DataLoader worker
    (pid ...) is killed by signal"): the handler that raised ``Terminated`` dropped child
    deaths for good (``hooks.stopping``).
    """
    if ctx.watchdog is None or ctx.channel is None:
        return None
    return _failure_behind_stop(ctx)


def raise_behind_stop(ctx: Context, stop: BaseException) -> NoReturn:
    """Raise the peer failure behind ``stop``, a SIGTERM's ``Terminated`` that reached a wait, or ``stop`` itself.

    Called in the ``except`` that caught it; the failure is raised from it, and the
    watchdog's ladder stands down (``Watchdog.taken``).
    """
    behind = failure_behind_stop(ctx)
    if behind is None or ctx.watchdog is None:
        raise stop
    raise ctx.watchdog.taken(behind) from stop


def _failure_behind_stop(ctx: Context) -> TetherError | None:
    watchdog, channel = ctx.watchdog, ctx.channel
    assert watchdog is not None and channel is not None  # see failure_behind_stop
    try:
        if watchdog.failure is not None:
            return watchdog.failure
        root = channel.root_cause(channel.connection)  # posted, but not delivered here yet
        if root is not None and not (root.rank == channel.rank and root.reporter == channel.rank):
            watchdog.deliver(error_from_record(root), None)
            return watchdog.failure
        if watchdog.sweep() is not None:
            return watchdog.failure
        if ctx.stop_was_own:
            return None  # asked already, for this stop, by the wait it reached (up to lost_after)
        finished = channel.finished(channel.connection)  # they will not answer: asking them costs the wait
        silent = _silent(ctx, [r for r in range(channel.world_size) if r != channel.rank and r not in finished])
        if watchdog.failure is not None:
            return watchdog.failure
        silent = [r for r in silent if channel.done(r) is None]
        if not silent:
            # remembered: the post of this stop (``failures._report``) asked again, which held
            # its record back by lost_after while its peers waited (tests/test_two_nodes.py)
            ctx.stop_was_own = True
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
