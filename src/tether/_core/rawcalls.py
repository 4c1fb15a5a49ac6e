"""torch.distributed calls tether did not make: a name for where a rank waits, the true story when they fail.

A training job spends most of its waits outside tether: DDP's constructor (which
broadcasts rank 0's parameters and checks every rank's shapes), the user's own
``dist.all_reduce``, ignite's metrics. gloo cannot be woken from such a call (measured:
``ProcessGroup.abort()`` returns at once and leaves the call blocked), so tether bounds
and explains them instead:

* **Bounded**: with ``sync_timeout`` set, the process group tether creates gets the
  timeout ``sync_timeout + RAW_MARGIN`` once it exists (``runtime.start``), and so does
  every group made with ``dist.new_group``, ``new_subgroups`` or ``split_group`` without a
  ``timeout=`` of the user's, also by torch's own modules (DeviceMesh's subgroups): a raw
  call raises within it. tether's own waits expire first, at ``sync_timeout``, with their
  own verdict. A ``timeout=`` (or ``pg_options``) the user passes wins. gloo's
  point-to-point calls ignore that timeout (a ``dist.recv`` from a stalled peer waits
  forever), so the wrapped ``send`` and ``recv`` (also inside ``send_object_list`` and
  ``recv_object_list``) wait on their async work with the same bound. Not covered:
  DeviceMesh's ``split_group`` path (NCCL groups bound to a device), which imported it
  by name. The works of ``isend``, ``irecv`` and ``batch_isend_irecv`` are the caller's:
  a ``wait()`` on one given no timeout gets the same bound on gloo (``_p2p_limit``).
* **Named**: while the context lives, the functions of ``torch.distributed`` listed in
  ``WRAPPED`` are wrapped, and so is ``Work.wait``, the caller's wait on an async call's
  work (``async_op=True``, ``isend``; ``ZeroRedundancyOptimizer`` makes them): the
  wrapper marks this rank's whereabouts ("in dist.broadcast (outside tether)"), so a
  peer's timeout names who did not arrive and a stall report says where each rank is; a
  call still waiting after ``warn_after`` logs a stall report of its own, as tether's
  waits do.
* **Explained**: when the call raises a backend error (gloo's "Connection closed by
  peer", its timeout) the wrapper raises the failure behind it instead, chained to the
  backend's error: the peer's ``PeerFailure`` if one is posted within a short window, a
  ``PeerLost`` for a peer that stopped answering, a ``SyncTimeout`` naming the ranks that
  did not arrive.

The wrapper costs two attribute writes, the watchdog's lock twice (``begin_wait`` /
``end_wait``) and a ``try`` per call (the ranks of the call's group, for a timeout's
verdict, are worked out only after a failure); a collective also notes its arguments and
``sys.exc_info()`` for a cross (``crossed.py``: a ``functools.partial`` and four attribute
writes, 0.5 us in a ``timeit`` loop of them here, against 250 us and more for a gloo
all_reduce on loopback), and per tensor argument a reference count
and a weak reference: the exit waits until gloo's worker gave it back (``lent.py``). It covers code
that looks the function up on the module at call time (``dist.all_reduce(...)``, and
torch's own ``torch.distributed.utils``, which DDP's constructor uses); a name imported
with ``from torch.distributed import all_reduce`` before tether started is not covered.
``Work.wait``'s wrapper cost 3.0 us a call in user code (3.3 against torch's 0.25,
``perf_counter`` over 20,000 calls on a finished work), 0.7 us where a wrapped call waits
inside it; a finished work now takes its short way, 0.55 against 0.23 us (200,000 calls,
2026-12-05). tether's own waits call torch's (``waits._wait_on``).
"""

from __future__ import annotations

import datetime
import functools
import inspect
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.nn.parallel import DistributedDataParallel

from ..errors import TetherError
from . import context, lent, making, nccl
from .hooks import Terminated
from .verdicts import OUTSIDE, failure_behind_raw, failure_behind_stop, raise_behind_stop, stall_warner

RAW_MARGIN = 1.0  # seconds gloo's timeout exceeds sync_timeout: tether's own waits expire first

