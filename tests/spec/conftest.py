"""Loading a spec puts its folder on ``sys.path``; undo that after each test.

Otherwise the temporary folders of earlier tests (holding ``cfg.py``,
``base.py``, ``json.py``...) would shadow modules for every later test.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def restore_sys_path() -> Iterator[None]:
    saved = list(sys.path)
    yield
    sys.path[:] = saved
