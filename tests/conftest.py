"""Settings for the whole suite.

Property tests draw the same examples on every run (``derandomize``), so that
the suite cannot fail by chance: a run fails only where the code changed.
``HYPOTHESIS_PROFILE=explore`` draws new examples each time, to hunt for bugs;
a failure prints the example to add with ``@example``. ``small_device`` is a
real, tiny filesystem for the full-device tests.
"""

import os
import subprocess

import pytest
from hypothesis import settings

settings.register_profile("repeatable", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


@pytest.fixture
def small_device(tmp_path):
    """A real 300 KiB filesystem (tmpfs) mounted at ``tmp_path/'small'``, unmounted after.

    For what a full device does to a save: nothing stands in for the OS here.
    Mounting needs root; elsewhere the test is skipped, saying why.
    """
    if os.geteuid() != 0:
        pytest.skip("mounting a 300 KiB tmpfs needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)
