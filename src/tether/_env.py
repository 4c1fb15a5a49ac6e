"""Pure functions from a launcher's environment (torchrun, SLURM) to a config.

Nothing here reads or writes ``os.environ`` by itself (``interactive`` reads ``sys``): callers pass the mapping in, so
the functions are testable and a config never leaks into another job's environment.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True)
class Topology:
    """Where this process sits in the job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, world_size), got rank={self.rank}, world_size={self.world_size}")
        if not 0 <= self.local_rank < self.nproc_per_node:
            raise ValueError(
                f"local rank must be in [0, nproc_per_node), got {self.local_rank} and {self.nproc_per_node}"
            )

    @property
    def node_ranks(self) -> list[int]:
        """Global ranks on this node, assuming ranks are laid out node by node."""
        first = self.rank - self.local_rank
        return list(range(first, first + self.nproc_per_node))


@dataclasses.dataclass(frozen=True)
class LaunchEnv:
    """What a launcher told this process."""

    topology: Topology
    master_addr: str
    master_port: int
    job_id: str  # unique per run *and* restart, so a restarted job never reads stale records
    use_agent_store: bool  # the launcher (torchrun's agent) hosts the store, not rank 0
    error_file: str | None  # torchelastic's per-worker error file


def env_int(env: Mapping[str, str], name: str) -> int:
    """``env[name]`` as an int, with an error that names the variable."""
    value = env[name]
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {value!r}") from None


def from_torchrun(env: Mapping[str, str]) -> LaunchEnv | None:
    """Read torchrun's (or any ``env://`` launcher's) variables; None when they are absent."""
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    rank, world = env_int(env, "RANK"), env_int(env, "WORLD_SIZE")
    local_rank = env_int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else rank
    nproc = env_int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else world
    if world % nproc:
        raise ValueError(f"WORLD_SIZE={world} is not a multiple of LOCAL_WORLD_SIZE={nproc}")
    node_rank = env_int(env, "GROUP_RANK") if "GROUP_RANK" in env else rank // nproc
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    restart = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    master_port = env_int(env, "MASTER_PORT") if "MASTER_PORT" in env else 29500
    return LaunchEnv(
        topology=Topology(rank, world, local_rank, nproc, world // nproc, node_rank),
        master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
        master_port=master_port,
        job_id=f"{run_id or 'env'}-{master_port}-r{restart}",
        use_agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true",
        error_file=env.get("TORCHELASTIC_ERROR_FILE") or None,
    )


def parse_init_method(init_method: str | None) -> tuple[str, int] | None:
    """``tcp://host:port`` -> (host, port); ``env://``, ``file://...`` or None -> None."""
    if init_method is None or init_method == "env://" or file_path(init_method) is not None:
        return None
    if init_method.startswith("tcp://"):
        host, _, port = init_method[len("tcp://") :].rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"init_method must look like tcp://HOST:PORT, got {init_method!r}")
        return host.strip("[]"), int(port)
    raise ValueError(
        f"init_method {init_method!r} is not supported: tether's failure channel needs a TCP store; "
        "use 'env://' (MASTER_ADDR/MASTER_PORT), 'tcp://HOST:PORT' or 'file:///path'"
    )


def file_path(init_method: str | None) -> str | None:
    """``file:///path`` -> ``/path``; anything else -> None."""
    if not isinstance(init_method, str) or not init_method.startswith("file://"):
        return None
    path = init_method[len("file://") :]
    if not path:
        raise ValueError(f"init_method must look like file:///path/to/file, got {init_method!r}")
    return path


def interactive() -> bool:
    """An interpreter a person types into: ``python -i``, the REPL, a Jupyter kernel."""
    return hasattr(sys, "ps1") or bool(sys.flags.interactive) or "ipykernel" in sys.modules
