"""Who is alive, judged where no GIL can block the judge: the operating system.

A rank is **lost** only when its process is gone or stopped, or its whole node went
silent. A rank that is merely busy -- even in one C call that holds the GIL for minutes --
is never lost: nothing here reads a heartbeat from a rank's own Python threads.

* **Processes, from /proc.** Every rank registers its rank, pid, host and pid namespace
  (``channel.register``). A judge on the same host, in the same pid namespace, reads
  ``/proc/<pid>/stat``. (A host's name alone is not enough: containers that share it
  have pid namespaces of their own; a pid from another one names another process, or none.)

  - gone (no entry, or a zombie), and ``P/done/<rank>`` unset: the process ended without
    posting anything (SIGKILL, a crash, ``os._exit`` with a code other than 0:
    ``ending._os_exit``). Found within one judging period:
    0.2 s for ``tether.spawn``'s launcher (whose process sentinel usually fires first),
    0.5 s for a rank's keeper (under torchrun the agent's SIGTERM, 0.1 s after the death,
    usually makes the survivors judge at once: ``Watchdog.sweep``).
  - stopped (state ``T``: SIGSTOP, or ``t``: a tracer) for longer than ``lost_after``:
    frozen. The judge posts the loss and then SIGKILLs the process, which cannot
    recover the job and would otherwise outlive it (torchrun waits 30 s between its
    SIGTERM and SIGKILL, and a stopped process does not act on SIGTERM).

  The judges are ``tether.spawn``'s launcher for its children, and under every other
  launcher each rank's keeper thread for the other ranks of its host. A rank whose
  process hosts the job's store (rank 0 under plain ``env://``) is judged stopped by
  ``StoreHostWatch`` instead, on a thread of its own, without the store. A judge that is
  itself blocked (its main thread holds the GIL) only judges later; it never judges
  wrongly, because what it reads is the OS's state, not a beat.
* **The store, from its own answers.** A store whose host is frozen or cut off from
  this one leaves every store operation waiting, with no /proc to read from another
  host. Every rank that does not host the store asks its server to answer
  (``StoreAnswerWatch``, a TCPStore PING on a socket of its own, every 0.5 s): silent
  for ``store_silent_after(lost_after)``, it is lost. The server answers from a C++
  thread of its own, without the GIL of the process hosting it, so only a stopped or
  unreachable host goes silent.
* **Nodes, from heartbeats.** With more than one node, each node beats ``P/node/<n>``
  every ``heartbeat`` seconds and watches the next node of a ring: a node silent for
  ``lost_after`` is lost with all its ranks. Two store operations per node per beat,
  whatever the number of nodes. Under ``tether.spawn`` the launcher beats; under any
  other launcher a process that local rank 0 starts (``beater.py``), for as long as
  that rank's process lives and is not stopped. No GIL can delay either: when local
  rank 0's keeper thread beat, 7 s in one C call that held its GIL ended a healthy
  two-node job (``tests/test_two_nodes.py``). Should the beater die, the keeper beats
  again. A node that never beat is not judged.
* **Stalls** (alive, not arriving) are not losses: ``SyncTimeout`` and stall reports
  (``waits.py``) deal with them.

Several judges may see the same loss; the first to ``claim_loss`` posts it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from torch._C._distributed_c10d import Store

from . import errorfile
from .beater import process_state, stopped
from .channel import Channel
from .record import FailureRecord, lost_record
from .stores import StorePing, cut_connections, tcp_store

_HOST = socket.gethostname()  # a judge sees the processes of its own host only


def pid_namespace() -> str:
    """This process's pid namespace (``pid:[4026531836]``), or "" where /proc does not say.

    Two processes with the same host name may see different pids: containers that share
    their machine's name, as Kubernetes pods with ``hostNetwork`` do, each have a pid
    namespace of their own. A pid read from another namespace's rank names some other
    process here, or none: judged from this /proc, a healthy rank would be "gone".
    """
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def running_here(channel: Channel, ranks: Sequence[int], client: Store | None = None) -> set[int]:
    """Of ``ranks``, those whose process runs on this host, neither gone nor stopped (one
    store read, one /proc read each).

    Such a rank is alive, however long it stays silent: busy in a call that holds the GIL,
    or slow on a loaded machine. Nothing may post it lost for its silence alone.
    """
    pids = channel.host_pids(_HOST, pid_namespace(), client)
    return {r for r in ranks if r in pids and (state := process_state(pids[r])) is not None and not stopped(state)}


def node_beats(channel: Channel, nodes: set[int], client: Store | None = None) -> dict[int, int]:
    """node -> its heartbeat's count now (``NodeWatch``; one store operation per node)."""
    store = tcp_store(client or channel.connection)
    return {n: int(store.add(channel.key("node", n), 0)) for n in nodes}


