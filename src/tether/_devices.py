"""Which GPU a rank uses: pure functions of what the process can see.

A launcher decides which GPUs a process sees, and tether follows it; the index is never
assumed to equal the local rank:

* torchrun on a node of N GPUs, every rank seeing all of them: rank ``L`` takes ``cuda:L``.
* ``srun --gpus-per-task=1`` (SLURM binds each task to one GPU through
  ``CUDA_VISIBLE_DEVICES``), or ``CUDA_VISIBLE_DEVICES`` set per rank: each rank sees one
  device and takes ``cuda:0``.
* In general the local rank modulo the devices this process sees
  (``CUDA_VISIBLE_DEVICES``, else ``SLURM_STEP_GPUS``/``SLURM_JOB_GPUS`` to describe them,
  else every device of the machine): the index is always one the process has.
* A process group made outside tether with ``device_id`` is bound to a device: that one.

Two ranks that end up on one physical GPU work with gloo, and NCCL refuses them ("Duplicate
GPU detected"), so with NCCL tether compares the ranks' devices before creating the
group (``duplicate_devices``) and every rank raises the same clear ``ValueError``.
Nothing here reads ``os.environ`` or CUDA by itself: the callers pass them in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence


@dataclasses.dataclass(frozen=True)
class DeviceChoice:
    """The CUDA index a rank takes, and why (for error messages and ``tether.show_config``)."""

    index: int
    why: str


def visible_devices(env: Mapping[str, str]) -> list[str] | None:
    """The entries of ``CUDA_VISIBLE_DEVICES`` as CUDA reads them; None when it is unset.

    CUDA stops at the first entry it cannot parse (``"0,1,-1,2"`` is ``0,1``) and ignores
    spaces; entries may be indices, ``GPU-<uuid>`` or ``MIG-<uuid>``.
    """
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    seen: list[str] = []
    for item in (part.strip() for part in raw.split(",")):
        valid = item.isdigit() or item.startswith(("GPU-", "MIG-"))
        if not valid or item in seen:
            break
        seen.append(item)
    return seen


def choose_device(env: Mapping[str, str], local_rank: int, local_world_size: int, device_count: int) -> DeviceChoice:
    """The CUDA index for a rank that sees ``device_count`` devices.

    Raises:
        RuntimeError: the process sees no CUDA device.
    """
    visible = visible_devices(env)
    if device_count < 1:
        told = f" (CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']!r})" if visible is not None else ""
        raise RuntimeError(f"tether: this process sees no CUDA device{told}")
    index = local_rank % device_count
    if visible is not None:
        source = f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']!r}"
    elif env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS"):
        source = f"SLURM's GPUs {env.get('SLURM_STEP_GPUS') or env.get('SLURM_JOB_GPUS')!r}"
    else:
        source = "every GPU of the machine"
    if device_count == 1:
        why = f"{source} gives this process one device"
    elif index == local_rank:
        why = f"local rank {local_rank} of {local_world_size}, {device_count} devices visible ({source})"
    else:
        why = f"local rank {local_rank} modulo the {device_count} devices visible ({source})"
    return DeviceChoice(index, why)


def device_identity(host: str, uuid: str, env: Mapping[str, str]) -> str:
    """What makes two ranks' GPUs the same one for NCCL: the host (``NCCL_HOSTID`` if set) and the UUID."""
    return f"{env.get('NCCL_HOSTID') or host}/{uuid}"


def duplicate_devices(identities: Sequence[str], ranks: Sequence[int]) -> str | None:
    """A message naming the ranks that share a GPU, or None; the same text on every rank."""
    owners: dict[str, list[int]] = {}
    for rank, ident in zip(ranks, identities, strict=True):
        owners.setdefault(ident, []).append(rank)
    shared = sorted(sorted(rs) for rs in owners.values() if len(rs) > 1)
    if not shared:
        return None
    groups = "; ".join(f"ranks {', '.join(map(str, rs))} share one GPU" for rs in shared)
    return (
        f"nccl: {groups}. NCCL does not support two ranks on one GPU (it fails with "
        "'Duplicate GPU detected'): start one rank per GPU (torchrun --nproc-per-node=<GPUs>, "
        "srun --gpus-per-task=1), or use backend='gloo'"
    )
