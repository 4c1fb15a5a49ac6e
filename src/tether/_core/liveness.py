"""Who is alive, judged where no GIL can block the judge: the operating system.

A rank is **lost** only when its process is gone or stopped, or its whole node went
silent. A rank that is merely busy -- even in one C call that holds the GIL for minutes --
is never lost: nothing here reads a heartbeat from a rank's own Python threads.

* **Processes, from /proc.** Every rank registers ``rank:pid`` under its host's key
  (``channel.register``). A judge on the same host reads ``/proc/<pid>/stat``:

  - gone (no entry, or a zombie), and ``P/done/<rank>`` unset: the process ended without
    posting anything (SIGKILL, a crash, ``os._exit``). Found within one judging period:
    0.2 s for ``tether.spawn``'s launcher (whose process sentinel usually fires first),
    0.5 s for a rank's keeper (under torchrun the agent's SIGTERM, 0.1 s after the death,
    usually makes the survivors judge at once: ``Watchdog.sweep``).
  - stopped (state ``T``: SIGSTOP, or ``t``: a tracer) for longer than ``lost_after``:
    frozen. The judge posts the loss and then SIGKILLs the process, which cannot
    recover the job and would otherwise outlive it (torchrun waits 30 s between its
    SIGTERM and SIGKILL, and a stopped process does not act on SIGTERM).

  The judges are ``tether.spawn``'s launcher for its children, and under every other
  launcher each rank's keeper thread for the other ranks of its host. A judge that is
  itself blocked (its main thread holds the GIL) only judges later; it never judges
  wrongly, because what it reads is the OS's state, not a beat.
* **Nodes, from heartbeats.** With more than one node, each node beats ``P/node/<n>``
  every ``heartbeat`` seconds (its launcher under ``tether.spawn``; its local rank 0's
  keeper thread otherwise) and watches the next node of a ring: a node silent for
  ``lost_after`` is lost with all its ranks. Two store operations per node per beat,
  whatever the number of nodes. This is the one judgement that a beat
  decides, and so the one a GIL can delay: under torchrun a node whose every rank holds
  the GIL for ``lost_after`` would be taken for lost. Under ``tether.spawn`` the
  launcher beats, and a busy rank cannot delay it.
* **Stalls** (alive, not arriving) are not losses: ``SyncTimeout`` and stall reports
  (``waits.py``) deal with them.

Several judges may see the same loss; the first to ``claim_loss`` posts it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

from torch._C._distributed_c10d import Store

from . import errorfile
from .channel import Channel
from .record import FailureRecord, lost_record

_HOST = socket.gethostname()  # a judge sees the processes of its own host only


def process_state(pid: int) -> str | None:
    """The state letter of ``pid`` in /proc (``R``, ``S``, ``T``...), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fp:
            stat = fp.read()
    except OSError:
        return None
    state = stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3].decode()
    return None if state in ("Z", "X") else state


def stopped(state: str | None) -> bool:
    return state in ("T", "t")


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
            elif stopped(state):
                since = self._stopped_since.setdefault(rank, t)
                if t - since >= self.lost_after:
                    self._judged.add(rank)
                    self.lost.add(rank)
                    if self.channel.claim_loss(rank, client):
                        message = f"frozen: its process has been stopped (state {state}) for {t - since:.1f} s"
                        record = lost_record(rank, message, self.channel.rank, pid=pid, host=_HOST)
                        found.append(record)
                        if self.kill:  # so that torchrun's "Root Cause" tells the story, not only SIGKILL
                            errorfile.write_for(pid, record.headline, int(record.time))
                    if self.kill:
                        with contextlib.suppress(OSError):
                            os.kill(pid, signal.SIGKILL)
            else:
                self._stopped_since.pop(rank, None)
        return found


@dataclass
class NodeWatch:
    """Beats this node's counter and finds other nodes that went silent."""

    channel: Channel
    node: int
    nnodes: int
    nproc_per_node: int
    lost_after: float
    clock: Callable[[], float]
    beats: bool = True
    _seen: dict[int, tuple[int, float]] = field(default_factory=dict)
    _judged: set[int] = field(default_factory=set)

    def check(self, client: Store) -> list[FailureRecord]:
        """Beat this node; judge the next node of the ring (each node watches one: O(1) per node)."""
        if self.nnodes <= 1:
            return []
        if self.beats:
            client.add(self.channel.key("node", self.node), 1)
        other = (self.node + 1) % self.nnodes
        if other in self._judged:
            return []
        now = self.clock()
        value = int(client.add(self.channel.key("node", other), 0))
        last, since = self._seen.get(other, (-1, now))
        if value != last:
            self._seen[other] = (value, now)
            return []
        if value == 0 or now - since <= self.lost_after:
            return []  # not started yet, or not silent for long enough
        self._judged.add(other)
        if not self.channel.claim_loss(-1000 - other, client):
            return []
        first = other * self.nproc_per_node
        message = (
            f"node {other} (ranks {first}-{first + self.nproc_per_node - 1}) lost: "
            f"no heartbeat for {now - since:.1f} s (its host is down or unreachable)"
        )
        return [lost_record(first, message, self.channel.rank, exc_type="NodeLost")]


@dataclass
class HostJudge(PeerJudge):
    """A rank's judge of the other ranks of its host; learns their pids from the store.

    Until every expected rank registered it looks again after 0.2 s, doubling up to 5 s
    (one store read per look); ``check(..., now=True)`` looks at once (a sweep on SIGTERM).
    """

    host: str = ""
    expected: int = 0
    _next_look: float = 0.0
    _interval: float = 0.2

    def check(self, client: Store, now: bool = False) -> list[FailureRecord]:
        t = self.clock()
        if len(self.pids) < self.expected and (now or t >= self._next_look):
            self._next_look, self._interval = t + self._interval, min(self._interval * 2, 5.0)
            mine = self.channel.rank
            self.pids.update({r: p for r, p in self.channel.host_pids(self.host, client).items() if r != mine})
        return super().check(client, now)