WRAPPED = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
    "monitored_barrier",
    "send",
    "recv",
    "send_object_list",
    "recv_object_list",
    "_broadcast_coalesced",  # DDP's constructor: rank 0's parameters and buffers
    "_verify_params_across_processes",  # DDP's constructor: every rank's shapes
    "new_group",  # gloo's rendezvous, NCCL's communicator split: C++ waits on every member
    "new_subgroups",
    "split_group",
)
_MAKES_GROUPS = ("new_group", "new_subgroups", "split_group")
_EVERY_NEW_GROUP = "_new_group_with_tag"  # torch's function behind new_group (torch 2.13)
_OWN_TIMEOUT = ("timeout", "pg_options", "backend_options")  # a caller's own bound: not overridden
# gloo's point-to-point waits ignore the group's timeout (measured: a blocking recv from a
# stalled peer waits forever): tether's send and recv wait on the async work with the bound
_P2P = {"send": "isend", "recv": "irecv"}
# whose src/dst is the one peer they wait for; a collective's src/dst (broadcast, reduce,
# gather, scatter) is its root, and it waits for the whole group
_POINT_TO_POINT = ("send", "recv", "send_object_list", "recv_object_list")

_originals: dict[str, Callable[..., Any]] = {}
_MAIN = threading.main_thread()


def bound(sync_timeout: float | None, timeout: datetime.timedelta | None) -> datetime.timedelta | None:
    """The backend timeout of tether's groups: the user's ``timeout=``, else ``sync_timeout + RAW_MARGIN``."""
    if timeout is not None or sync_timeout is None:
        return timeout
    return datetime.timedelta(seconds=sync_timeout + RAW_MARGIN)


def install() -> None:
    """Wrap the functions of ``WRAPPED``, once per process, the first time tether watches a group.

    Like ``dist.destroy_process_group``'s wrapper (``ending.py``), they stay: without a
    context a wrapper calls torch's function unchanged.
    """
    if _originals:
        return
    for name in WRAPPED:
        original = getattr(dist, name, None)
        if original is None:
            continue
        _originals[name] = original
        if name in _P2P:
            # torch's send_object_list and recv_object_list call these by their module names
            original = bounded_p2p(original, getattr(c10d, _P2P[name]))
            setattr(c10d, name, original)
        setattr(dist, name, _wrap(name, original))
    # Every group made through new_group passes here, also from torch's own modules that
    # imported ``new_group`` by name (DeviceMesh: its subgroups of a 2-D mesh, HSDP's): the
    # job's bound, and the members' gate (making.py; nested in a wrapped call, it is not)
    inner = getattr(c10d, _EVERY_NEW_GROUP, None)
    if inner is not None:
        _originals[_EVERY_NEW_GROUP] = inner
        setattr(c10d, _EVERY_NEW_GROUP, _gated("new_group", with_job_timeout(inner), inspect.signature(inner)))
    _name_ddps_waits()
    _name_work_waits()


# What a rank in backward() or in DDP's forward answers a whereabouts query with
IN_BACKWARD = f"backward() {OUTSIDE}"
IN_FORWARD = f"DDP's forward {OUTSIDE}"
IN_WORK_WAIT = f"Work.wait {OUTSIDE}"


def _name_work_waits() -> None:
    """Wrap ``Work.wait``: the wait of an async collective (``async_op=True``), ``isend``,
    ``irecv``, is the caller's, made after the wrapped call returned.

    torch's own modules make them (``ZeroRedundancyOptimizer.step`` waits on the works of
    its parameters' broadcasts). Before, a peer's failure reached such a wait as gloo's
    ``RuntimeError`` ("Connection closed by peer"), in the user's code, and a stalled peer's
    timeout named the waiting rank's call "user code". A wait made inside a tether call or
    off the main thread is tether's own or not named: it runs as called.

    A work already completed has nothing to wait for: its wait returns as torch's does,
    also after a peer's failure became known, and the failure is raised at the next wait
    that would block. Before, that wait raised it at once: in a ``pytest --full`` run
    (2026-12-05, two cores, three tests at a time), a ZeroRedundancyOptimizer's rank 0
    raised it in the middle of its step's ``optimizer.step()``, in the wait on a
    broadcast whose data had arrived, because rank 1 had finished the same step and failed
    at the next (a step left half done where it could have been whole;
    ``tests/jobs/completed_wait.py``).
    """
    from torch._C._distributed_c10d import Work

    original_wait = Work.wait
    _originals["Work.wait"] = original_wait

    @functools.wraps(original_wait)
    def wait(self: Work, *args: Any, **kwargs: Any) -> bool:
        if self.is_completed():  # nothing to wait for (see the docstring)
            try:
                return original_wait(self, *args, **kwargs)
            except RuntimeError:
                pass  # a work that failed: its error gets the true story below
        if not args and not kwargs:
            limit = _p2p_limit(self)
            if limit is not None:
                args = (limit,)
        return cast(bool, _outside(IN_WORK_WAIT, None, original_wait, (self, *args), kwargs))

    Work.wait = wait  # type: ignore[method-assign]