@dataclass
class PeerJudge:
    """Judges processes on this host from the OS; ``check`` returns the losses it found.

    Args:
        channel: the job's channel (for ``done`` marks and loss claims).
        lost_after: seconds a process may stay stopped before it is lost.
        clock: monotonic seconds (injectable for tests).
        pids: rank -> pid to judge; a rank judge fills it from its host's registrations.
        kill: SIGKILL a frozen process once its loss is posted.
        deaths: judge processes that are gone too (False: only stopped ones).
    """

    channel: Channel
    lost_after: float
    clock: Callable[[], float]
    pids: dict[int, int] = field(default_factory=dict)
    kill: bool = True
    deaths: bool = True
    store_host: int = -1  # a rank whose process hosts the store: StoreHostWatch judges it stopped
    lost: set[int] = field(default_factory=set)  # ranks this judge found lost (posted by it or another)
    _stopped_since: dict[int, float] = field(default_factory=dict)
    _judged: set[int] = field(default_factory=set)

    def check(self, client: Store, now: bool = False) -> list[FailureRecord]:
        """One look at every watched process; returns the records this judge must post.

        ``now``: the caller needs a verdict at once (``HostJudge`` then refreshes its pids).
        """
        found = []
        t = self.clock()
        for rank, pid in list(self.pids.items()):
            if rank in self._judged:
                continue
            state = process_state(pid)
            if state is None and not self.deaths:
                continue  # its launcher reads the exit status, which says more (the signal, the code)
            if state is None:
                self._judged.add(rank)
                if self.channel.done(rank, client) is not None:
                    continue  # it ended after telling (a clean exit, or its own failure posted)
                self.lost.add(rank)  # whoever wins the claim posts it; the others get the record
                if self.channel.claim_loss(rank, client):
                    message = "its process ended without a word (killed by a signal, crashed, or os._exit)"
                    found.append(lost_record(rank, message, self.channel.rank, pid=pid, host=_HOST))
            elif stopped(state) and rank == self.store_host:
                continue  # asking the store would wait on it: StoreHostWatch's verdict
            elif stopped(state):
                since = self._stopped_since.setdefault(rank, t)
                if t - since >= self.lost_after:
                    self._judged.add(rank)
                    self.lost.add(rank)
                    message = f"frozen: its process has been stopped (state {state}) for {t - since:.1f} s"
                    record = lost_record(rank, message, self.channel.rank, pid=pid, host=_HOST)
                    if self.channel.claim_loss(rank, client):
                        found.append(record)
                    if self.kill:
                        # its error file first, so that torchrun's "Root Cause" tells the story, not
                        # only SIGKILL: by every judge, the claim's winner or not. A loser that
                        # killed at once beat the winner's write, and torchrun, reading the file as
                        # it saw the death, had none (pytest --full, 2026-12-07)
                        errorfile.write_for(pid, record.headline, int(record.time))
                        with contextlib.suppress(OSError):
                            os.kill(pid, signal.SIGKILL)
            else:
                self._stopped_since.pop(rank, None)
        return found


@dataclass
class NodeWatch:
    """Beats this node's counter and finds other nodes that went silent.

    The counters live on the ``TCPStore`` beneath any ``PrefixStore`` (``tcp_store``),
    where a ``beater`` process (``beater.py``) beats them too. While this node's beater
    runs, this watch only judges.
    """

    channel: Channel
    node: int
    nnodes: int
    nproc_per_node: int
    lost_after: float
    clock: Callable[[], float]
    beats: bool = True
    beater: subprocess.Popen[bytes] | None = None  # beats for this node, from a process of its own
    _seen: dict[int, tuple[int, float]] = field(default_factory=dict)
    _judged: set[int] = field(default_factory=set)

    def check(self, client: Store) -> list[FailureRecord]:
        """Beat this node; judge the next node of the ring (each node watches one: O(1) per node)."""
        if self.nnodes <= 1:
            return []
        if self.beats and (self.beater is None or self.beater.poll() is not None):
            self.beat(client)  # no beater, or it ended (killed): beating from here is better than none
        other = (self.node + 1) % self.nnodes
        if other in self._judged:
            return []
        silent = self.silent_for(other, client)
        if silent is None or silent <= self.lost_after:
            return []  # beating, not started yet, or not silent for long enough
        self._judged.add(other)
        if not self.channel.claim_loss(-1000 - other, client):
            return []
        first = other * self.nproc_per_node
        message = (
            f"node {other} (ranks {first}-{first + self.nproc_per_node - 1}) lost: "
            f"no heartbeat for {silent:.1f} s (its host is down or unreachable)"
        )
        return [lost_record(first, message, self.channel.rank, exc_type="NodeLost")]

    def beat(self, client: Store) -> None:
        """One heartbeat of this node (one store operation)."""
        tcp_store(client).add(self.channel.key("node", self.node), 1)

    def close(self) -> None:
        """End this node's beater, if it runs (a second at most)."""
        if self.beater is not None and self.beater.poll() is None:
            self.beater.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.beater.wait(timeout=1.0)

    def silent_for(self, other: int, client: Store) -> float | None:
        """Seconds node ``other``'s heartbeat has not moved, as seen by this watch's reads
        (one store operation); None when it moved since the last read, or never beat."""
        now = self.clock()
        value = int(tcp_store(client).add(self.channel.key("node", other), 0))
        last, since = self._seen.get(other, (-1, now))
        if value != last:
            self._seen[other] = (value, now)
            return None
        return None if value == 0 else now - since


