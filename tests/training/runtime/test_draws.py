"""Random draws made on one rank and followed on another (a sharded setup's source).

The draws of a recorded setup, made again from another seed, are in
:mod:`tests.training.runtime.test_replay`.
"""

from __future__ import annotations

import random

import numpy as np
import torch

from flexgraph.training.runtime import capture_rng
from flexgraph.training.runtime._draws import host_generators_moved


def test_draws_from_python_or_numpy_are_told_apart():
    before = capture_rng()
    torch.rand(3)
    assert not host_generators_moved(before)
    np.random.rand()
    assert host_generators_moved(before)
    before = capture_rng()
    random.random()
    assert host_generators_moved(before)