# c10d's OpType of a point-to-point work (torch 2.13: SEND, RECV, RECVANYSOURCE)
_P2P_OPS = frozenset({12, 13, 14})


def _p2p_limit(work: Any) -> datetime.timedelta | None:
    """The job's bound for a caller's ``wait()`` on a gloo point-to-point work; None: wait as called.

    gloo's point-to-point works ignore the group's timeout: ``dist.irecv(...).wait()`` from
    a stalled peer waited forever, with ``sync_timeout`` set (measured by hand: a 2-stage
    ``torch.distributed.pipelining`` schedule, stage 1 stalled, stage 0 still waiting 54 s
    later in its ``batch_isend_irecv`` works' ``wait()``). With ``sync_timeout``, such a wait
    given no timeout gets the job's bound, as tether's ``send`` and ``recv`` do; a
    collective's work already has its group's timeout, and NCCL's (or a mixed backend's)
    works are left alone: a timed wait there blocks the CPU (``bounded_p2p``).
    """
    ctx = context.peek()
    if ctx is None or ctx.watchdog is None or ctx.settings.timeout is None or ctx.backend.backend() != "gloo":
        return None
    try:
        p2p = int(work._get_op_type()) in _P2P_OPS
    except Exception:  # a work of another kind, a torch without the method
        return None
    return bound(ctx.settings.timeout, None) if p2p else None


def _name_ddps_waits() -> None:
    """Wrap ``torch.autograd.backward`` and ``DistributedDataParallel.forward``, as the
    functions of ``WRAPPED``: DDP waits in them, in C++, on collectives no wrapper sees.

    ``backward()`` waits for the reducer's gradient all-reduce, DDP's forward for its bucket
    rebuild (second iteration) and its buffer broadcast. Without these names a rank waiting
    there answered "in user code", as a stalled rank does: in a DDP built without tether's
    hook (``ddp.register_comm_hook``), a stall of rank 1 at 3 ranks was "user code timed out
    after 4 s: rank(s) [1, 2] did not arrive", rank 2 waiting in its backward. Every
    ``Tensor.backward()`` goes through ``torch.autograd.backward``, looked up at call time;
    a ``forward`` a subclass of DDP defines calls DDP's, or is its own.
    """
    original_backward = torch.autograd.backward
    _originals["backward"] = original_backward

    @functools.wraps(original_backward)
    def backward(*args: Any, **kwargs: Any) -> None:
        _outside(IN_BACKWARD, None, original_backward, args, kwargs)

    torch.autograd.backward = backward
    original_forward = DistributedDataParallel.forward
    _originals["DistributedDataParallel.forward"] = original_forward

    @functools.wraps(original_forward)
    def forward(self: DistributedDataParallel, *args: Any, **kwargs: Any) -> Any:
        return _outside(IN_FORWARD, None, original_forward, (self, *args), kwargs)

    DistributedDataParallel.forward = forward  # type: ignore[method-assign]


