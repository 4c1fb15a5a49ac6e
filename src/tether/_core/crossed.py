"""Waits that cannot meet: a rank in a tether wait, a peer in a raw collective that needs it.

A rank that raises inside ``try`` and runs a collective in its ``finally`` (``dist.barrier()``
before ``destroy_process_group``) is in a raw call while the others wait for it in tether's
``all_reduce``: its exception has not reached the top, nothing is posted, and each side
waits for the other. By hand (torchrun, 3 ranks, no ``sync_timeout``): the job waited until
it was killed (100 s; forever without a kill). tether's own calls number their syncs and
catch such a cross at once (``SyncMismatch``); a raw call is not numbered, as that would
cost every raw call a store round trip.

So a tether wait still going after ``CROSSED_AFTER`` seconds asks its group where each
member is, again every ``CROSSED_AFTER``: a member in a raw collective (one of
``rawcalls.WRAPPED``'s, not a point-to-point call, not ``backward()``: both may be
waiting for something else) whose group holds this rank, in it for at least
``CROSSED_AFTER`` seconds, in two answers in a row (the same call, begun at the same time),
can never leave it: it waits for this rank, which waits for it here. Every member then
raises ``SyncMismatch`` listing where each is, and what the raw caller was handling, if
it was: "rank 1: dist.barrier (outside tether), while handling ValueError: ...".

What it costs: nothing until a wait has lasted ``CROSSED_AFTER``; then one store ``add``
per waiting member, and one whereabouts query (``2 + 3 N`` store operations) per
``CROSSED_AFTER`` from the one member that claimed the asking (the first ``add``): every
member waits in the same sync, so one asker sees what each would (N askers made a long
barrier of N ranks, a rank evaluating alone while the others wait, cost the store
``N * (2 + 3 N)`` operations every 5 s). The claim's key is handed to the janitor as the
claimer's wait ends. The
raw wrapper notes the call's arguments and the exception being handled (two attribute
writes, ``rawcalls._outside``); the group's ranks are worked out only when asked.

Not caught: two raw calls that cross (no tether wait to ask from), and a cross whose raw
side is ``backward()`` (DDP's reducer: the rank may still be computing).
"""

from __future__ import annotations

import time

from torch._C._distributed_c10d import Store

from .context import Context
from .group import Group, tag
from .verdicts import OUTSIDE, _first_line, _mismatch, left_behind, post_and_pick

CROSSED_AFTER = 5.0  # seconds both sides must have waited before a cross is named
SAME_START = 0.5  # seconds two answers' start times of one call may differ by (query latency)


class CrossedWaits:
    """The keeper's check for one tether wait (``Watchdog.begin_wait``'s ``check``): a member
    that finished (``verdicts.left_behind``), and then a cross (the module docstring)."""

    def __init__(self, ctx: Context, group: Group, seq: int, signature: str, start: float) -> None:
        self._ctx = ctx
        self._group = group
        self._seq = seq
        self._signature = signature  # the call's name is made when a check needs it, not per wait
        self._next = start + CROSSED_AFTER
        self._seen: dict[int, tuple[str, float]] = {}  # rank -> (its raw call, when it began), last time
        self._asker: bool | None = None  # claimed the asking (None: not tried yet)
        self._claim = ""  # its key, made when first needed: a wait that ends sooner costs nothing more

    def __call__(self, client: Store) -> None:
        ctx = self._ctx
        call = f"{self._signature} {tag(self._group, self._seq)}"
        left_behind(ctx, client, self._group, self._seq, call)
        now = time.monotonic()
        if now < self._next or ctx.watchdog is None or ctx.watchdog.failure is not None:
            return
        self._next = now + CROSSED_AFTER
        assert ctx.channel is not None
        if self._asker is None:
            self._claim = ctx.channel.key("sync", self._group.key, self._seq, "crossed")
            self._asker = int(client.add(self._claim, 1)) == 1
        if not self._asker:
            return
        me = ctx.channel.rank
        watchdog = ctx.watchdog
        answers = ctx.channel.ask_whereabouts(
            self._group.members, ctx.settings.answer_within, until=lambda: watchdog.failure is not None
        )
        crossed: dict[int, tuple[str, float]] = {}
        for rank, where in answers.items():
            first = _first_line(where)
            seconds = answers.seconds.get(rank, 0.0)
            needs_me = me in answers.members.get(rank, ())  # only a raw collective's answer has members
            if first.endswith(OUTSIDE) and needs_me and seconds >= CROSSED_AFTER:
                crossed[rank] = (first, now - seconds)  # when it began, as seen from here
        seen, self._seen = self._seen, crossed
        if not crossed or not all(_same(seen.get(r), c) for r, c in crossed.items()):
            return  # none, or not yet twice in a row
        calls = {r: _first_line(answers[r]) for r in answers}
        for rank, handling in answers.handling.items():
            if rank in crossed:
                calls[rank] = f"{calls[rank]}, while handling {handling}"
        calls[me] = call
        own, record = _mismatch(me, calls)
        post_and_pick(ctx, record, own)  # delivers it here; the others are told by the post

    def done(self) -> None:
        """The wait ended (the main thread): the claimer hands the claim's key to the janitor."""
        if self._asker and self._ctx.watchdog is not None:
            self._ctx.watchdog.janitor.discard(self._claim)


def _same(before: tuple[str, float] | None, now: tuple[str, float]) -> bool:
    """The same raw call, begun at the same time (within the two queries' latencies)."""
    return before is not None and before[0] == now[0] and abs(before[1] - now[1]) < SAME_START
