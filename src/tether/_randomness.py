"""Random states for ``tether.Checkpointer``: seeding a step, saving and restoring a process's states.

The generators are torch's (and CUDA's, where this process already uses CUDA: asking never
initialises it), Python's ``random`` and NumPy's global one (when NumPy was imported).
"""

from __future__ import annotations

import random
import sys
import zlib
from collections.abc import Mapping
from typing import Any

import torch


def seed_step(seed: int, step: int, rank: int) -> None:
    """Seed every generator from ``(seed, step, rank)``: a step's randomness is a function of its position."""
    value = zlib.crc32(f"{seed}/{step}/{rank}".encode())
    torch.manual_seed(value)
    random.seed(value)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(value)


def state() -> dict[str, Any]:
    """This process's random states."""
    numpy = sys.modules.get("numpy")
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if _cuda_in_use() else None,
        "python": random.getstate(),
        "numpy": numpy.random.get_state() if numpy is not None else None,
    }


def restore(saved: Mapping[str, Any]) -> None:
    torch.set_rng_state(saved["torch"])
    if saved.get("cuda") is not None and torch.cuda.is_available():  # saved by a rank that used CUDA
        torch.cuda.set_rng_state_all(saved["cuda"])
    random.setstate(saved["python"])
    numpy = sys.modules.get("numpy")
    if saved.get("numpy") is not None and numpy is not None:
        numpy.random.set_state(saved["numpy"])


def _cuda_in_use() -> bool:
    return torch.cuda.is_available() and bool(torch.cuda.is_initialized())  # type: ignore[no-untyped-call]
