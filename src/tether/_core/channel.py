"""The failure channel: a job-wide mailbox on the c10d store.

Protocol. ``P`` is the incarnation's prefix ``tether/<job id>/<gen>/``: the job id names the
job (torchrun's run id and restart count, a launcher's own store), and ``gen`` counts the
process groups this process has served on that store (see ``generation``), so nothing
written by an earlier incarnation on a store that outlives its groups (torchrun's agent
store) can release, fail or confuse a later one. ``N`` is the world size::

    key                     written by               read by                 meaning
    ----------------------  -----------------------  ----------------------  -------------------------------
    tether/<job>/inc/<r>    rank r (add 1)           rank r                  its incarnation count: <gen>
    P/fail/n                every poster (add 1)     posters                 order of failures: the counter
    P/fail/<seq>            the poster of <seq>      listeners, launcher     one FailureRecord, JSON
    P/inbox/<rank>          posters, the rank itself that rank's listener    queue of wake-ups: "fail",
                                                                             "ask:<qid>", "retire", "stop"
    P/pids/<host>           every rank (append)      judges on that host     "rank:pid," of its ranks
    P/done/<rank>           <rank> (set once)        judges, report          "left {json}" | "failed"
    P/left/ranks            every rank at finalize   waiters (after 0.5 s)   "3,1," ranks that finished
    P/emergency/claim       survivors (first wins)   --                      rank saving the emergency checkpoint
    P/emergency/state       that rank                its launcher, report    {"state": "saving", "budget": 30}
    P/lost/<rank>           judges (add 1)           judges                  first claim posts the loss
    P/node/<node>           that node's beater       other nodes' judges     heartbeat counter
    P/q/n                   askers (add 1)           askers                  whereabouts query ids
    P/where/<qid>/<rank>    <rank>'s listener        the asker (deletes it)  JSON {where, for: seconds in it,
                                                                             members, handling: crossed.py}
    P/left/n                every rank at finalize   the store's host        ranks that finished cleanly
    P/sync/<g>/<seq>/...    members of a sync        the same                see ``waits.py``
    P/checkpoint/<s>/<r>    rank r's save writer     rank 0's (deletes it)   its part of save <s>: see ``_ckpt_parts``

Rules:

* **The root cause is seq 1.** A poster takes its seq from ``add(P/fail/n, 1)`` then writes
  ``P/fail/<seq>``; the store's counter orders failures exactly, unlike wall-clock stamps.
  A reader that finds slot 1 still empty (its poster is between the two operations) waits
  for it up to ``ROOT_WAIT`` seconds, so two failures in the same millisecond still name
  one root cause everywhere; only a poster that died between its two operations leaves the
  slot empty, and then the first readable record is the root cause.
* **Push, not poll.** After writing its record a poster pushes ``"fail"`` into every other
  rank's inbox. Each rank's listener blocks in ``queue_pop`` on its own connection and
  wakes within a store round trip. A store without queues (a ``FileStore``) carries no
  channel: the runtime opens a TCPStore beside it (see ``runtime``), and a store that
  offers neither gets one warning and a polled channel (``has_queues``).
* **A death without a record** is posted by whoever notices it, as a record *about* the
  dead rank with ``reporter`` set to the noticer (``record.lost_record``): the
  ``tether.spawn`` parent from the exit status, or a judge on the same host from the OS
  (see ``liveness.py``); ``P/done/<rank>`` tells a death that follows its own post (or a
  clean exit) from one that left nothing. The store's host vanishing is noticed by every
  connection at once (``DistNetworkError``).
* **Retiring.** A rank whose process group is being destroyed pushes ``"retire"`` to every
  inbox before its store can go, so that the connection loss that follows is not taken
  for the store host's death.
* **Records are JSON, never pickle**: the store is unauthenticated.
* **Bounded keys.** Every key a sync, a query or a slow collective creates is deleted once
  read (see ``waits.py``); what stays is O(N) per incarnation, whatever the job's length.

Each ``Channel`` owns its client connections (``store.clone()``): a TCPStore client
serialises calls across threads, so the listener never queues behind the main thread.
No call here uses a store timeout: a timed-out c10d wait logs a warning, so waits that can
run out poll ``check`` instead.
"""

