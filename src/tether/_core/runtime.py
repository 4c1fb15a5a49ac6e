"""The context's start: ``initialize``, ``start``, adopting a user's group, following it.

``start`` is the one path every launcher takes (``initialize`` under torchrun or with
explicit ranks, ``tether.spawn`` workers, ``Parallel``): it creates the process group,
opens the failure channel on the group's store, starts the watchdog and installs the
hooks. A group the user made with ``dist.init_process_group`` is adopted at the first
tether call (``current``).

A context follows its group. ``current`` compares the group it serves with torch's
default group (an identity check per call) and retires the context when the group was
destroyed or replaced. Every key carries the incarnation's generation
(``channel.generation``), so nothing of an earlier group on a store that outlives it can
touch a later one. How a context ends (``retire``, a wrapped ``destroy_process_group``,
``finalize``, exit) is ``ending.py``.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import socket
import time
import weakref
from collections.abc import Mapping
from typing import Any

import torch.distributed as dist
import torch.distributed.constants as dist_constants
from torch._C._distributed_c10d import FileStore, PrefixStore, Store, TCPStore

from .. import _slurm
from .._checks import to_timedelta
from .._env import Topology, file_path, from_torchrun, interactive
from ..backends import Backend, NativeBackend, check_backend
from ..errors import TetherError
from . import beater, context, funcol, nccl, oldstore, rawcalls, storewaits
from .channel import Channel, generation, has_queues
from .context import Context
from .ending import register_atexit, retire, wrap_destroy
from .failures import blamed, report_failure
from .group import MADE_KEY, Group
from .hooks import Hooks
from .liveness import HostJudge, NodeWatch, StoreAnswerWatch, StoreHostWatch, pid_namespace, store_silent_after
from .options import Launch, Options
from .placement import adopted_topology, read_launch_env
from .record import FailureRecord
from .stores import StorePing, channel_beside, serve, server_address
from .verdicts import OUTSIDE
from .waits import gate
from .watchdog import Watchdog, WatchdogConfig

log = logging.getLogger("tether")

# How long the ranks may take to meet when the group is created, under ``sync_timeout``
# and without a ``timeout=`` of the user's: the store's own timeout. (gloo's rendezvous
# waits for the group's timeout, not the store's: without either, torch's 30 minutes.)
# ``sync_timeout`` bounds every wait once the group exists (``_set_pg_timeout``), not
# the start-up, where ranks reach ``init_process_group`` as far apart as their imports
# take: with ``sync_timeout=3`` a 4-rank job on a loaded 2-core machine failed in
# ``init`` itself.
# A rank that fails or is lost meanwhile still ends the wait within ``grace`` (the ladder).
SETUP_TIMEOUT = datetime.timedelta(minutes=5)

# --- starting -------------------------------------------------------------------------


def start(
    backend: str,
    topology: Topology,
    store: Store,
    *,
    job_id: str,
    hosts_store: bool,
    options: Options,
    launch: Launch,
    timeout: datetime.timedelta | None = None,
    error_file: str | None = None,
    channel_store: Store | None = None,
    keep_alive: Any = None,
) -> Context:
    """Create the process group on ``store`` and everything that watches it.

    ``channel_store`` carries the failure channel when ``store`` cannot (a FileStore).
    """
    chan_store = channel_store or store
    gen = generation(chan_store, job_id, topology.rank)
    prefix = Channel.make_prefix(job_id, gen)
    calls = rawcalls.bound(options.sync.timeout, timeout)  # raw calls are bounded too (rawcalls.py)
    setup = SETUP_TIMEOUT if timeout is None and calls is not None else timeout
    native = NativeBackend.prepare(backend, topology)
    ctx = _watch(native, chan_store, prefix, hosts_store, options, launch, error_file, True, keep_alive, pg=None)
    assert ctx.hooks is not None and ctx.store is not None
    group_prefix = f"pg/{job_id}/{gen}"
    # The group is made under the watchdog: NCCL's eager communicator set-up (``device_id``)
    # and gloo's rendezvous block in C++, where a peer that fails or never comes would
    # otherwise hold this rank until the group's timeout (``setup``, else torch's 30
    # minutes). Here this rank's whereabouts say where it is, a stall is reported, a
    # backend error gets the true story (a rendezvous that times out: a ``SyncTimeout``
    # naming the ranks that did not come), a peer's failure reaches the ladder, which ends
    # the wait within ``grace``, and a launcher's SIGTERM becomes the failure behind it
    # (``Hooks.install_signals``).
    ctx.hooks.install_signals()
    try:
        with nccl.error_handling(backend):
            rawcalls.run_creation(
                f"init_process_group({backend}) {OUTSIDE}",
                _creation_bound(backend, setup),
                _create_group,
                ctx,
                native,
                PrefixStore(group_prefix, store),
                setup,
            )
        if calls is not None and calls != setup:
            dist.distributed_c10d._set_pg_timeout(calls, dist.group.WORLD)
    except BaseException as exc:
        _abandon(ctx, exc)
        raise
    ctx.pg = dist.group.WORLD
    if channel_store is None and ctx.pg is not None:  # the group is on the store ``ctx.store`` is a connection to
        given = native.group_store(PrefixStore(group_prefix, ctx.store))  # what init_process_group was given
        ctx.default_store_twin = storewaits.default_store_on(given, ctx.pg)
    if ctx.watchdog is not None and isinstance(ctx.watchdog.judge, HostJudge) and ctx.watchdog.store_watch is not None:
        ctx.watchdog.judge.learn()  # every rank registered before the group could be made: the store host's pid
    ctx.hooks.install_excepthooks()  # only now: they must be outermost (see there)
    _all_made(ctx, setup)
    return ctx


def _creation_bound(backend: str, setup: datetime.timedelta | None) -> float:
    """Seconds the job's group may take to be made: the set-up's timeout, else torch's default."""
    if setup is not None:
        return setup.total_seconds()
    nccl_default = dist_constants.default_pg_nccl_timeout if backend == "nccl" else None
    default = nccl_default if isinstance(nccl_default, datetime.timedelta) else dist_constants.default_pg_timeout
    return default.total_seconds()


