"""The random states a checkpoint carries (``tether/_randomness.py``), in-process."""

from __future__ import annotations

import random

import numpy
import torch

from tether import _randomness


def draws() -> tuple[list[float], float, list[float]]:
    return torch.rand(3).tolist(), random.random(), numpy.random.rand(2).tolist()


def test_the_states_travel_as_one_bytes_value_and_restore_every_generator() -> None:
    saved = _randomness.state()
    assert isinstance(saved, bytes)  # one leaf to gather, walk and pickle
    first = draws()
    assert draws() != first
    _randomness.restore(saved)
    assert draws() == first


def test_the_states_of_checkpoints_written_before_them_a_dict_of_tensors_still_restore() -> None:
    old = {"torch": torch.get_rng_state(), "cuda": None, "python": random.getstate(), "numpy": numpy.random.get_state()}
    first = draws()
    _randomness.restore(old)
    assert draws() == first


def test_a_seeding_leaves_every_generator_as_torch_manual_seed_and_the_others_seeds_would() -> None:
    # the fast path seeds the CPU generator alone where torch has no accelerator
    # (torch.manual_seed spent ~120 us there queuing seeds for absent devices)
    _randomness.seed_between(7, 12, 1)
    fast = draws()
    value = _randomness.zlib.crc32(b"7/after/12/1")
    torch.manual_seed(value)
    random.seed(value)
    numpy.random.seed(value)
    assert draws() == fast
    _randomness.seed_step(7, 12, 1)
    assert draws() != fast  # the step's stream is another
