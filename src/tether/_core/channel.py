"""The failure channel: a job-wide mailbox on the c10d store.

Protocol (``P`` is the job prefix ``tether/<job id>/``; ``N`` the world size)::

    key                     written by               read by                 meaning
    ----------------------  -----------------------  ----------------------  -------------------------------
    P/fail/n                every poster (add 1)     posters                 order of failures: the counter
    P/fail/<seq>            the poster of <seq>      listeners, launcher     one FailureRecord, JSON
    P/inbox/<rank>          posters, the rank itself that rank's listener    queue of wake-ups: "fail",
                                                                             "ask:<qid>", "stop"
    P/q/n                   askers (add 1)           askers                  whereabouts query ids
    P/where/<qid>/<rank>    <rank>'s listener        the asker               JSON {call, stack}
    P/hb/<rank>             <rank>'s heartbeat       <rank - 1>'s heartbeat  counter; +LEFT once it finalized
    P/left/n                every rank at finalize   the store's host        ranks that finished cleanly
    P/sync/<g>/<seq>/n      members of a store sync  the same                arrivals + signature checksum
    P/sync/<g>/<seq>/go     the last arrival         every member            "ok" | "failed" | "abort"

Rules:

* **The root cause is seq 1.** A poster takes its seq from ``add(P/fail/n, 1)`` then writes
  ``P/fail/<seq>``; the store's counter orders failures exactly, unlike wall-clock stamps.
  Every later record is a consequence, kept for the report.
* **Push, not poll.** After writing its record a poster pushes ``"fail"`` into every other
  rank's inbox. Each rank's listener thread blocks in ``queue_pop`` on its own connection
  and wakes within a store round trip (~0.2 ms on loopback).
* **A death without a record** is posted by whoever notices it, as a record *about* the
  dead rank with ``reporter`` set to the noticer: the ``tether.spawn`` parent (from the
  child's exit status, within milliseconds) or the dead rank's heartbeat neighbour (after
  ``lost_after`` seconds without a beat). The store's host vanishing is noticed by every
  connection at once (``DistNetworkError``) and needs no record: each rank raises
  ``PeerLost`` for "the store host".
* **Records are JSON, never pickle**: the store is unauthenticated.

Each ``Channel`` owns its client connections (``store.clone()``): a TCPStore client
serialises calls across threads, so the listener must never queue behind the main
thread's ``wait``.
"""

from __future__ import annotations

import contextlib
import datetime
import json
from collections.abc import Iterable, Sequence
from typing import cast

import torch.distributed as dist
from torch._C._distributed_c10d import Store

from .record import FailureRecord

LEFT = 1 << 40  # added to a heartbeat counter when its rank finalized cleanly

_FOREVER = datetime.timedelta(days=365)


def clone(store: Store) -> Store:
    """A new client connection to ``store`` (torch's stubs lack ``Store.clone``)."""
    return cast(Store, store.clone())  # type: ignore[attr-defined]


def job_prefix(job_id: str) -> str:
    return f"tether/{job_id}/"


class Channel:
    """One process's view of the failure channel.

    Args:
        store: a connection to the job's store; it is cloned, never used directly.
        job_id: names the job, so that a restarted job (or another job on the same store)
            never reads stale records.
        rank: this process's rank, or -1 for a launcher.
        world_size: number of ranks in the job.

    Cost: posting a failure is ``3 + N`` store operations; nothing is spent on the happy
    path except the heartbeats (see ``watchdog.py``).
    """

    def __init__(self, store: Store, job_id: str, rank: int, world_size: int) -> None:
        self.prefix = job_prefix(job_id)
        self.rank = rank
        self.world_size = world_size
        self._store = clone(store)  # posting, queries, reading records
        self._store.set_timeout(datetime.timedelta(seconds=30))

    def key(self, *parts: object) -> str:
        return self.prefix + "/".join(str(p) for p in parts)

    def listener_client(self) -> Store:
        """A fresh connection for a thread that blocks (the listener, the heartbeat)."""
        client = clone(self._store)
        client.set_timeout(_FOREVER)
        return client

    # --- failures -----------------------------------------------------------------

    def post(self, record: FailureRecord) -> FailureRecord:
        """Publish ``record`` and wake every rank. Returns it with its ``seq``."""
        seq = int(self._store.add(self.key("fail", "n"), 1))
        record = record.with_seq(seq)
        self._store.set(self.key("fail", seq), record.to_json())
        self.notify(r for r in range(self.world_size) if r != record.rank and r != self.rank)
        return record

    def notify(self, ranks: Iterable[int], message: str = "fail") -> None:
        for r in ranks:
            self._store.queue_push(self.key("inbox", r), message)

    def failure_count(self) -> int:
        return int(self._store.add(self.key("fail", "n"), 0))

    def records(self) -> list[FailureRecord]:
        """Every record posted so far, root cause first (a slot whose poster died is skipped)."""
        out = []
        for seq in range(1, self.failure_count() + 1):
            key = self.key("fail", seq)
            if self._store.check([key]):
                out.append(FailureRecord.from_json(self._store.get(key)))
        return out

    def record(self, seq: int, client: Store | None = None) -> FailureRecord | None:
        """Record ``seq``, or None if its slot is empty; ``client``: the caller's own connection."""
        store, key = client or self._store, self.key("fail", seq)
        return FailureRecord.from_json(store.get(key)) if store.check([key]) else None

    def root_cause(self, client: Store | None = None) -> FailureRecord | None:
        """The first failure: record 1, or the first readable one if its poster died mid-post."""
        root = self.record(1, client)
        if root is not None:
            return root
        records = self.records()
        return records[0] if records else None

    # --- whereabouts queries ------------------------------------------------------

    def ask_whereabouts(self, ranks: Sequence[int], answer_within: float) -> dict[int, str]:
        """Ask ``ranks`` what they are doing; returns rank -> answer for those that answered.

        A rank that does not answer within ``answer_within`` seconds is frozen, dead or
        busy in a call that holds the GIL; the caller reports it as such.
        """
        qid = int(self._store.add(self.key("q", "n"), 1))
        others = [r for r in ranks if r != self.rank]
        self.notify(others, f"ask:{qid}")
        keys = [self.key("where", qid, r) for r in others]
        with contextlib.suppress(dist.DistError):  # some did not answer: report what arrived
            self._store.wait(keys, datetime.timedelta(seconds=answer_within))
        answers: dict[int, str] = {}
        for r, k in zip(others, keys, strict=True):
            if self._store.check([k]):
                answers[r] = json.loads(self._store.get(k))["where"]
        return answers

    def answer(self, client: Store, qid: int, where: str) -> None:
        client.set(self.key("where", qid, self.rank), json.dumps({"version": 1, "where": where}))

    # --- leaving --------------------------------------------------------------------

    def leave(self) -> int:
        """Record that this rank finished cleanly; returns how many have."""
        self._store.add(self.key("hb", self.rank), LEFT)
        return int(self._store.add(self.key("left", "n"), 1))

    def left_count(self) -> int:
        return int(self._store.add(self.key("left", "n"), 0))