def _all_made(ctx: Context, setup: datetime.timedelta | None) -> None:
    """Wait until every rank's group is made: no rank leaves ``initialize`` before.

    gloo's ``init_process_group`` returned on one rank while its peer was still in the
    handshake of its connections (torch's ``connectFullMesh``). A job whose rank 0 had
    nothing to do then finished and closed its side, and its peer's creation failed,
    "Connection closed by peer": a happy-path job ended as failed ("rank 0 failed:
    Finished ... while rank 1 waits in init_process_group"; ``tests/jobs/spawn_env.py``,
    once in a suite's run). One store gate of its own group, so that the job's syncs keep
    their numbers, under the set-up's timeout: the ranks left the group's creation as far
    apart as that creation let them.
    """
    world = Group(MADE_KEY, tuple(range(ctx.backend.topology.world_size)), None)
    gate(ctx, world, "initialize", "member", timeout=setup.total_seconds() if setup is not None else None)


def _create_group(ctx: Context, native: NativeBackend, store: Store, timeout: datetime.timedelta | None) -> None:
    """``native.create_group``; in a process tether owns, a stop its C++ wait keeps from the
    main thread is ended by the keeper (``Watchdog.stops_end_process``)."""
    assert ctx.watchdog is not None and ctx.hooks is not None
    ending = ctx.watchdog.stops_end_process() if ctx.hooks.owned else contextlib.nullcontext()
    with ending:
        native.create_group(store, timeout)


def _abandon(ctx: Context, exc: BaseException) -> None:
    """No group: post why (a peer still waiting in its creation learns it), stop watching.

    ``exc`` then ends the rank as a failure anywhere else does: told in one line where it
    is a peer's, with its code (the excepthooks go in for it), and a launcher's SIGTERM in
    the retire or after it ends the rank with that code (as in ``finalize``). Before, a
    victim's ``PeerFailure`` reached Python's own hook (a traceback, exit code 1), and a
    SIGTERM meanwhile killed the rank without a word.
    """
    assert ctx.hooks is not None and ctx.watchdog is not None
    behind = report_failure(exc)  # a stop while it posts ends the rank, with the failure's code
    shown = behind if isinstance(behind, TetherError) else exc
    ctx.hooks.install_excepthooks()
    with ctx.hooks.ending_on_stop(shown):
        context.uninstall()
        ctx.watchdog.stop()  # without announcing a retirement: the peers' store may be going
        ctx.hooks.uninstall(keep_exit=True)
        ctx.watchdog.close()


