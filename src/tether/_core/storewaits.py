"""Waits on a store tether did not make: woken by a peer's failure, bounded by ``sync_timeout``.

User code coordinates through stores too: ``store.wait([key])`` or ``store.get(key)`` for a
key another rank sets, on torch's default store (``c10d._get_default_store()``) or a
``TCPStore`` of its own. Such a wait is in C++: no signal handler runs in it, and nothing
ends it but the key or the store's own timeout (5 to 30 minutes). Before, a peer that
raised left a rank there until the ladder ended it (exit 6, no exception of its own), and
a peer that stalled left it there until the store's timeout, ``sync_timeout`` or not
(tried by hand, ``tether.spawn``, 2 ranks).

While tether watches, ``Store.get(key)``, ``Store.wait(keys[, timeout])`` and
``Store.multi_get(keys)`` called on the main thread, outside a tether call, on a store that is not one of tether's own
connections (``channel.OWN_CONNECTIONS``), are waits tether knows (any other call, one
with keyword arguments, or one in a forked child runs as torch's):

* **Woken by a failure.** When a peer's failure reaches this rank, a thread of its own
  writes ``WOKEN`` (a TCPStore client serialises its calls, so not on the blocked one)
  through the main thread's own connection to the job's store, where that writes the
  store's keys (torch's default store, a TCPStore client of the job's store server:
  ``_twin``), or else through a connection of its own, opened from the store's first
  wait (``_connect_soon``), to each key waited for that is still missing
  (``compare_set`` from nothing: a key set meanwhile keeps its value). The wait returns,
  and raises the failure: ``PeerFailure`` naming the root cause, ``PeerLost``,
  ``PeerFinished``. Every other rank finished is such a failure too
  (``verdicts.nobody_left``): nobody of the job is left to set the key.
* **Bounded.** With ``sync_timeout``, the same wake comes at ``sync_timeout + RAW_MARGIN``
  (a raw collective's bound): ``SyncTimeout`` naming the ranks that were in no
  torch.distributed call (``verdicts.expire``). A store's own timeout, if shorter, raises
  the store's error as before.
* **Named.** Meanwhile this rank's whereabouts are ``store.get('key') (outside tether)``,
  and a wait past ``warn_after`` logs a stall report. A launcher's SIGTERM, whose handler
  runs once the wait returns, becomes the peer's failure behind it, as in a raw call.

The price of a wake: the keys it wrote hold ``WOKEN``. A wrapped ``get`` that reads it, on
any rank, raises the job's failure (after waiting up to ``HEARD_WITHIN`` for it: the rank
that wrote it heard of the failure first), as does a ``multi_get`` that reads one;
``check`` or ``compare_set`` see the value as it is. The job is failing by then.
``queue_pop`` is not wrapped (a marker pushed to wake it would be another rank's next
item): its wait is the ladder's, as before.

Cost on the happy path, a call whose key is there (``benchmarks/store_waits.py``, one
process, the user's TCPStore on loopback): ``get`` 41.0 against torch's 33.1 us, ``wait``
25.7 against 16.9 us (``benchmarks/results/store-waits.md``): the wait's registration
with the watchdog, as a raw collective's, and the whereabouts; and, once per store
object, three round trips (``_twin``) and, where they find no connection open already, a
connection of its own opened on a thread (``_connect_soon``). A training step makes no store call.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, Store, TCPStore

from ..errors import BackendError, TetherError
from . import context
from .channel import OWN_CONNECTIONS
from .group import all_ranks
from .hooks import Terminated
from .rawcalls import RAW_MARGIN
from .verdicts import OUTSIDE, expire, failure_behind_raw, nobody_left, raise_behind_stop, stall_warner
from .waits import LEFT_CHECK_AFTER
from .watchdog import EXPIRED, Watchdog

log = logging.getLogger("tether")

WOKEN = "tether: woken by a failure, or by the job's bound"
HEARD_WITHIN = 5.0  # seconds a rank that read another's WOKEN waits to hear of its failure
JOIN = 2.0  # seconds the woken wait waits for the thread that woke it (a daemon in a torch call)

_originals: dict[str, Callable[..., Any]] = {}
_MOST_ARGS = {"get": 1, "wait": 2, "multi_get": 1}  # get(key), wait(keys[, timeout]), multi_get(keys)
_WOKEN = WOKEN.encode()
_MAIN = threading.main_thread()
_forked = False  # this process is a fork of the rank's (a DataLoader's worker): not the rank
_WAKING = threading.Lock()  # one waker at a time sets its thread (wakes are rare)
# store -> what its wakes write on, found at its first wait (``_connect_soon``): a connection
# open already (``_twin``), or one of its own (None: not open yet, or none)
_connections: weakref.WeakKeyDictionary[Store, Store | None] = weakref.WeakKeyDictionary()
_opening: weakref.WeakKeyDictionary[Store, threading.Thread] = weakref.WeakKeyDictionary()  # the thread opening it
_connecting: list[threading.Thread] = []  # those threads, joined at exit
OPENING_WAIT = 30.0  # seconds a wake waits for its store's connection to open before it opens another


def install() -> None:
    """Wrap ``Store.get``, ``Store.wait`` and ``Store.multi_get``, once per process (the
    first time tether watches a group).

    Like rawcalls' wrappers they stay: without a context a wrapper calls torch's method.
    """
    if _originals:
        return
    os.register_at_fork(after_in_child=_in_forked_child)
    atexit.register(_join_connects)
    for name in _MOST_ARGS:
        original = getattr(Store, name)
        _originals[name] = original
        setattr(Store, name, _wrapped(name, original))


def _wrapped(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(self: Store, *args: Any, **kwargs: Any) -> Any:
        ctx = context.peek()
        watchdog = ctx.watchdog if ctx is not None else None
        if (
            ctx is None
            or watchdog is None
            or watchdog.current_call  # inside a tether call, or a raw one: that one is the wait
            or threading.current_thread() is not _MAIN
            or _forked
            or self in OWN_CONNECTIONS
            or kwargs
            or not 1 <= len(args) <= _MOST_ARGS[name]
        ):
            return original(self, *args, **kwargs)
        what = args[0]
        keys = [what] if name == "get" else ([] if isinstance(what, str) else list(what))
        if not keys or not all(isinstance(k, str) for k in keys):
            return original(self, *args, **kwargs)
        return _wait(ctx, watchdog, name, original, self, keys, args)

    return wrapper


def _in_forked_child() -> None:
    global _forked
    _forked = True


def _wait(
    ctx: context.Context,
    watchdog: Watchdog,
    name: str,
    original: Callable[..., Any],
    store: Store,
    keys: Sequence[str],
    args: tuple[Any, ...],
) -> Any:
    if name == "get":
        call = f"store.get({keys[0]!r})"
    else:
        call = f"store.{name}([" + ", ".join(map(repr, keys[:3])) + (", ...])" if len(keys) > 3 else "])")
    if store not in _connections:
        _connect_soon(ctx, store)
    start = time.monotonic()
    timeout = ctx.settings.timeout
    waker = _Waker(store, keys)
    watchdog.current_call = f"{call} {OUTSIDE}"
    try:
        try:
            watchdog.begin_wait(
                deadline=None if timeout is None else start + timeout + RAW_MARGIN,
                stall_at=start + ctx.settings.warn_after,
                on_stall=stall_warner(ctx, f"{call} {OUTSIDE}", start),
                check_at=start + LEFT_CHECK_AFTER,
                check=lambda client: nobody_left(ctx, client, call),
                wake=waker,
            )
            try:
                got = original(store, *args)
            finally:
                watchdog.end_wait()
                waker.join()
            if name == "get":
                woken = got == _WOKEN
            elif name == "multi_get":
                woken = any(value == _WOKEN for value in got)
            else:
                woken = waker.wrote
            if not woken:
                return got
            # still in the call: a stop while this rank waits to hear of the failure (another
            # rank's marker, read first) is the failure's, below
            raise watchdog.taken(_why_woken(ctx, watchdog, waker, call, timeout))
        except RuntimeError as exc:
            if isinstance(exc, TetherError):
                raise
            # a known failure wins; the store's host gone is the job's (PeerLost); a store's
            # own timeout, or a closed store of the user's, passes as it is
            failure = watchdog.failure
            if failure is None and isinstance(exc, dist.DistNetworkError):
                failure = failure_behind_raw(ctx, exc, call)
            if failure is None:
                raise
            raise watchdog.taken(failure) from exc
        except Terminated as stop:  # a launcher's SIGTERM, its handler run as the wait returned
            raise_behind_stop(ctx, stop)
    finally:
        watchdog.current_call = ""


def _why_woken(
    ctx: context.Context, watchdog: Watchdog, waker: _Waker, call: str, timeout: float | None
) -> TetherError:
    if watchdog.failure is not None:
        return watchdog.failure
    if waker.value == EXPIRED and timeout is not None:
        try:
            return expire(ctx, all_ranks(watchdog.channel.world_size), 0, call, timeout, at=OUTSIDE)
        except dist.DistNetworkError as err:
            return watchdog.store_lost(err)
    # another rank's wake: it heard of a failure this rank has not heard of yet
    failure = watchdog.wait_for_failure(HEARD_WITHIN)
    return failure or BackendError(
        f"{call} read {WOKEN!r}: another rank woke this key for a failure that has not reached this rank"
    )


def _connect_soon(ctx: context.Context, store: Store) -> None:
    """Find ``store`` a connection for its wakes: one open already (``_twin``: torch's
    default store, a TCPStore client of the job's store server), else a connection of its
    own, opened on a thread: the caller goes on.

    A new connection can take seconds: c10d looks up both ends' addresses with the machine's
    resolver (``benchmarks/results/store-connect.md``: 5.0 s in 12 of 300 on this VM), and a
    failure heard meanwhile was heard that late (a ``pytest --full`` run: 4.5 s). One open
    already is ``ctx.store``, the main thread's own connection to the job's store, idle
    while the main thread waits here (under the default store's prefixes, for it).

    A connection of its own: opened at the failure, under torchrun's agent store, in 1 of
    12 runs of F2-raise-store-initialize-4r three at a time (and in a fresh clone's suite),
    every survivor's clone was still connecting when the ladder ended it 3 s later,
    torchrun's SIGTERM having come 33 ms after the wake (by hand, that store takes new
    connections all through a job's stop: ``benchmarks/results/store-waits-runs.md``; why
    is not known). Opened on the main thread at the first wait, it held a rank whose first
    wait came after a peer's failure (a ``pytest --full`` run,
    F8-sigterm-collective-parallel-4r: the clone never returned, the ladder ended the
    rank). On a thread of its own neither waits for it; a wake waits for it
    (``_Waker._client``). The exit joins it (``_join_connects``).
    """
    twin = _twin(ctx, store)
    with _WAKING:
        if store in _connections:
            return
        if twin is not None:
            _connections[store] = twin
            return
        _connections[store] = None
        thread = threading.Thread(target=_connect, args=(store,), name="tether-store-connect", daemon=True)
        thread.start()
        _opening[store] = thread
        _connecting[:] = [t for t in _connecting if t.is_alive()]
        _connecting.append(thread)


def default_store_on(given: Store, pg: dist.ProcessGroup) -> Store:
    """torch's default store, where ``given`` is the store ``init_process_group`` was given
    (on another connection) and ``pg`` the group it made: torch keeps a group's store under
    the group's name (``_new_process_group_helper``: ``PrefixStore(f"{group_name}/", store)``,
    torch 2.13). Checked where it is used (``_twin``)."""
    return PrefixStore(f"{pg.group_name}/", given)


def _twin(ctx: context.Context, store: Store) -> Store | None:
    """A connection open already that writes ``store``'s keys, or None: for torch's default
    store, ``ctx.default_store_twin``; for a ``TCPStore`` of the user's on the job's store
    server (a client to torchrun's or ``tether.spawn``'s ``MASTER_ADDR:MASTER_PORT``), the
    ``TCPStore`` under ``ctx.store``. Either holds only if a key it sets is one ``store``
    sees: three round trips, once per store object."""
    candidate: Store | None = None
    if dist.is_initialized() and store is dist.distributed_c10d._get_default_store():
        candidate = ctx.default_store_twin
    elif isinstance(store, TCPStore) and ctx.store is not None:
        base = ctx.store
        while isinstance(base, PrefixStore):
            base = base.underlying_store
        if isinstance(base, TCPStore) and base.port == store.port:  # the same server, if the host is too
            candidate = base
    if candidate is None:
        return None
    probe = f"tether/twin/{ctx.backend.topology.rank}"
    try:
        candidate.set(probe, "")
        seen = store.check([probe])
        candidate.delete_key(probe)
    except Exception as exc:  # the store's own error reaches the wait itself
        log.debug("tether: no connection open already for a store of the user's (%s)", exc)
        return None
    return candidate if seen else None


def _connect(store: Store) -> None:
    try:
        client = cast(Store, store.clone())  # type: ignore[attr-defined]
    except Exception as exc:
        log.debug("tether: no connection of its own to a store of the user's (%s)", exc)
        return
    with _WAKING:
        _connections[store] = client


def _join_connects() -> None:
    """At exit, before Python's teardown: a daemon thread that comes out of a torch call in
    it aborts the process (``watchdog.py``, "Stopping"). Opening takes milliseconds; one
    that does not end within ``JOIN`` waits on a store that no longer answers, and stays."""
    deadline = time.monotonic() + JOIN
    for thread in _connecting:
        thread.join(max(0.0, deadline - time.monotonic()))


class _Waker:
    """Wakes one wait on a user's store, from a thread of its own (see the module docstring)."""

    def __init__(self, store: Store, keys: Sequence[str]) -> None:
        self._store = store
        self._keys = keys
        self._thread: threading.Thread | None = None
        self.value: str | None = None  # ABORT or EXPIRED, once called
        self.wrote = False  # WOKEN went to a key that was missing

    def __call__(self, value: str) -> None:  # on a watchdog thread: must not block
        with _WAKING:  # started before it is seen: the main thread joins it once its wait returns
            if self._thread is not None:
                return
            self.value = value
            thread = threading.Thread(target=self._write, name="tether-store-wake", daemon=True)
            thread.start()
            self._thread = thread

    def _client(self) -> Store:
        """The store's wake connection: the one opening since the store's first wait, waited
        for (a second one opened now would wait on the same resolver, and finish later),
        else a new one."""
        opening = _opening.get(self._store)
        if opening is not None:
            opening.join(OPENING_WAIT)
        return _connections.get(self._store) or cast(Store, self._store.clone())  # type: ignore[attr-defined]

    def _write(self) -> None:
        try:
            client = self._client()
            for key in self._keys:
                if client.compare_set(key, "", WOKEN) == _WOKEN:
                    self.wrote = True
        except Exception as exc:
            log.warning("tether: could not wake a wait on a store of the user's (%s); the ladder ends it", exc)

    def join(self) -> None:
        thread = self._thread
        if thread is not None:
            thread.join(JOIN)