@dataclass
class HostJudge(PeerJudge):
    """A rank's judge of the other ranks of its host; learns their pids from the store.

    Until every expected rank registered it looks again after 0.2 s, doubling up to 5 s
    (one store read per look); ``check(..., now=True)`` looks at once (a sweep on SIGTERM).
    """

    host: str = ""
    pidns: str = ""  # this rank's pid namespace: only ranks in it are this judge's to judge
    expected: int = 0
    _next_look: float = 0.0
    _interval: float = 0.2

    def check(self, client: Store, now: bool = False) -> list[FailureRecord]:
        t = self.clock()
        if len(self.pids) < self.expected and (now or t >= self._next_look):
            self._next_look, self._interval = t + self._interval, min(self._interval * 2, 5.0)
            self.learn(client)
        return super().check(client, now)

    def learn(self, client: Store | None = None) -> None:
        """Read the registrations of this host's ranks (one or two store operations).

        ``runtime.start`` calls it once the group is made, when every rank has registered:
        a store host that freezes right after cannot be judged without its pid
        (``StoreHostWatch``), and a later look would wait on the frozen store.
        """
        mine = self.channel.rank
        self.pids.update({r: p for r, p in self.channel.host_pids(self.host, self.pidns, client).items() if r != mine})


class StoreHostWatch:
    """Finds the process hosting the job's store frozen, with no store operation.

    When that process is stopped, every store operation waits until it resumes, whatever
    the client's timeout (measured, torch 2.13: a TCPStore ``add`` to a SIGSTOPped server
    had not returned after 120 s, with a 2 s timeout). The keeper, whose judging claims a
    loss on the store, would wait with it, and with it every rank. So a rank on the store
    host's host watches that process from /proc alone, on a thread of its own
    (``Watchdog``): stopped for ``lost_after``, it is lost. Each such rank finds it
    itself, needing nobody's claim, and kills it; its closing connections then wake every
    operation still blocked on the store, on every rank of every host, as when the store's
    host dies (F7). A rank whose store connection closed that way before its own look
    (another rank killed the process first) gets the same story from ``seen_frozen``.

    Args:
        judge: the keeper's judge, whose ``pids`` (learned from the store while it still
            answered) give the store host's process.
        rank: the store host's rank.
        lost_after: seconds the process may stay stopped.
        clock: monotonic seconds.
        kill: SIGKILL the frozen process (it cannot resume the job: its peers are leaving).
    """

    def __init__(
        self, judge: PeerJudge, rank: int, lost_after: float, clock: Callable[[], float], kill: bool = True
    ) -> None:
        self._judge = judge
        self.rank = rank
        self._lost_after = lost_after
        self._clock = clock
        self._kill = kill
        self._lock = threading.Lock()  # the watch's thread looks; a thread whose connection closed asks
        self._since: tuple[float, str] | None = None  # when it was first seen stopped, in which state
        self._record: FailureRecord | None = None

    def check(self) -> FailureRecord | None:
        """One look; the loss, once, when the process has been stopped for ``lost_after``."""
        with self._lock:
            pid = self._judge.pids.get(self.rank)
            if pid is None or self._record is not None:
                return None
            state, now = process_state(pid), self._clock()
            if not stopped(state):
                self._since = None if state is not None else self._since
                return None
            if self._since is None:
                self._since = (now, str(state))
            if now - self._since[0] < self._lost_after:
                return None
            return self._frozen(pid, now)

    def seen_frozen(self) -> FailureRecord | None:
        """The loss, if this watch saw the process stopped and it is now gone or still stopped;
        asked by a rank whose store connection just closed (no store operation)."""
        with self._lock:
            pid = self._judge.pids.get(self.rank)
            if self._record is not None or pid is None or self._since is None:
                return self._record
            state = process_state(pid)
            return self._frozen(pid, self._clock()) if state is None or stopped(state) else None

    def _frozen(self, pid: int, now: float) -> FailureRecord:
        assert self._since is not None
        since, state = self._since
        message = (
            f"frozen: its process has been stopped (state {state}) for {now - since:.1f} s; "
            "it hosts the job's store, on which every rank then waited"
        )
        record = lost_record(self.rank, message, self._judge.channel.rank, pid=pid, host=_HOST)
        self._judge.lost.add(self.rank)
        if self._kill and process_state(pid) is not None:
            errorfile.write_for(pid, record.headline, int(record.time))  # torchrun's "Root Cause" says it
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        self._record = record
        return record


