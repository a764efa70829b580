"""Fixtures of the command line's tests."""

import pytest

from tests.cli.slurm_cluster import SlurmUnavailable, start_cluster


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
