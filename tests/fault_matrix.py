"""The fault matrix as data: one row per case (DESIGN.md, failure model F1-F8).

A row says: which *failure* (see ``_faults.FAILURES``) strikes which rank (``striker``),
at which *place* (``_faults.PLACES``), under which *launcher*, with how many ranks; and
what must follow:

* ``expect``: the exception type(s) every surviving rank raises (their RESULT lines);
  a ``PeerFailure``/``PeerLost`` must name the root cause's rank, a ``SyncTimeout`` must
  list the striker as missing, a ``SyncMismatch`` must show the striker's call;
* ``root``: the root cause that must be printed exactly once: (rank or None for "any
  rank", exception type, message fragment); None only where the process that prints it
  is the one killed (F7 under ``tether.spawn``: the launcher itself);
* ``bound``: seconds for the whole job, start-up included (generous: the test machine
  has 2 cores shared with other jobs); ``detect``: seconds from the strike to the last
  survivor's exception, the promise's own bound (None: no strike time, e.g. mismatch).

Launchers: ``spawn`` (``tether.spawn``, which hosts the store in the launcher),
``parallel`` (``tether.Parallel`` under torchrun), ``initialize`` (``tether.initialize``
under torchrun; the static rendezvous sets ``TORCHELASTIC_USE_AGENT_STORE=True``, so the
agent hosts the store) and ``initialize-rank0`` (torchrun with the c10d rendezvous and
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: ``TORCHELASTIC_USE_AGENT_STORE=False`` and rank 0
hosts the store, the only set-up where F7 can strike a rank, and where F4 freezes the
store with the rank).

Rows with ``full=True`` run only with ``pytest --full``. The default set covers every
failure kind (F1-F8) and every launcher, mostly at 4 ranks. Adding a case is one line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

TORCHRUN = ("parallel", "initialize", "initialize-rank0")

# The watchdog timings every row runs with (see _faults.Case): heartbeat 0.5 s, lost after
# 2 s, grace 3 s. Detection bounds below are in terms of these.
LOST_AFTER = 2.0
PUSH = 6.0  # a posted failure reaches every rank within ms; the slack is for a loaded machine
HEARTBEAT = LOST_AFTER + 0.5 + PUSH
STALL_TIMEOUT = 3.0

# Under torchrun the agent polls its workers every 0.1 s and SIGTERMs the survivors as soon
# as one worker process ended: before a heartbeat (lost_after) can tell that a rank died
# without a record (SIGKILL, os._exit, segfault). tether's SIGTERM hook then asks every rank
# where it is (answer_within = 1 s) and raises PeerLost for the one that does not answer.
WHEREABOUTS = 1.0 + PUSH


@dataclass(frozen=True)
class Row:
    fid: str  # F1..F8
    failure: str
    place: str
    launcher: str
    nproc: int
    striker: int
    expect: tuple[str, ...]
    root: tuple[int | None, str, str] | None
    bound: float
    detect: float | None
    full: bool = False
    xfail: str | None = None
    timeout: float | None = None
    mismatch: str = "barrier"
    victim_exc: str | None = None  # what the striking rank itself raises, where it lives on
    grace: float = 3.0  # the watchdog's grace (_faults.Case); STORE_ERROR_GRACE where the store's host goes
    survivors: tuple[int, ...] | None = field(default=None)  # None: every rank but the striker

    @property
    def id(self) -> str:
        extra = f"-{self.mismatch}" if self.failure == "mismatch" else ""
        return f"{self.fid}-{self.failure}{extra}-{self.place}-{self.launcher}-{self.nproc}r"

    def surviving_ranks(self) -> tuple[int, ...]:
        if self.survivors is not None:
            return self.survivors
        return tuple(r for r in range(self.nproc) if r != self.striker)

    def param(self) -> object:
        marks = [pytest.mark.timeout(self.bound + 40)]  # the harness kills the job at bound; then settle
        if self.full:
            marks.append(pytest.mark.full)
        if self.xfail is not None:
            marks.append(pytest.mark.xfail(strict=True, reason=self.xfail))
        return pytest.param(self, id=self.id, marks=marks)


def raise_(fid: str, place: str, launcher: str, nproc: int, striker: int, **kw: Any) -> Row:
    """An exception on ``striker``: every other rank raises PeerFailure naming it."""
    root = (striker, "ValueError", f"injected fault on rank {striker}")
    return Row(fid, "raise", place, launcher, nproc, striker, ("PeerFailure",), root, victim_exc="ValueError", **kw)


def death(failure: str, place: str, launcher: str, nproc: int, striker: int, **kw: Any) -> Row:
    """A death without a record: PeerLost naming the dead rank."""
    if launcher == "spawn":
        root = {
            "exit": (striker, "SystemExit", "process exited with code 3"),
            "sigkill": (striker, "SIGKILL", "process killed by SIGKILL"),
            "segfault": (striker, "SIGSEGV", "process killed by SIGSEGV"),
        }[failure]
    else:  # torchrun's Root Cause block: rank, exit code / signal
        root = {
            "exit": (striker, "exitcode  : 3 ", ""),
            "sigkill": (striker, "(SIGKILL)", "Signal 9 (SIGKILL) received"),
            "segfault": (striker, "(SIGSEGV)", "Signal 11 (SIGSEGV) received"),
        }[failure]
    return Row("F3", failure, place, launcher, nproc, striker, ("PeerLost",), root, **kw)


def freeze(place: str, launcher: str, nproc: int, striker: int, **kw: Any) -> Row:
    """SIGSTOP: a judge on its host (the launcher, or a rank) sees it stopped for ``lost_after``."""
    root = (striker, "Lost", "frozen: its process has been stopped (state T)")
    return Row("F4", "sigstop", place, launcher, nproc, striker, ("PeerLost",), root, **kw)


def stall(place: str, launcher: str, nproc: int, striker: int, **kw: Any) -> Row:
    """The striker never arrives; the others' ``timeout=`` expires: SyncTimeout everywhere.

    The root cause is the striker, in tether's report and in torchrun's (the striker writes
    its error file once the verdict names it: ``failures.blamed``).
    """
    root = (striker, "SyncTimeout", f"rank(s) [{striker}] did not arrive")
    kw.setdefault("timeout", STALL_TIMEOUT)
    kw.setdefault("detect", STALL_TIMEOUT + PUSH)
    return Row("F5", "stall", place, launcher, nproc, striker, ("SyncTimeout",), root, **kw)


def mismatch(kind: str, launcher: str, nproc: int, striker: int, **kw: Any) -> Row:
    """The striker enters another sync (or another target): SyncMismatch on every rank."""
    root = (None, "SyncMismatch", "ranks entered different syncs")
    return Row(
        "F6",
        "mismatch",
        "outside",
        launcher,
        nproc,
        striker,
        ("SyncMismatch",),
        root,
        mismatch=kind,
        survivors=tuple(range(nproc)),
        **kw,
    )


def stop(failure: str, place: str, launcher: str, nproc: int, striker: int, **kw: Any) -> Row:
    """SIGTERM/SIGINT to one rank: its hook posts it; the others raise PeerFailure naming it."""
    exc, name = ("Terminated", "SIGTERM") if failure == "sigterm" else ("KeyboardInterrupt", "SIGINT")
    root = (striker, exc, f"stopped by {name}")
    return Row("F8", failure, place, launcher, nproc, striker, ("PeerFailure",), root, victim_exc=exc, **kw)


def host_lost(launcher: str, nproc: int, striker: int, **kw: Any) -> Row:
    """F7: the store's host is SIGKILLed.

    Under ``initialize-rank0`` rank 0 hosts it: every other rank raises PeerLost naming
    rank 0 (its store connections close at once), and torchrun names rank 0's SIGKILL.
    Under ``tether.spawn`` the launcher hosts it: killing the launcher must take every rank
    with it (PR_SET_PDEATHSIG); nobody is left to print a report, as the launcher that
    prints it is the process killed, so no survivor and no root cause are expected.
    """
    if launcher == "spawn":
        return Row("F7", "kill_host", "outside", launcher, nproc, striker, (), None, detect=None, survivors=(), **kw)
    root = (0, "(SIGKILL)", "Signal 9 (SIGKILL) received")
    kw.setdefault("grace", STORE_ERROR_GRACE)
    return Row("F7", "kill_host", "outside", launcher, nproc, striker, ("PeerLost",), root, **kw)


def launcher_stop(launcher: str, nproc: int, striker: int, **kw: Any) -> Row:
    """F8: SIGTERM to the ``tether.spawn`` launcher (sent by rank ``striker``).

    The launcher forwards it to every rank: each rank stops with its own Terminated, or with
    PeerFailure naming the rank whose Terminated was posted first. The launcher says "job
    stopped (SIGTERM)" with every rank's exit code, and exits 143 (no report, no restart).
    """
    root = (None, "Terminated", "stopped by SIGTERM")
    expect = ("Terminated", "PeerFailure")
    return Row(
        "F8", "term_launcher", "outside", launcher, nproc, striker, expect, root, survivors=tuple(range(nproc)), **kw
    )


# torch formats a store error's message with a reverse DNS lookup of the peer's address;
# this VM's resolver leaves about one lookup in 60 unanswered for its 5 s timeout. Where
# the store's host goes (F7, and F4 on it, whose judge kills it), every survivor's store
# operations fail at once, each after such a lookup: with a 3 s grace the ladder ended a
# survivor stuck 5 s in one (exit 6, no RESULT; seen on F7-kill_host-...-4r, 2026-12-03).
STORE_ERROR_GRACE = 8.0

B = 150.0  # whole-job bound: start-up of 4 ranks takes 10-45 s on this loaded 2-core machine
B_STOPPED = 200.0  # torchrun waits 30 s after its SIGTERM before it SIGKILLs a stopped worker

ROWS: list[Row] = [
    # issue 8: a fault while the others wait in DDP's backward (tether's communication hook)
    raise_("F2", "backward", "spawn", 2, 1, bound=B, detect=PUSH, full=True),  # default: test_training.py
    raise_("F2", "backward", "initialize", 4, 2, bound=B, detect=PUSH, full=True),
    death("sigkill", "backward", "spawn", 4, 3, bound=B, detect=PUSH, full=True),
    death("sigkill", "backward", "initialize", 2, 1, bound=B, detect=WHEREABOUTS, full=True),
    stall("backward", "spawn", 2, 1, bound=B),
    freeze("backward", "spawn", 2, 1, bound=B, detect=HEARTBEAT, full=True),
    stall("backward", "initialize", 4, 0, bound=B, full=True),
    # in the reducer of a DDP built without tether's hook: the others answer "in backward()"
    stall("ddp_hand", "initialize", 3, 1, bound=B),
    raise_("F2", "ddp_hand", "spawn", 3, 2, bound=B, detect=PUSH, full=True),
    # F1: exception inside one_rank_first's block on the working rank
    raise_("F1", "first", "spawn", 4, 0, bound=B, detect=PUSH),
    raise_("F1", "first", "parallel", 4, 0, bound=B, detect=PUSH, full=True),
    raise_("F1", "first", "initialize", 4, 2, bound=B, detect=PUSH, full=True),
    raise_("F1", "first", "spawn", 2, 1, bound=B, detect=PUSH, full=True),
    # F2: exception on one rank while the others wait in a collective
    raise_("F2", "outside", "parallel", 4, 2, bound=B, detect=PUSH),
    raise_("F2", "outside", "spawn", 4, 3, bound=B, detect=PUSH, full=True),
    raise_("F2", "outside", "initialize", 4, 1, bound=B, detect=PUSH, full=True),
    raise_("F2", "outside", "initialize", 2, 0, bound=B, detect=PUSH, full=True),
    # F3: death without a record
    death("sigkill", "outside", "spawn", 4, 2, bound=B, detect=PUSH),
    death("sigkill", "outside", "initialize", 4, 2, bound=B, detect=WHEREABOUTS),
    death("exit", "collective", "spawn", 4, 1, bound=B, detect=PUSH, full=True),
    death("segfault", "first", "spawn", 4, 0, bound=B, detect=PUSH, full=True),
    death("sigkill", "first", "spawn", 4, 0, bound=B, detect=PUSH, full=True),
    death("sigkill", "waiting", "spawn", 4, 3, bound=B, detect=PUSH, full=True),
    death("sigkill", "collective", "spawn", 4, 2, bound=B, detect=PUSH, full=True),
    death("sigkill", "outside", "parallel", 4, 1, bound=B, detect=WHEREABOUTS, full=True),
    death("exit", "outside", "initialize", 4, 3, bound=B, detect=WHEREABOUTS, full=True),
    death("exit", "first", "spawn", 2, 0, bound=B, detect=PUSH, full=True),
    death("segfault", "outside", "parallel", 4, 2, bound=B, detect=WHEREABOUTS, full=True),
    death("segfault", "waiting", "spawn", 2, 1, bound=B, detect=PUSH, full=True),
    # F4: freeze (SIGSTOP), found from /proc by a judge on the same host
    freeze("outside", "spawn", 4, 2, bound=B, detect=HEARTBEAT),
    freeze("first", "spawn", 4, 0, bound=B, detect=HEARTBEAT, full=True),
    freeze("collective", "spawn", 4, 1, bound=B, detect=HEARTBEAT, full=True),
    freeze("waiting", "spawn", 2, 1, bound=B, detect=HEARTBEAT, full=True),
    freeze("outside", "initialize", 4, 3, bound=B_STOPPED, detect=HEARTBEAT, full=True),
    # F5: stall past the others' timeout=
    stall("outside", "spawn", 4, 2, bound=B, full=True),  # default: stall in backward, DDP's ctor, ignite
    stall("first", "parallel", 4, 0, bound=B, full=True),
    stall("outside", "initialize", 4, 1, bound=B, full=True),
    stall("first", "spawn", 2, 0, bound=B, full=True),
    # F5 behind a raw wait: the striker's partner waits for it in dist.all_reduce on their own group
    stall("chain", "spawn", 4, 1, bound=B),
    stall("chain", "initialize", 2, 1, bound=B, full=True),
    raise_("F2", "chain", "initialize", 4, 2, bound=B, detect=PUSH, full=True),
    # F5 behind a point-to-point wait: the partner waits in dist.recv from the striker
    stall("p2p", "initialize", 2, 1, bound=B),
    stall("p2p", "spawn", 4, 2, bound=B, full=True),
    raise_("F2", "p2p", "spawn", 4, 3, bound=B, detect=PUSH, full=True),
    # F5 behind a collective with a root: the partner waits in dist.reduce to itself
    stall("rooted", "initialize", 2, 1, bound=B),
    stall("rooted", "spawn", 4, 3, bound=B, full=True),
    # A member fails before a group's creation: the others wait in gloo's rendezvous, in C++
    raise_("F2", "made", "spawn", 3, 1, bound=B, detect=PUSH, full=True),  # default: stall here, raise in mesh
    stall("made", "initialize", 3, 2, bound=B),
    death("sigkill", "made", "initialize", 4, 3, bound=B, detect=WHEREABOUTS, full=True),
    freeze("made", "spawn", 4, 2, bound=B, detect=HEARTBEAT, full=True),
    raise_("F2", "mesh", "initialize", 4, 3, bound=B, detect=PUSH),
    stall("mesh", "spawn", 4, 0, bound=B, full=True),
    # ... behind the wait on an async collective's work (ZeroRedundancyOptimizer's broadcasts)
    raise_("F2", "async", "initialize", 3, 1, bound=B, detect=PUSH),
    stall("async", "spawn", 2, 1, bound=B, full=True),
    # ... behind the wait on a point-to-point work (a pipeline stage's batch_isend_irecv)
    stall("irecv", "initialize", 2, 1, bound=B, full=True),  # default: test_training.py's pipeline stage
    stall("irecv", "spawn", 3, 2, bound=B, full=True),
    raise_("F2", "irecv", "spawn", 3, 1, bound=B, detect=PUSH, full=True),
    # ... behind the wait of torch's functional collectives (a DTensor's gather)
    # default: test_training.py's tensor-parallel forward, a raise and a stall
    raise_("F2", "dtensor", "spawn", 3, 1, bound=B, detect=PUSH, full=True),
    stall("dtensor", "initialize", 2, 1, bound=B, full=True),
    death("sigkill", "dtensor", "initialize", 3, 2, bound=B, detect=WHEREABOUTS, full=True),
    freeze("dtensor", "spawn", 2, 0, bound=B, detect=HEARTBEAT, full=True),
    # ... behind a wait on a store (store.get on torch's default store: storewaits.py)
    raise_("F2", "store", "initialize", 4, 2, bound=B, detect=PUSH),
    stall("store", "spawn", 2, 1, bound=B, full=True),  # default: test_store_waits.py
    death("sigkill", "store", "initialize", 3, 1, bound=B, detect=WHEREABOUTS, full=True),
    freeze("store", "spawn", 2, 0, bound=B, detect=HEARTBEAT, full=True),
    stop("sigterm", "store", "spawn", 3, 2, bound=B, detect=PUSH, full=True),
    # F6: mismatched syncs
    mismatch("barrier", "spawn", 4, 2, bound=B, detect=None, full=True),
    mismatch("first", "initialize", 4, 1, bound=B, detect=None),
    mismatch("barrier", "parallel", 2, 1, bound=B, detect=None, full=True),
    mismatch("first", "spawn", 4, 1, bound=B, detect=None, full=True),
    # F7: the store's host dies (see host_lost)
    host_lost("spawn", 4, 2, bound=B),
    host_lost("initialize-rank0", 4, 0, bound=B, detect=PUSH),
    host_lost("initialize-rank0", 2, 0, bound=B, detect=PUSH, full=True),
    # F4 on the store's host: every store operation waits on it (liveness.StoreHostWatch)
    freeze("outside", "initialize-rank0", 4, 0, bound=B, detect=HEARTBEAT, grace=STORE_ERROR_GRACE),
    freeze("first", "initialize-rank0", 4, 0, bound=B, detect=HEARTBEAT, grace=STORE_ERROR_GRACE),
    freeze("outside", "initialize-rank0", 2, 0, bound=B, detect=HEARTBEAT, grace=STORE_ERROR_GRACE, full=True),
    # the other failures of the rank that hosts the store
    raise_("F2", "outside", "initialize-rank0", 4, 0, bound=B, detect=PUSH, grace=STORE_ERROR_GRACE, full=True),
    raise_("F1", "first", "initialize-rank0", 4, 0, bound=B, detect=PUSH, grace=STORE_ERROR_GRACE, full=True),
    stop("sigterm", "outside", "initialize-rank0", 4, 0, bound=B, detect=PUSH, grace=STORE_ERROR_GRACE, full=True),
    stall("outside", "initialize-rank0", 4, 0, bound=B, grace=STORE_ERROR_GRACE, full=True),
    raise_("F2", "outside", "initialize-rank0", 4, 2, bound=B, detect=PUSH, grace=STORE_ERROR_GRACE, full=True),
    # F8: external stop
    stop("sigterm", "waiting", "spawn", 4, 2, bound=B, detect=PUSH),
    stop("sigint", "outside", "parallel", 4, 1, bound=B, detect=PUSH, full=True),
    stop("sigterm", "outside", "initialize", 4, 3, bound=B, detect=PUSH, full=True),
    stop("sigterm", "collective", "parallel", 4, 0, bound=B, detect=PUSH, full=True),
    stop("sigint", "waiting", "spawn", 4, 1, bound=B, detect=PUSH, full=True),
    stop("sigint", "first", "initialize", 4, 0, bound=B, detect=PUSH, full=True),
    launcher_stop("spawn", 4, 2, bound=B, detect=PUSH, full=True),
]