def run_outside(call: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run ``fn``, a wait tether did not make, as ``call``; a failure out of it gets its true story.

    ``call`` is this rank's whereabouts meanwhile (it should end with ``OUTSIDE``, so
    that a peer's timeout verdict counts this rank as arrived). A backend error becomes
    the failure behind it (``failure_behind_raw``), a launcher's SIGTERM the peer's
    failure behind it (``failure_behind_stop``); anything else passes unchanged. Inside
    a tether call, off the main thread, or without a context, ``fn`` just runs.
    """
    return _outside(call, None, fn, args, kwargs)


def run_creation(call: str, bound: float, fn: Callable[..., Any], *args: Any) -> Any:
    """``run_outside`` for ``fn``, which makes a group under a timeout of ``bound`` seconds:
    a timeout out of its rendezvous is a ``SyncTimeout`` after ``bound``, naming the ranks
    that did not come (``verdicts.failure_behind_raw``)."""
    return _outside(call, None, fn, args, {}, bound=bound)


def _outside(
    call: str,
    signature: inspect.Signature | None,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    p2p: bool = False,
    bound: float | None = None,
) -> Any:
    """``run_outside``; ``fn``'s ``signature`` finds the ranks the call waited for, after a failure only.

    ``p2p``: ``fn`` is a point-to-point call, which waits for its peer alone. ``bound``:
    see ``run_creation``.
    """
    if torch.compiler.is_compiling():  # see _compiled
        return fn(*args, **kwargs)
    ctx = context.peek()
    watchdog = ctx.watchdog if ctx is not None else None
    if ctx is None or watchdog is None or watchdog.current_call or threading.current_thread() is not _MAIN:
        return fn(*args, **kwargs)  # the whereabouts and the wait the watchdog knows are the main thread's
    watchdog.current_call = call
    if signature is not None and not p2p:  # a collective of WRAPPED's: for a cross (crossed.py)
        watchdog.raw_members = functools.partial(_members, signature, args, kwargs)
        watchdog.raw_handling = sys.exc_info()[1]  # in a ``finally:`` too, while an exception passes
    start = time.monotonic()
    try:
        # nothing to wake: for the stall report only (it raises a known failure)
        watchdog.begin_wait(stall_at=start + ctx.settings.warn_after, on_stall=stall_warner(ctx, call, start))
        return fn(*args, **kwargs)
    except RuntimeError as exc:
        if isinstance(exc, TetherError):
            raise
        try:
            ranks = _group_ranks(signature, args, kwargs, p2p) if signature is not None else None
            waited = time.monotonic() - start
            failure = failure_behind_raw(ctx, exc, call.removesuffix(f" {OUTSIDE}"), ranks, waited, bound)
        except Terminated:  # the launcher's SIGTERM while this rank asks: a peer died
            failure = failure_behind_stop(ctx)
        if failure is None:
            raise
        raise failure from exc
    except Terminated as stop:
        raise_behind_stop(ctx, stop)
    finally:
        watchdog.end_wait()
        watchdog.current_call = ""
        watchdog.raw_members = watchdog.raw_handling = None


# _compiled: under ``torch.compile`` the wrappers step aside. Dynamo traced them (a DDP's
# forward inside ``torch.compile(model)``): it broke the graph at their first builtin
# (``threading.get_ident``, ``time.monotonic``) and warned the user, once per rank, that it
# could not trace it (``tests/jobs/compiled_ddp.py``). Traced, ``is_compiling()`` is a
# constant: the compiled code calls torch's function alone, and a compiled region's waits
# are not named. In eager code the check costs 0.07 us (``timeit``).


def _wrap(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    call = f"dist.{name.lstrip('_')} {OUTSIDE}"
    p2p = name in _POINT_TO_POINT
    try:
        signature: inspect.Signature | None = inspect.signature(original)
    except (TypeError, ValueError):  # a function of torch's C++ (DDP's helpers)
        signature = None

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():  # see _compiled
            return original(*args, **kwargs)
        found = lent.counted_args(args, kwargs)
        done, work = False, None
        try:
            result = _outside(call, signature, original, args, kwargs, p2p)
            work = result if isinstance(result, dist.Work) else None
            done = work is None  # a blocking call returned: its work is finished
            return result
        finally:
            lent.lend(found, done, work)  # an async work is the caller's: looked at until it is complete

    if name not in _MAKES_GROUPS:
        return wrapper
    bounded = with_job_timeout(original)

    @functools.wraps(original)
    def makes_group(*args: Any, **kwargs: Any) -> Any:
        making.arrive(name, signature, args, kwargs)  # every rank that must come is there (making.py)
        ctx = context.peek()
        with nccl.error_handling(ctx.backend.backend() if ctx is not None else None):
            return run_outside(call, bounded, *args, **kwargs)

    return makes_group


def _group_ranks(
    signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any], p2p: bool
) -> tuple[int, ...] | None:
    """The global ranks a raw call waited for (None: all ranks, or not known).

    Those of the call's group; for a point-to-point call (``p2p``), this rank and its peer.
    A collective's ``src``/``dst`` names its root only: a ``dist.broadcast(t, src=0)`` waits
    for every rank of its group, and a stalled rank 2 is the one that did not arrive.
    """
    try:
        given = signature.bind_partial(*args, **kwargs).arguments
        group = given.get("group")
        for rank, group_rank in (("src", "group_src"), ("dst", "group_dst")):
            peer = _peer(given.get(rank), group, given.get(group_rank)) if p2p else None
            if peer is not None:
                return tuple(sorted({dist.get_rank(), peer}))
        return _ranks_of(group)
    except Exception:  # a bad argument torch already refused, a group of another kind
        return None


def _members(signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, ...]:
    """The global ranks of a raw collective's group: all ranks for the default group.

    Raises what torch raises for a group it does not know (the caller answers None).
    """
    ranks = _ranks_of(signature.bind_partial(*args, **kwargs).arguments.get("group"))
    return tuple(range(dist.get_world_size())) if ranks is None else ranks


def _ranks_of(group: Any) -> tuple[int, ...] | None:
    """The global ranks of ``group``; None for the default group (all ranks)."""
    if group is None or group is dist.group.WORLD:
        return None
    return tuple(dist.get_process_group_ranks(group))


def _peer(rank: int | None, group: Any, group_rank: int | None) -> int | None:
    """The global rank a send or recv names (``dst``/``src``, or ``group_dst``/``group_src``); None: any."""
    if rank is not None:
        return int(rank)
    if group_rank is not None:
        return dist.get_global_rank(cast(dist.ProcessGroup, group or dist.group.WORLD), group_rank)
    return None


def bounded_p2p(blocking: Callable[..., Any], start: Callable[..., Any]) -> Callable[..., Any]:
    """``blocking`` (torch's ``send`` or ``recv``), waiting on ``start``'s async work with the job's bound.

    Only for a CPU tensor with ``sync_timeout`` set: NCCL's own timeout covers its
    point-to-point calls, and a timeout given to its ``wait`` would block the CPU. Else,
    and for what torch refuses (a send to this rank itself), ``blocking`` runs as called.
    ``start`` (``isend``, ``irecv``) takes the same arguments, spelled out here as torch
    2.13 has them (``inspect``'s binding cost 10 µs a call); ``recv`` returns the sender's
    global rank, as torch's does.
    """

    def limit_for(tensor: Any) -> datetime.timedelta | None:
        ctx = context.peek()
        if ctx is None or ctx.watchdog is None or not _on_cpu(tensor):
            return None
        return bound(ctx.settings.timeout, None)

    if blocking.__name__ == "send":

        @functools.wraps(blocking)
        def send(
            tensor: torch.Tensor, dst: int | None = None, group: Any = None, tag: int = 0, group_dst: int | None = None
        ) -> None:
            limit = limit_for(tensor)
            if limit is None or _peer(dst, group, group_dst) == dist.get_rank():
                blocking(tensor, dst, group, tag, group_dst)  # a send to itself: torch's ValueError
                return
            work = start(tensor, dst, group, tag, group_dst)
            if work is not None:  # None: this rank is not in the group, torch warned
                work.wait(limit)

        return send

    @functools.wraps(blocking)
    def recv(
        tensor: torch.Tensor, src: int | None = None, group: Any = None, tag: int = 0, group_src: int | None = None
    ) -> int:
        limit = limit_for(tensor)
        sender = _peer(src, group, group_src)
        if limit is None or sender == dist.get_rank():
            return int(blocking(tensor, src, group, tag, group_src))  # from itself: torch's ValueError
        work = start(tensor, src, group, tag, group_src)
        if work is None:  # this rank is not in the group: torch warned
            return -1
        work.wait(limit)
        if sender is not None:
            return sender
        return dist.get_global_rank(cast(dist.ProcessGroup, group or dist.group.WORLD), work._source_rank())

    return recv


def _on_cpu(tensor: Any) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu"


def _gated(name: str, make: Callable[..., Any], signature: inspect.Signature) -> Callable[..., Any]:
    """``make``, after the gate of the new group's members (``making.arrive``)."""

    @functools.wraps(make)
    def gated(*args: Any, **kwargs: Any) -> Any:
        making.arrive(name, signature, args, kwargs)
        return make(*args, **kwargs)

    return gated


def with_job_timeout(make: Callable[..., Any]) -> Callable[..., Any]:
    """``make`` (a function that creates a group), given ``timeout=`` the job's bound when the caller gave none.

    torch's default is 30 minutes, not the job's bound. Without a context, or without
    ``sync_timeout``, ``make`` runs as called.
    """
    signature = inspect.signature(make)

    @functools.wraps(make)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        ctx = context.peek()
        limit = bound(ctx.settings.timeout, None) if ctx is not None and ctx.watchdog is not None else None
        if limit is not None:
            try:
                given = signature.bind_partial(*args, **kwargs)
            except TypeError:
                given = None  # torch raises its own error for these arguments
            # options of the caller's (NCCL's carry a timeout of their own) are left as given
            if given is not None and not any(given.arguments.get(k) is not None for k in _OWN_TIMEOUT):
                given.arguments["timeout"] = limit
                args, kwargs = given.args, given.kwargs
        return make(*args, **kwargs)

    return bounded
