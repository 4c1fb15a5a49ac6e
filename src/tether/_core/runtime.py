"""Starting and ending a rank: ``initialize``, ``finalize`` and the failure report of a rank.

``start`` is the one path every launcher takes (``initialize`` under torchrun,
``tether.spawn`` workers, ``Parallel``): it connects to the job's store, creates the
process group on it, opens the failure channel, starts the watchdog and installs the
hooks. ``finalize`` undoes it; after a failure it never blocks (see ``backends``).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, Store, TCPStore

from .. import _slurm
from .._env import LaunchEnv, Topology, from_torchrun, parse_init_method
from ..backends import Backend, NativeBackend, check_backend
from ..errors import PeerLost, TetherError
from . import context
from .channel import LEFT, Channel, clone
from .context import Context, SyncSettings
from .hooks import Hooks, SignalStop
from .record import KIND_LOST, FailureRecord, error_from_record
from .waits import _post_and_pick, _store_lost
from .watchdog import Watchdog, WatchdogConfig

log = logging.getLogger("tether")

_OPTIONS = {"heartbeat", "lost_after", "grace", "sync_timeout", "warn_after"}


@dataclass(frozen=True)
class Options:
    """tether's own settings, taken from ``initialize``/``spawn`` keyword arguments."""

    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    sync: SyncSettings = field(default_factory=SyncSettings)

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any], store_host: int) -> Options:
        unknown = set(kwargs) - _OPTIONS
        if unknown:
            raise TypeError(f"unexpected keyword argument(s): {sorted(unknown)}")
        w, s = WatchdogConfig(), SyncSettings()
        return cls(
            WatchdogConfig(
                heartbeat=float(kwargs.get("heartbeat", w.heartbeat)),
                lost_after=float(kwargs.get("lost_after", w.lost_after)),
                grace=kwargs.get("grace", w.grace),
                store_host=store_host,
            ),
            SyncSettings(
                timeout=kwargs.get("sync_timeout", s.timeout), warn_after=float(kwargs.get("warn_after", s.warn_after))
            ),
        )


def to_timedelta(timeout: object) -> datetime.timedelta | None:
    if timeout is None or isinstance(timeout, datetime.timedelta):
        return timeout
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0:
        return datetime.timedelta(seconds=timeout)
    raise ValueError(f"timeout must be a datetime.timedelta or a positive number of seconds, got {timeout!r}")


def start(
    backend: str,
    topology: Topology,
    store: Store,
    *,
    job_id: str,
    hosts_store: bool,
    options: Options,
    timeout: datetime.timedelta | None = None,
    error_file: str | None = None,
) -> Context:
    """Create the process group on ``store`` and everything that watches it."""
    native = NativeBackend.create(backend, topology, PrefixStore(f"pg/{job_id}", store), timeout)
    return _watch(native, store, job_id, hosts_store, options, error_file)


def _watch(
    backend: Backend, store: Store, job_id: str, hosts_store: bool, options: Options, error_file: str | None
) -> Context:
    topo = backend.topology
    channel = Channel(store, job_id, topo.rank, topo.world_size)
    watchdog = Watchdog(channel, options.watchdog, abort=backend.abort)
    # The main thread's syncs get their own connection: they change its timeout per wait,
    # which must never leak into the process group's own use of the store.
    ctx = Context(backend, channel, watchdog, clone(store), options.sync, hosts_store, error_file)
    ctx.hooks = Hooks(report_failure)
    context.install(ctx)
    watchdog.start()
    ctx.hooks.install()
    return ctx


def initialize(backend: str, **kwargs: Any) -> None:
    """Initialize the distributed job in this process (under torchrun or with explicit ranks).

    Args:
        backend: "gloo", "nccl" or "mpi".
        timeout: torch's process-group timeout (``timedelta`` or seconds).
        init_method: "env://" (default: MASTER_ADDR/MASTER_PORT) or "tcp://HOST:PORT".
        rank, world_size: when not given by the environment (torchrun sets them).
        heartbeat, lost_after, grace: watchdog timings in seconds (see ``watchdog.py``).
        sync_timeout: default timeout of every sync; warn_after: stall report interval.

    Raises:
        TypeError, ValueError: bad backend or arguments, before any connection.
        RuntimeError: already initialized.
    """
    check_backend(backend)
    timeout = to_timedelta(kwargs.pop("timeout", None))
    init_method = kwargs.pop("init_method", None)
    rank, world_size = kwargs.pop("rank", None), kwargs.pop("world_size", None)
    env = _launch_env(dict(os.environ), init_method, rank, world_size)
    store_host = -1 if env.use_agent_store else 0
    options = Options.from_kwargs(kwargs, store_host)
    if context.peek() is not None:
        raise RuntimeError("tether is already initialized in this process; call tether.finalize() first")
    hosts = env.topology.rank == 0 and not env.use_agent_store
    store = TCPStore(
        env.master_addr,
        env.master_port,
        env.topology.world_size,
        hosts,
        timeout=timeout or datetime.timedelta(minutes=5),
        wait_for_workers=False,
    )
    start(
        backend,
        env.topology,
        store,
        job_id=env.job_id,
        hosts_store=hosts,
        options=options,
        timeout=timeout,
        error_file=env.error_file,
    )


