"""Where this rank sits in its job: from a launcher's variables, explicit ranks, or hostnames."""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Mapping
from typing import Any

from torch._C._distributed_c10d import Store

from .. import _checks, _slurm
from .._env import LaunchEnv, Topology, from_torchrun, parse_init_method
from . import context
from .channel import wait_keys
from .stores import free_port

log = logging.getLogger("tether")


def read_launch_env(env: dict[str, str], init_method: str | None, rank: Any, world_size: Any) -> LaunchEnv:
    address = parse_init_method(init_method)
    if _slurm.applies(env):  # srun: SLURM's variables, translated and checked (see _slurm)
        if rank is not None or world_size is not None:
            raise ValueError("initialize: rank= and world_size= must not be given under SLURM: srun sets them")
        env = {**env, **_slurm.torchrun_vars(env)}
    given = _checks.check_rank_and_world_size(rank, world_size)
    if given is not None:
        rank, world_size = given
        env = {**env, "RANK": str(rank), "WORLD_SIZE": str(world_size)}
        if "LOCAL_RANK" not in env:
            env.update(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size))
    if address is not None:
        env = {**env, "MASTER_ADDR": address[0], "MASTER_PORT": str(address[1])}
    launch = from_torchrun(env)
    if launch is None:  # no launcher, no ranks: a job of one process, as ignite runs it
        env = {**env, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
        env.setdefault("MASTER_ADDR", "127.0.0.1")
        env.setdefault("MASTER_PORT", str(free_port()))
        launch = from_torchrun(env)
        assert launch is not None
    return launch


_HOSTS_WITHIN = 30.0  # seconds an adopting rank waits for every rank's hostname


def adopted_topology(store: Store, prefix: str, rank: int, world: int, env: Mapping[str, str]) -> Topology:
    """Where this rank sits in a group it did not create.

    From torchrun's variables, or SLURM's, when they are there; else from every rank's
    hostname, as ignite does -- on the store instead of a collective: one ``set`` and a
    read of every rank's key, waited for up to ``_HOSTS_WITHIN`` seconds (then, and for a
    layout that is not node by node, the group counts as one node). ``set_local_rank``'s
    hint wins for the local rank.
    """
    if _slurm.applies(env):
        with contextlib.suppress(ValueError):  # contradictory variables: the hostnames decide
            env = {**env, **_slurm.torchrun_vars(env)}
    hint = context.local_rank_hint
    if "LOCAL_RANK" in env and "LOCAL_WORLD_SIZE" in env:
        local, nproc = int(env["LOCAL_RANK"]), int(env["LOCAL_WORLD_SIZE"])
    else:
        local, nproc = local_from_hostnames(store, prefix, rank, world)
    if hint is not None:
        local = hint
    if world % nproc or not 0 <= local < nproc or rank - local < 0:
        local, nproc = rank, world
    return Topology(rank, world, local, nproc, world // nproc, rank // nproc)


def local_from_hostnames(
    store: Store, prefix: str, rank: int, world: int, host: str | None = None, within: float = _HOSTS_WITHIN
) -> tuple[int, int]:
    """(local rank, ranks per node) from every rank's hostname on ``store``; (rank, world) if unknown."""
    store.set(f"{prefix}host/{rank}", host or socket.gethostname())
    keys = [f"{prefix}host/{r}" for r in range(world)]
    if not wait_keys(store, keys, within, step=0.005):
        log.warning(
            "tether: not every rank of the adopted group called tether within %g s; one node assumed", _HOSTS_WITHIN
        )
        return rank, world
    hosts = [store.get(k).decode() for k in keys]
    mine = [r for r, h in enumerate(hosts) if h == hosts[rank]]
    nproc = len(mine)
    block = all(hosts[r] == hosts[r - r % nproc] for r in range(world)) if world % nproc == 0 else False
    return (mine.index(rank), nproc) if block else (rank, world)