def _watch(
    backend: Backend,
    store: Store,
    prefix: str,
    hosts_store: bool,
    options: Options,
    launch: Launch,
    error_file: str | None,
    owns_group: bool,
    keep_alive: Any = None,
    *,
    pg: Any,
) -> Context:
    """Watch ``pg`` (None: a group ``start`` is about to create; it sets ``ctx.pg`` after)."""
    topo = backend.topology
    # four connections, opened at once (``channel.clones``): the channel's, the main
    # thread's (``ctx.store``), the listener's and the keeper's (``Watchdog.start``)
    channel = Channel(store, prefix, topo.rank, topo.world_size, spares=3)
    if not channel.queues:
        log.warning(
            "tether: this job's store has no queues; failures are noticed by polling every 0.2 s "
            "and whereabouts queries are off (see tether/_core/channel.py)"
        )
    host, pid, pidns = socket.gethostname(), os.getpid(), pid_namespace()
    channel.register(host, pid, pidns)
    config = options.watchdog
    if interactive():
        config = WatchdogConfig(config.heartbeat, config.lost_after, None, config.store_host)
    judge = HostJudge(
        channel,
        config.lost_after,
        time.monotonic,
        store_host=config.store_host,
        host=host,
        pidns=pidns,
        expected=topo.nproc_per_node - 1,
    )
    # a rank hosting the store is judged stopped without the store (liveness.StoreHostWatch)
    beside_host = launch.judge_peers and config.store_host >= 0 and topo.rank != config.store_host
    store_watch = StoreHostWatch(judge, config.store_host, config.lost_after, time.monotonic) if beside_host else None
    store_answers = None
    if not hosts_store:  # from any host, the store is judged silent by its own answers
        ping = StorePing(store, time.monotonic)
        if ping.connected:
            silent_after = store_silent_after(config.lost_after)
            store_answers = StoreAnswerWatch(ping, store, config.store_host, topo.rank, silent_after)
    nodes = NodeWatch(
        channel,
        topo.node_rank,
        topo.nnodes,
        topo.nproc_per_node,
        config.lost_after,
        time.monotonic,
        beats=launch.node_beats,
    )
    beats_here = topo.nnodes > 1 and topo.local_rank == 0 and launch.node_beats
    address = server_address(store) if beats_here else None
    if address is not None:  # a process of its own beats, which no GIL of this rank can stop
        nodes.beater = beater.start(*address, channel.key("node", topo.node_rank), config.heartbeat)
    made: list[weakref.ref[Context]] = []  # weak: a cycle through the watchdog would keep the store open

    def group_gone() -> bool:
        ctx = made[0]() if made else None
        return ctx is not None and ctx.pg is not None and dist.group.WORLD is not ctx.pg

    def on_blamed(record: FailureRecord) -> None:
        ctx = made[0]() if made else None
        if ctx is not None:
            blamed(ctx, record)

    watchdog = Watchdog(
        channel,
        config,
        judge=judge if launch.judge_peers else None,
        store_watch=store_watch,
        store_answers=store_answers,
        nodes=nodes if beats_here else None,
        abort=backend.abort,
        group_gone=group_gone,
        on_blamed=on_blamed,
    )
    # the main thread's syncs get their own connection: never delaying the group's, nor the watchdog's
    ctx = Context(
        backend,
        channel,
        watchdog,
        store=channel.client(),
        settings=options.sync,
        hosts_store=hosts_store,
        error_file=error_file,
        pg=pg,
        owns_group=owns_group,
        keep_alive=keep_alive,
    )
    made.append(weakref.ref(ctx))
    ctx.hooks = Hooks(
        report_failure,
        owned=launch.owned and not interactive(),
        signal_fd=watchdog.signal_fd,
        rank=topo.rank,
        error_file=error_file,
        defer_stop=lambda: watchdog.failure is not None and watchdog.current_call.endswith(OUTSIDE),
    )
    context.install(ctx)
    watchdog.start()
    if pg is not None:
        ctx.hooks.install()  # else ``start`` installs them once the group exists
    wrap_destroy()
    oldstore.wrap_init()
    rawcalls.install()
    storewaits.install()
    funcol.install()
    from .. import bridge  # the API layer, imported late: ignite's internals get tether's waits

    bridge.patch_ignite_if_imported()
    register_atexit()
    return ctx


def _own_launch(env: Mapping[str, str]) -> Launch:
    managed = "TORCHELASTIC_RUN_ID" in env or _slurm.applies(env)
    return Launch(owned=managed, judge_peers=True)