def _launch_env(env: dict[str, str], init_method: str | None, rank: Any, world_size: Any) -> LaunchEnv:
    address = parse_init_method(init_method)
    if _slurm.applies(env):  # srun: SLURM's variables, translated and checked (see _slurm)
        if rank is not None or world_size is not None:
            raise ValueError("initialize: rank= and world_size= must not be given under SLURM: srun sets them")
        env = {**env, **_slurm.torchrun_vars(env)}
    if rank is not None or world_size is not None:
        if not isinstance(rank, int) or not isinstance(world_size, int):
            raise ValueError("initialize: pass both rank and world_size as int, or neither")
        env = {**env, "RANK": str(rank), "WORLD_SIZE": str(world_size)}
        if "LOCAL_RANK" not in env:
            env.update(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size))
    if address is not None:
        env = {**env, "MASTER_ADDR": address[0], "MASTER_PORT": str(address[1])}
    launch = from_torchrun(env)
    if launch is None:
        raise ValueError(
            "initialize: RANK and WORLD_SIZE are not set; run under torchrun, use tether.spawn, "
            "or pass rank= and world_size="
        )
    return launch


def adopt_process_group() -> Context:
    """Adopt a process group the user created with ``dist.init_process_group``."""
    env = os.environ
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(env.get("LOCAL_RANK", context.local_rank_hint if context.local_rank_hint is not None else rank))
    nproc = int(env.get("LOCAL_WORLD_SIZE", world))
    topo = Topology(rank, world, local, nproc, world // nproc, rank // nproc)
    launch = from_torchrun(env)
    job_id = launch.job_id if launch is not None else "adopted"
    backend = NativeBackend(topo, str(dist.get_backend()), owns_group=False)
    store = dist.distributed_c10d._get_default_store()
    options = Options.from_kwargs({}, -1 if launch is None or launch.use_agent_store else 0)
    return _watch(backend, store, job_id, False, options, launch.error_file if launch else None)


def finalize() -> None:
    """End this rank's part in the job; never blocks after a failure.

    On the happy path the rank records that it left and destroys its process group; the
    store's host waits until every rank has left, so no rank loses the store early.
    After a failure it stops the watchdog's threads and aborts (NCCL) or drops the
    process group instead of destroying it, which can block on a dead peer.
    """
    in_flight = sys.exc_info()[1]  # finalize() in a `finally:` while an exception propagates
    if in_flight is not None and context.peek() is not None:
        report_failure(in_flight)  # else the hooks are gone before the excepthook could post it
    ctx = context.uninstall()
    if ctx is None or ctx.channel is None or ctx.watchdog is None:
        return
    clean = not ctx.failed
    try:
        if clean:
            _leave(ctx)
    except Exception as exc:
        log.warning("tether: finalize could not record a clean exit: %s", exc)
        clean = False
    finally:
        ctx.watchdog.stop()
        clean = clean and not ctx.failed
        if ctx.hooks is not None:
            ctx.hooks.uninstall(keep_exit=not clean)
        ctx.backend.shutdown(clean)
        if not clean:
            context.abandon_process_group()


def _leave(ctx: Context) -> None:
    assert ctx.channel is not None and ctx.store is not None and ctx.watchdog is not None
    done = ctx.channel.key("left", "all")
    if ctx.channel.leave() == ctx.channel.world_size:
        ctx.store.set(done, "1")
    if not ctx.hosts_store:
        return
    ctx.store.set_timeout(datetime.timedelta(seconds=1))
    while ctx.watchdog.failure is None:  # the host outlives the job, or its store would vanish
        try:
            ctx.store.get(done)
            return
        except dist.DistStoreError:
            continue


def report_failure(exc: BaseException) -> BaseException | None:
    """Post this rank's own failure once, and write torchelastic's error file.

    A tether error is a consequence of a failure already posted: it is not posted again,
    and the error file names the root cause. A SIGTERM (``SignalStop``) that another rank's
    failure explains is a consequence too: that failure is returned, for the signal hook to
    raise instead (see ``_failure_behind_stop``).
    """
    ctx = context.peek()
    if ctx is None or ctx.channel is None:
        return None
    if isinstance(exc, SignalStop) and not any(seen is exc for seen, _ in ctx.posted):
        behind = _failure_behind_stop(ctx)  # the hook's call; a later one (finalize) reposts nothing
        if behind is not None:
            report_failure(behind)
            return behind
    where = ctx.watchdog.current_call if ctx.watchdog is not None and ctx.watchdog.current_call else "user code"
    try:
        if isinstance(exc, TetherError):
            _write_error_file(ctx.error_file, exc, ctx.channel.root_cause(), victim=True)
        else:
            record = ctx.post_own(exc, where)
            _write_error_file(ctx.error_file, exc, record, victim=False)
            if record is not None and threading.current_thread() is not threading.main_thread():
                _wake_main_thread(ctx, record)
    except Exception as err:
        # the store may be gone (its host died): then this line is the only trace of why
        log.warning("tether: could not post this rank's failure (%s: %s): %s", type(exc).__name__, exc, err)
    return None


def _wake_main_thread(ctx: Context, record: FailureRecord) -> None:
    """A thread of this rank failed: stop the main thread's wait too, as every peer's.

    The post wakes only the other ranks; without this, the main thread would wait for
    peers that have all stopped because of this very failure.
    """
    assert ctx.watchdog is not None and ctx.channel is not None
    ctx.watchdog.deliver(error_from_record(record), ctx.channel.listener_client())


def _failure_behind_stop(ctx: Context) -> TetherError | None:
    """The peer failure that explains a SIGTERM, or None when the stop is this rank's own.

    torchrun's agent SIGTERMs every other worker 0.1 s after one worker's process ended,
    before a heartbeat can tell that it died (``lost_after``). A whereabouts query can: a
    rank that neither answers within ``answer_within`` nor left cleanly is dead or frozen,
    and is posted as lost. Costs one query (ms when every rank answers).
    """
    watchdog, channel = ctx.watchdog, ctx.channel
    if watchdog is None or channel is None:
        return None
    if watchdog.failure is not None:
        return watchdog.failure
    try:
        answers = channel.ask_whereabouts(range(channel.world_size), ctx.settings.answer_within)
        if watchdog.failure is not None:
            return watchdog.failure
        client = channel.listener_client()  # not the main connection: the signal may have cut its wait
        silent = [
            r
            for r in range(channel.world_size)
            if r != channel.rank and r not in answers and int(client.add(channel.key("hb", r), 0)) < LEFT
        ]
        if not silent:
            return None
        record = FailureRecord(
            rank=silent[0],
            kind=KIND_LOST,
            exc_type="Lost",
            message="its process stopped answering (this rank got SIGTERM, as a launcher sends once a worker died)",
            time=time.time(),
            reporter=channel.rank,
        )
        return _post_and_pick(ctx, record, PeerLost(record))
    except dist.DistNetworkError as err:  # the store's host died: that is the failure behind the stop
        return _store_lost(ctx, err)
    except Exception as err:  # another failure: the stop stays this rank's own
        log.warning("tether: could not tell whether a peer's failure caused this SIGTERM: %s", err)
        return watchdog.failure


def _write_error_file(path: str | None, exc: BaseException, record: FailureRecord | None, victim: bool) -> None:
    """torchelastic's error file, so torchrun's "Root Cause" names the true failing rank.

    torchrun picks the failure with the smallest timestamp (whole seconds). The failing
    rank writes its own time; victims write the root cause's time + 1, so that ties on
    the second cannot make a victim the "root cause".
    """
    if path is None or (victim and os.path.exists(path)):  # never cover this rank's own failure
        return
    stamp = int(record.time if record is not None and record.time else time.time()) + (1 if victim else 0)
    message = f"{type(exc).__name__}: {exc}" if victim or record is None else record.headline
    extra = {"timestamp": str(stamp)}
    if not victim and record is not None and record.traceback:
        extra["py_callstack"] = record.traceback  # without it, torchrun's summary shows the message
    data = {"message": {"message": message, "extraInfo": extra}}
    with open(path, "w") as fp:
        json.dump(data, fp)


def sync(temporary: bool = False) -> None:
    """ignite compatibility: pick up a process group created outside tether (done lazily anyway)."""
    current()


def set_local_rank(index: int) -> None:
    """Hint the local rank when the user created the process group without tether."""
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise ValueError(f"set_local_rank: index must be a non-negative int, got {index!r}")
    context.local_rank_hint = index


_SERIAL = Context(Backend())


def current() -> Context:
    """The process's context; adopts a process group the user created, once."""
    ctx = context.peek()
    if ctx is not None:
        return ctx
    if dist.is_available() and dist.is_initialized() and dist.group.WORLD is not context.abandoned():
        return adopt_process_group()
    return _SERIAL