from __future__ import annotations

import datetime
import json
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import cast

from torch._C._distributed_c10d import Store

from .record import KIND_EXIT, KIND_LOST, KIND_SIGNAL, FailureRecord

FOREVER = datetime.timedelta(days=365)
# every connection ``clone`` made: tether's own, whose waits are never the user's (storewaits.py)
OWN_CONNECTIONS: weakref.WeakSet[Store] = weakref.WeakSet()
ROOT_WAIT = 2.0  # seconds a reader waits for record 1 when its counter is already taken


class Answers(dict[int, str]):
    """Whereabouts answers, rank -> where; ``seconds``: rank -> how long it had been in that
    call when it answered (only ranks inside a call)."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds: dict[int, float] = {}
        self.members: dict[int, tuple[int, ...]] = {}  # the ranks of a raw collective's group
        self.handling: dict[int, str] = {}  # the exception a rank was handling as it entered its call


def clone(store: Store) -> Store:
    """A new client connection to ``store`` (torch's stubs lack ``Store.clone``)."""
    client = cast(Store, store.clone())  # type: ignore[attr-defined]
    client.set_timeout(FOREVER)
    OWN_CONNECTIONS.add(client)
    return client


def clones(store: Store, n: int) -> list[Store]:
    """``n`` new connections to ``store``, opened at once, each on a thread of its own.

    c10d looks up the peer's address of a new connection at both ends (``stores.serve``):
    one after another, a rank's start waited for each lookup in turn. Opened together, the
    client's lookups overlap (``clone`` releases the GIL): under a resolver 0.5 s late,
    four took 2.0 s one after another and 0.5 s together on ``stores.serve``'s server, and
    4.0 and 2.5 s on c10d's own listener (torchrun's agent store), whose lookups, on its
    one thread, still come one at a time. Without a slow resolver: 1 and 2 ms. The first
    error raises, once every thread has ended.
    """
    if n <= 1:
        return [clone(store) for _ in range(n)]
    opened: list[Store | BaseException | None] = [None] * n

    def open_one(i: int) -> None:
        try:
            opened[i] = clone(store)
        except BaseException as exc:  # raised on the calling thread below
            opened[i] = exc

    threads = [threading.Thread(target=open_one, args=(i,), name="tether-connect", daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got in opened:
        if isinstance(got, BaseException):
            raise got
    return [cast(Store, got) for got in opened]


def generation(store: Store, job_id: str, rank: int) -> int:
    """This process's incarnation on ``store``: 1 for its first process group, 2 for the next...

    Every rank serves the same sequence of groups on a store, so every rank gets the same
    number without a collective. One store operation.
    """
    return int(store.add(f"tether/{job_id}/inc/{rank}", 1))


def has_queues(store: Store) -> bool:
    try:
        store.queue_len("tether/probe")
    except NotImplementedError:
        return False
    except Exception:
        return True  # another error (a PrefixStore forwards the call): the base store decides later
    return True


def wait_keys(store: Store, keys: Sequence[str], within: float, step: float = 0.005) -> bool:
    """Poll until every key exists, up to ``within`` seconds; no store timeout, no warning."""
    deadline = time.monotonic() + within
    while not store.check(list(keys)):
        if time.monotonic() >= deadline:
            return False
        time.sleep(step)
    return True


class Channel:
    """One process's view of the failure channel.

    Args:
        store: a connection to the job's store; it is cloned, never used directly.
        prefix: the incarnation's prefix, ``tether/<job id>/<gen>/`` (see ``prefix``).
        rank: this process's rank, or -1 for a launcher.
        world_size: number of ranks in the job.

    Cost: posting a failure is ``2 + N`` store operations; nothing is spent on the happy
    path (liveness is judged from the OS, see ``liveness.py``).
    """

    def __init__(self, store: Store, prefix: str, rank: int, world_size: int, *, spares: int = 0) -> None:
        self.prefix = prefix
        self.rank = rank
        self.world_size = world_size
        # posting, queries, reading records; and ``spares`` for ``client``, opened with it
        self._store, *self._spares = clones(store, 1 + spares)
        self.queues = has_queues(self._store)

    @staticmethod
    def make_prefix(job_id: str, gen: int) -> str:
        return f"tether/{job_id}/{gen}/"

    def key(self, *parts: object) -> str:
        return self.prefix + "/".join(str(p) for p in parts)

    def client(self) -> Store:
        """A connection of its own for a thread that blocks (the listener, the keeper) or for
        the main thread's syncs: one of the ``spares`` opened with the channel's, else a new
        one.

        Open it before that thread starts, while the store answers: a connect retries until
        this connection's timeout, ``FOREVER`` (``Watchdog.start``)."""
        return self._spares.pop() if self._spares else clone(self._store)

    @property
    def connection(self) -> Store:
        """The channel's own connection (posting, queries): open already, so using it never
        waits to connect to a store whose host may be gone, as ``client`` would."""
        return self._store

    # --- failures -----------------------------------------------------------------

    def post(self, record: FailureRecord) -> FailureRecord:
        """Publish ``record`` and wake every rank. Returns it with its ``seq``.

        The rank a record is about is woken too, unless it is gone (a death seen from
        outside): a rank named by another's timeout record is alive, and stalled.
        """
        seq = int(self._store.add(self.key("fail", "n"), 1))
        record = record.with_seq(seq)
        self._store.set(self.key("fail", seq), record.to_json())
        gone = record.kind in (KIND_LOST, KIND_SIGNAL, KIND_EXIT)
        self.notify(r for r in range(self.world_size) if r != self.rank and not (gone and r == record.rank))
        return record

    def notify(self, ranks: Iterable[int], message: str = "fail") -> None:
        if not self.queues:
            return  # a polled channel: listeners read the counter (see watchdog)
        for r in ranks:
            self._store.queue_push(self.key("inbox", r), message)

    def failure_count(self, client: Store | None = None) -> int:
        return int((client or self._store).add(self.key("fail", "n"), 0))

    def records(self, client: Store | None = None, *, wait: bool = True) -> list[FailureRecord]:
        """Every record posted so far, root cause first (a slot whose poster died is skipped).

        ``wait``: for record 1, up to ``ROOT_WAIT`` (see the rules); ``client``: the
        caller's own connection.
        """
        store = client or self._store
        count = self.failure_count(store)
        if count and wait:
            wait_keys(store, [self.key("fail", 1)], ROOT_WAIT)
        records = (self.record(seq, store) for seq in range(1, count + 1))
        return [record for record in records if record is not None]

    def record(self, seq: int, client: Store | None = None) -> FailureRecord | None:
        """Record ``seq``, or None if its slot is empty; ``client``: the caller's own connection."""
        store, key = client or self._store, self.key("fail", seq)
        return FailureRecord.from_json(store.get(key)) if store.check([key]) else None

    def root_cause(self, client: Store | None = None) -> FailureRecord | None:
        """The first failure: record 1 (waited for, see the rules), or the first readable one."""
        store = client or self._store
        if self.failure_count(store) == 0:
            return None
        if wait_keys(store, [self.key("fail", 1)], ROOT_WAIT):
            return self.record(1, store)
        # waited once: slot 1's poster died between its two operations. Until acb4f69 the
        # records were read after a second wait, on the channel's own connection: 4 s, not 2
        records = self.records(store, wait=False)
        return records[0] if records else None

    def claim_loss(self, rank: int, client: Store | None = None) -> bool:
        """True for the first judge to claim ``rank``'s loss: only it posts the record."""
        return int((client or self._store).add(self.key("lost", rank), 1)) == 1

    # --- whereabouts queries ------------------------------------------------------

    def ask_whereabouts(
        self, ranks: Sequence[int], answer_within: float, until: Callable[[], bool] = lambda: False
    ) -> Answers:
        """Ask ``ranks`` what they are doing; returns rank -> answer for those that answered.

        A rank that does not answer within ``answer_within`` seconds is frozen, dead or
        busy in a call that holds the GIL; the caller reports it as such. The answers are
        deleted once read. Costs ``2 + 3 * len(ranks)`` store operations and polls.
        """
        qid = int(self._store.add(self.key("q", "n"), 1))
        others = [r for r in ranks if r != self.rank]
        self.notify(others, f"ask:{qid}")
        keys = {r: self.key("where", qid, r) for r in others}
        deadline = time.monotonic() + answer_within
        answers = Answers()
        while keys and self.queues:
            for r, k in list(keys.items()):
                if self._store.check([k]):
                    answer = json.loads(self._store.get(k))
                    answers[r] = answer["where"]
                    if answer.get("for") is not None:
                        answers.seconds[r] = answer["for"]
                    if answer.get("members") is not None:
                        answers.members[r] = tuple(answer["members"])
                    if answer.get("handling"):
                        answers.handling[r] = answer["handling"]
                    self._store.delete_key(k)
                    del keys[r]
            if not keys or time.monotonic() >= deadline or until():  # until: the answer no longer matters
                break
            time.sleep(0.005)
        return answers

    def answer(
        self,
        client: Store,
        qid: int,
        where: str,
        seconds: float | None = None,
        members: Sequence[int] | None = None,
        handling: str = "",
    ) -> None:
        """Answer query ``qid``: ``where`` this rank is, and for how many ``seconds`` (None: in
        user code); in a raw collective, its group's ``members`` and the exception it was
        ``handling`` as it entered (``crossed.py``)."""
        answer = {"version": 1, "where": where, "for": seconds, "members": members, "handling": handling}
        client.set(self.key("where", qid, self.rank), json.dumps(answer))

    # --- this rank's registration and exit --------------------------------------------

    def register(self, host: str, pid: int, pidns: str = "") -> None:
        """Tell every rank where this rank runs: its host, pid and pid namespace (two store
        operations).

        The judges on ``host`` in namespace ``pidns`` read it (``host_pids``), as does a
        rank that posts another's failure (``placed``). Also creates the query counter, so
        that the store's key count is the same before and after the first whereabouts query.
        """
        self._store.append(self.key("placed"), f"{self.rank} {pid} {host} {pidns},")  # type: ignore[attr-defined]
        self._store.add(self.key("q", "n"), 0)

    def placed(self, rank: int, client: Store | None = None) -> tuple[str, int] | None:
        """``(host, pid)`` of ``rank`` as it registered (one store read); None if it did not.

        For a failure posted by another rank than the one it names (a timeout's staller,
        posted by a rank that waited for it): the report says where to look.
        """
        found = self.registered(client).get(rank)
        return None if found is None else (found[0], found[2])

    def host_pids(self, host: str, pidns: str, client: Store | None = None) -> dict[int, int]:
        """rank -> pid of the ranks registered so far on ``host`` in pid namespace ``pidns``,
        the ranks whose pids mean the same here (one store read)."""
        return {r: pid for r, (h, ns, pid) in self.registered(client).items() if (h, ns) == (host, pidns)}

    def registered(self, client: Store | None = None) -> dict[int, tuple[str, str, int]]:
        """rank -> (host, pid namespace, pid) of every rank registered so far."""
        store, key = client or self._store, self.key("placed")
        if not store.check([key]):
            return {}
        found = {}
        for item in store.get(key).decode().split(","):
            rank, pid, host, pidns = [*item.split(" ", 3), "", "", ""][:4]
            if rank.lstrip("-").isdigit() and pid.isdigit():
                found[int(rank)] = (host, pidns, int(pid))
        return found

    def mark_done(self, how: str, client: Store | None = None) -> None:
        """Record how this rank ends ("left" cleanly, or "failed" after posting its own record)."""
        (client or self._store).compare_set(self.key("done", self.rank), "", how)

    def done(self, rank: int, client: Store | None = None) -> str | None:
        store, key = client or self._store, self.key("done", rank)
        return store.get(key).decode() if store.check([key]) else None

    def wait_done(self, within: float, poll: float = 0.02) -> bool:
        """Wait up to ``within`` seconds until every other rank marked how it ended; whether
        they all did (one ``check`` of every key per ``poll``: a timed-out c10d wait logs)."""
        deadline = time.monotonic() + within
        keys = [self.key("done", r) for r in range(self.world_size) if r != self.rank]
        while keys and not self._store.check(keys):
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll)
        return True

    def leave(
        self, how: str = "called finalize()", seqs: Mapping[str, int] | None = None, lingers: bool = False
    ) -> int:
        """Record that this rank finished cleanly; returns how many have.

        ``how`` says it for people ("returned from the function"); ``seqs`` is this rank's
        last sync number per group, so that a rank still waiting in sync ``s`` of a group
        can tell a finished rank that never reached ``s`` (``finished``) from one that did;
        ``lingers``: its process does not end with it (a non-daemon thread runs on).
        """
        told = {"how": how, "seqs": dict(seqs or {}), "lingers": lingers}
        self.mark_done("left " + json.dumps(told, separators=(",", ":")))
        self._store.append(self.key("left", "ranks"), f"{self.rank},")  # type: ignore[attr-defined]
        return int(self._store.add(self.key("left", "n"), 1))

    def claim_emergency(self, rank: int, window: float) -> bool:
        """Offer to write the emergency checkpoint; True for the one rank that writes it.

        Every consistent survivor appends its rank to the offers, waits ``window`` seconds
        (survivors learn of a failure within milliseconds of each other), and the lowest
        offer then claims the save with ``compare_set``. A survivor that offers after the
        claim was taken loses even if it is lower: never two writers.
        """
        offers = self.key("emergency", "offers")
        self._store.append(offers, f"{rank},")  # type: ignore[attr-defined]
        time.sleep(window)
        lowest = min(int(r) for r in self._store.get(offers).decode().split(",") if r)
        if lowest != rank:
            return False
        key = self.key("emergency", "claim")
        return self._store.compare_set(key, "", str(rank)).decode() == str(rank)

    def announce_emergency(self, state: str, budget: float) -> None:
        """Say how the emergency save goes: "saving" (for ``budget`` seconds), "saved: ...", "failed: ..."."""
        self._store.set(self.key("emergency", "state"), json.dumps({"state": state, "budget": budget}))

    def emergency(self, client: Store | None = None) -> tuple[str, float] | None:
        """The emergency save's state and budget, if one was claimed."""
        store, key = client or self._store, self.key("emergency", "state")
        if not store.check([key]):
            return None
        data = json.loads(store.get(key).decode())
        return str(data["state"]), float(data["budget"])

    def left(self, client: Store | None = None) -> set[int]:
        """The ranks that finished cleanly (one store read)."""
        store, key = client or self._store, self.key("left", "ranks")
        if not store.check([key]):
            return set()
        return {int(item) for item in store.get(key).decode().split(",") if item}

    def finished(self, client: Store | None = None) -> dict[int, tuple[str, dict[str, int], bool]]:
        """The ranks that finished cleanly: rank -> (how, last sync number per group, lingers)."""
        store = client or self._store
        found = {}
        for rank in self.left(store):
            done = self.done(rank, store) or ""
            info = json.loads(done[len("left ") :]) if done.startswith("left {") else {}
            how, seqs = str(info.get("how", "finished")), dict(info.get("seqs", {}))
            found[rank] = (how, seqs, bool(info.get("lingers")))
        return found
