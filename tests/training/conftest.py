"""Fixtures for the training-runtime tests (helpers live in training_helpers.py).

The repository root and ``examples/`` are put on ``sys.path`` first: the tests
import ``flexgraph`` from the checkout, and the quickstart config's
``custom_imports=['digits']`` expects its own folder to be importable.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_REPO = Path(__file__).resolve().parents[2]
for _path in (_REPO, _REPO / "examples"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from tests.training.training_helpers import toy_cfg  # noqa: E402 (needs the paths above)


@pytest.fixture
def make_cfg(tmp_path: Path):
    """``make_cfg(**overrides)`` -> a toy config writing under ``tmp_path``."""

    def make(**overrides):
        return toy_cfg(overrides.pop("work_dir", tmp_path / "work"), **overrides)

    return make