PING_WAIT = 0.2  # seconds a look waits for the store's answer (the next look waits on)
SILENT_MIN = 10.0  # the least silence taken for a lost store


def store_silent_after(lost_after: float) -> float:
    """How long the store may stay silent: twice ``lost_after``, and never under 10 s.

    Longer than the /proc judgement, which reads the OS's own state: a silence is
    inferred, and a whole job ends on it.
    """
    return max(2.0 * lost_after, SILENT_MIN)


class StoreAnswerWatch:
    """Finds the job's store silent, from any host: its host frozen, or cut off from this one.

    ``check`` asks the server (``stores.StorePing``); once the question has gone
    unanswered for ``silent_after``, the store is lost, once: this rank's connections to
    it are cut (``stores.cut_connections``), which wakes its threads blocked there (the
    main thread's store waits raise, and tell this story through ``seen_silent``). A
    connection the server closed is the store going (F7, told by the store's error); the
    watch then stops asking. A store is judged only once it has answered a ping
    (``StorePing.answers``): a server that never answers one (another store, another
    release), or whose first answer waits behind the reverse lookups of a job's start
    (``StorePing``), is not taken for a frozen one.

    Args:
        ping: a ping with a connection (``StorePing.connected``), answered or not yet.
        store: the store whose connections are cut.
        store_host: the rank hosting the store, or -1 for a launcher.
        reporter: this rank.
        silent_after: seconds without an answer.
    """

    def __init__(self, ping: StorePing, store: Store, store_host: int, reporter: int, silent_after: float) -> None:
        self._ping: StorePing | None = ping
        self._store = store
        self.store_host = store_host
        self._reporter = reporter
        self._silent_after = silent_after
        self._record: FailureRecord | None = None
        # the same connection on a second fd, kept past ``close`` for the rank's leave: it is
        # surely the group's own store's (``oldstore.py``), whatever listens on the port by then
        self._copy = ping.copy_connection()

    def check(self) -> FailureRecord | None:
        """One look; the loss, once, when the store has been silent for ``silent_after``."""
        ping = self._ping
        if ping is None or self._record is not None:
            return None
        silent = ping.silent_for(PING_WAIT)
        if silent is None:  # closed by the server: the store is going, and its error says so
            self.close()
            return None
        if silent < self._silent_after or not ping.answers:
            return None
        who = f"rank {self.store_host} (store host)" if self.store_host >= 0 else "the launcher hosting the store"
        message = (
            f"{who} lost: silent: the job's store has not answered for {silent:.1f} s; its host is "
            f"frozen, or cut off from this rank's ({_HOST})"
        )
        self._record = lost_record(self.store_host, message, self._reporter)
        self.close()
        cut_connections(self._store)
        return self._record

    def seen_silent(self) -> FailureRecord | None:
        """The loss, if this watch found it (asked by a rank whose store connection was cut)."""
        return self._record

    def take_copy(self) -> tuple[socket.socket, int] | None:
        """The copy of the ping's connection, with the store's port (``stores.StoreProbe.on``);
        the caller closes it. None once taken or dropped."""
        copy, self._copy = self._copy, None
        return copy

    def drop_copy(self) -> None:
        copy, self._copy = self._copy, None
        if copy is not None:
            with contextlib.suppress(OSError):
                copy[0].close()

    def close(self) -> None:
        if self._ping is not None:
            self._ping.close()
            self._ping = None
