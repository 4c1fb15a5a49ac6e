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
