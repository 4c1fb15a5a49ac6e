"""SLURM: a pure function from a task's environment to torchrun-style variables.

``srun python train.py`` starts one task per rank; SLURM tells each task where it is
(``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NTASKS``, the node list...), in its own
names. ``torchrun_vars`` translates them into the names ``_env.from_torchrun`` reads
(RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
MASTER_PORT). Nothing here reads or writes ``os.environ``: ``runtime.initialize`` merges
the result into its own copy of the environment.

Rules:

* **When it applies**: ``SLURM_PROCID`` is set (this process is a SLURM task), the job
  was not started by torchrun (``TORCHELASTIC_RUN_ID`` unset: under torchrun the SLURM
  task is torchrun's agent, and torchrun's own variables describe the rank), and
  ``TETHER_SLURM`` is not ``"0"`` (the escape hatch for another launcher inside a task).
* **Contradictions are errors**: any torchrun-style variable already present (set by a
  container hook such as enroot's, or by hand) must agree with SLURM's, or
  ``ValueError`` names both values. tether lays ranks out node by node, so SLURM's
  rank must be ``node id * tasks per node + local id`` (``srun --distribution=block``).
* **Store address**: ``MASTER_ADDR`` defaults to the first host of the step's node list
  (``SLURM_STEP_NODELIST``, else ``SLURM_JOB_NODELIST``, else ``SLURM_NODELIST``), which
  hosts task 0 under block distribution; ``MASTER_PORT`` defaults to
  ``15000 + SLURM_JOB_ID % 5000``, the same on every task of the job.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ._env import env_int as _int

PORT_BASE = 15000
PORT_SPAN = 5000

_REQUIRED = ("SLURM_JOB_ID", "SLURM_PROCID", "SLURM_LOCALID")


def applies(env: Mapping[str, str]) -> bool:
    """True when ``env`` is a SLURM task's that tether should read (see the module rules)."""
    return "SLURM_PROCID" in env and "TORCHELASTIC_RUN_ID" not in env and env.get("TETHER_SLURM", "1") != "0"


