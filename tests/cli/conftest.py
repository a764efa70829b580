"""Fixtures for the command-line tests; the helpers they share are plain modules.

``cli_helpers.py`` (configs with test-only hooks, ``flexgraph_run``,
``launch_two``, the training-state comparisons), ``portable_helpers.py`` (the
portable-checkpoint configs and runs) and ``slurm_cluster.py`` (a one-node SLURM
cluster) are imported by path: ``from tests.cli.cli_helpers import
flexgraph_run``. The fixtures several test files use live here.

The repository root and ``examples/`` are put on ``sys.path`` first, as in
``tests/training``: the in-process tests import ``flexgraph`` from the checkout,
and the example modules (``digits``) by name, as the quickstart config's
``custom_imports=['digits']`` expects.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_REPO = Path(__file__).resolve().parents[2]
for _path in (_REPO, _REPO / "examples"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from tests.cli.cli_helpers import same_start  # noqa: E402 (needs the paths above)
from tests.cli.slurm_cluster import SlurmUnavailable, start_cluster  # noqa: E402


@pytest.fixture
def start_weights(tmp_path: Path) -> str:
    """A ``load_from`` line for one fixed initial DigitsMLP, saved under ``tmp_path``.

    Runs compared with each other (a killed run and its reference, one strategy
    and another) start from these weights (:func:`tests.cli.cli_helpers.same_start`).
    """
    return same_start(tmp_path)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A private SLURM cluster on this host (:mod:`tests.cli.slurm_cluster`), one per
    test process; the tests that ask for it skip, saying why, where it cannot start."""
    try:
        cluster = start_cluster(tmp_path_factory.mktemp("slurm"))
    except SlurmUnavailable as why:
        pytest.skip(str(why))
    yield cluster
    cluster.stop()