def initialize(backend: str, **kwargs: Any) -> None:
    """Initialize the distributed job in this process.

    Under torchrun or srun every setting comes from the environment. Elsewhere pass
    ``rank=`` and ``world_size=`` with an ``init_method``; with none of them the process is
    a job of one rank (as ignite does). It returns once every rank's process group is
    made, never before (one store gate): a rank with nothing to do that finished at once
    closed connections its peers were still making.

    Args:
        backend: "gloo", "nccl" or "mpi".
        timeout: torch's process-group timeout (``timedelta`` or seconds).
        init_method: "env://" (default: MASTER_ADDR/MASTER_PORT), "tcp://HOST:PORT" or
            "file:///path" (a shared file; rank 0 then hosts the failure channel on a
            TCPStore of its own and publishes its address through the file).
        rank, world_size: when not given by the environment (torchrun sets them).
        heartbeat, lost_after, grace: watchdog timings in seconds (see ``watchdog.py``).
        sync_timeout: default timeout of every sync; warn_after: stall report interval.

    Raises:
        TypeError, ValueError: bad backend or arguments, before any connection.
        RuntimeError: already initialized.
        PeerFailure: another rank failed before every rank's group was made.
    """
    check_backend(backend)
    timeout = to_timedelta(kwargs.pop("timeout", None))
    init_method = kwargs.pop("init_method", None)
    rank, world_size = kwargs.pop("rank", None), kwargs.pop("world_size", None)
    env = dict(os.environ)
    path = file_path(init_method)
    launch_env = read_launch_env(env, init_method, rank, world_size)
    store_host = -1 if launch_env.use_agent_store else 0
    options = Options.from_kwargs(kwargs, store_host)
    if context.peek() is not None:
        raise RuntimeError("tether is already initialized in this process; call tether.finalize() first")
    topo = launch_env.topology
    store_timeout = timeout or datetime.timedelta(minutes=5)
    launch = _own_launch(env)
    if path is not None:
        store: Store = FileStore(path, topo.world_size)
        store.set_timeout(store_timeout)
        job_id = "file"
        chan, keep = channel_beside(store, job_id, topo.rank, topo.world_size, store_timeout)
        start(
            backend,
            topo,
            store,
            job_id=job_id,
            hosts_store=topo.rank == 0,
            options=options,
            launch=launch,
            timeout=timeout,
            channel_store=chan,
            keep_alive=keep,
        )
        return
    hosts = topo.rank == 0 and not launch_env.use_agent_store
    oldstore.before_new_group(launch_env.master_port)
    if hosts:
        store = serve(launch_env.master_addr, launch_env.master_port, topo.world_size, store_timeout)
    else:
        store = TCPStore(launch_env.master_addr, launch_env.master_port, topo.world_size, False, timeout=store_timeout)
    start(
        backend,
        topo,
        store,
        job_id=launch_env.job_id,
        hosts_store=hosts,
        options=options,
        launch=launch,
        timeout=timeout,
        error_file=launch_env.error_file,
    )


# --- adopting, following and retiring ---------------------------------------------------


_SERIAL = Context(Backend())


def current() -> Context:
    """The process's context; follows the default process group (see the module docstring).

    Cost on the happy path: one identity comparison.
    """
    ctx = context.peek()
    if ctx is not None:
        if ctx.pg is None or ctx.pg is dist.group.WORLD:
            return ctx
        retire(ctx)  # its group was destroyed or replaced behind tether's back
    if dist.is_available() and dist.is_initialized() and dist.group.WORLD is not context.abandoned():
        return adopt_process_group()
    return _SERIAL


def adopt_process_group() -> Context:
    """Adopt a process group the user created with ``dist.init_process_group``."""
    env = os.environ
    rank, world = dist.get_rank(), dist.get_world_size()
    launch_env = from_torchrun(env)
    job_id = launch_env.job_id if launch_env is not None else "adopted"
    store: Store = dist.distributed_c10d._get_default_store()
    keep = None
    base = store
    while isinstance(base, PrefixStore):
        base = base.underlying_store
    if not has_queues(base) or isinstance(base, FileStore):
        store, keep = channel_beside(store, job_id, rank, world, datetime.timedelta(minutes=5))
    prefix = Channel.make_prefix(job_id, generation(store, job_id, rank))
    topo = adopted_topology(store, prefix, rank, world, env)
    backend = NativeBackend(topo, str(dist.get_backend()), owns_group=False)
    store_host = 0 if launch_env is None or not launch_env.use_agent_store else -1  # rank 0's, or the agent's
    hosts = rank == store_host
    options = Options.from_kwargs({}, store_host)
    error_file = launch_env.error_file if launch_env else None
    ctx = _watch(backend, store, prefix, hosts, options, _own_launch(env), error_file, False, keep, pg=dist.group.WORLD)
    if keep is None:  # ``ctx.store`` is a connection to the default store itself, its prefix and all
        ctx.default_store_twin = ctx.store
    return ctx


def sync(temporary: bool = False) -> None:
    """ignite compatibility: pick up a process group created outside tether (done lazily anyway)."""
    current()


def set_local_rank(index: int) -> None:
    """Hint the local rank when the user created the process group without tether."""
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise ValueError(f"set_local_rank: index must be a non-negative int, got {index!r}")
    context.set_local_rank_hint(index)