def torchrun_vars(env: Mapping[str, str]) -> dict[str, str]:
    """The torchrun-style variables of this SLURM task; ``{}`` when SLURM does not apply.

    Args:
        env: the process environment (a mapping; it is not modified).

    Returns:
        RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR and
        MASTER_PORT, as strings.

    Raises:
        ValueError: a SLURM variable is missing or malformed, the tasks are not laid out
            node by node with the same count on every node, or a torchrun-style variable
            already in ``env`` contradicts SLURM.

    Example::

        >>> torchrun_vars({"SLURM_JOB_ID": "1234", "SLURM_PROCID": "3", "SLURM_LOCALID": "1",
        ...                "SLURM_NTASKS": "4", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "1",
        ...                "SLURM_JOB_NODELIST": "gpu[07-08]"})["MASTER_ADDR"]
        'gpu07'
    """
    if not applies(env):
        return {}
    missing = [k for k in _REQUIRED if k not in env]
    if not any(k in env for k in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")):
        missing.append("SLURM_NTASKS")
    if missing:
        raise ValueError(f"SLURM task environment is missing {missing}; start the ranks with srun")
    rank = _int(env, "SLURM_PROCID")
    local_rank = _int(env, "SLURM_LOCALID")
    world = _int(env, _first(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"))
    nodes_key = _first(env, "SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES")
    nnodes = _int(env, nodes_key) if nodes_key else 1
    nproc = _tasks_per_node(env, world, nnodes)
    node_rank = _int(env, "SLURM_NODEID") if "SLURM_NODEID" in env else rank // nproc
    if not 0 <= rank < world:
        raise ValueError(f"SLURM_PROCID={rank} is not in [0, {world}) (SLURM_NTASKS={world})")
    if not 0 <= node_rank < nnodes:
        raise ValueError(f"SLURM_NODEID={node_rank} is not in [0, {nnodes}) ({nodes_key}={nnodes})")
    if not 0 <= local_rank < nproc or rank != node_rank * nproc + local_rank:
        raise ValueError(
            f"SLURM placed task {rank} as local task {local_rank} of node {node_rank} with {nproc} tasks per node; "
            "tether needs ranks laid out node by node: use srun --distribution=block"
        )
    derived = {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(nproc),
        "GROUP_RANK": str(node_rank),
    }
    _check_agrees(env, derived)
    derived["MASTER_ADDR"] = env.get("MASTER_ADDR") or _first_host(env)
    derived["MASTER_PORT"] = env.get("MASTER_PORT") or str(master_port(env["SLURM_JOB_ID"]))
    return derived


def master_port(job_id: str) -> int:
    """The store's port for SLURM job ``job_id``: the same on every task, in [15000, 20000)."""
    digits = job_id.split("_")[0]  # an array task "1234_7" shares its job id's digits
    if not digits.isdigit():
        raise ValueError(f"SLURM_JOB_ID must be a number to derive MASTER_PORT, got {job_id!r}; set MASTER_PORT")
    return PORT_BASE + int(digits) % PORT_SPAN


def expand_hostlist(nodelist: str) -> list[str]:
    """Expand a SLURM host list: ``"node[01-03,7],gpu1"`` -> node01 node02 node03 node7 gpu1.

    Each bracket element keeps its own zero padding (``01-03`` -> 2 digits, ``7`` -> 1),
    as ``scontrol show hostnames`` does; several brackets in one name expand in order
    (``r[1-2]n[1-2]`` -> r1n1 r1n2 r2n1 r2n2).

    Raises:
        ValueError: unbalanced brackets, an empty or reversed range, or a non-numeric one.
    """
    hosts: list[str] = []
    for item in _split_top(nodelist.replace(" ", "")):
        hosts += _expand_one(item, nodelist)
    return hosts


# --- helpers --------------------------------------------------------------------------


def _first(env: Mapping[str, str], *names: str) -> str:
    return next((n for n in names if n in env), "")


def _tasks_per_node(env: Mapping[str, str], world: int, nnodes: int) -> int:
    """Tasks on each node: SLURM_NTASKS_PER_NODE, else SLURM_(STEP_)TASKS_PER_NODE, else derived."""
    if "SLURM_NTASKS_PER_NODE" in env:
        counts = [_int(env, "SLURM_NTASKS_PER_NODE")]
        source = "SLURM_NTASKS_PER_NODE"
    elif source := _first(env, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        counts = _parse_tasks_per_node(env[source], source)
    else:
        counts, source = [world // nnodes if nnodes and world % nnodes == 0 else -1], "SLURM_NTASKS / nodes"
    if len(set(counts)) != 1 or counts[0] < 1 or counts[0] * nnodes != world:
        raise ValueError(
            f"tether needs the same number of tasks on every node: {source} gives {counts} "
            f"for {world} tasks on {nnodes} node(s); use srun --ntasks-per-node"
        )
    return counts[0]


def _parse_tasks_per_node(text: str, name: str) -> list[int]:
    """``"4(x2),3"`` -> [4, 4, 3]."""
    counts: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if m is None:
            raise ValueError(f"{name} must look like '4(x2),3', got {text!r}")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def _first_host(env: Mapping[str, str]) -> str:
    key = _first(env, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    if not key:
        raise ValueError("SLURM task environment has no node list (SLURM_JOB_NODELIST); set MASTER_ADDR")
    hosts = expand_hostlist(env[key])
    if not hosts:
        raise ValueError(f"{key}={env[key]!r} names no host; set MASTER_ADDR")
    return hosts[0]


def _check_agrees(env: Mapping[str, str], derived: Mapping[str, str]) -> None:
    for name, value in derived.items():
        if name in env and env[name].strip() != value:
            raise ValueError(
                f"{name}={env[name]} contradicts SLURM, which gives {name}={value} for this task "
                f"(SLURM_PROCID={env['SLURM_PROCID']}); unset {name}, or set TETHER_SLURM=0 if another "
                "launcher inside the SLURM task started this process"
            )


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"host list has nested brackets: {text!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"host list has an unmatched ']': {text!r}")
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"host list has an unmatched '[': {text!r}")
    items.append(text[start:])
    return [item for item in items if item]


def _expand_one(item: str, whole: str) -> list[str]:
    open_at = item.find("[")
    if open_at < 0:
        return [item]
    close_at = item.index("]", open_at)
    head, body, tail = item[:open_at], item[open_at + 1 : close_at], item[close_at + 1 :]
    rests = _expand_one(tail, whole)
    out = []
    for number in _expand_range(body, whole):
        out += [head + number + rest for rest in rests]
    return out


def _expand_range(body: str, whole: str) -> list[str]:
    numbers: list[str] = []
    for element in body.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", element)
        if m is None:
            raise ValueError(f"host list range {element!r} is not N or N-M in {whole!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise ValueError(f"host list range {element!r} is reversed in {whole!r}")
        width = len(lo) if lo.startswith("0") else 0
        numbers += [str(n).zfill(width) for n in range(int(lo), int(hi) + 1)]
    return numbers
