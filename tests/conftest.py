"""Settings for the whole suite.

Property tests draw the same examples on every run (``derandomize``), so that
the suite cannot fail by chance: a run fails only where the code changed.
``HYPOTHESIS_PROFILE=explore`` draws new examples each time, to hunt for bugs;
a failure prints the example to add with ``@example``. ``small_device`` is a
real, tiny filesystem for the full-device tests; ``module_folder`` holds one
module's training runs and goes when they pass.
"""

import os
import shutil
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


@pytest.fixture(scope="module")
def module_folder(request, tmp_path_factory):
    """A folder for one module's runs, removed when the module's tests have all passed.

    OpenMMLab's checkpoints make a module's runs gigabytes (MMDetection's, several):
    kept to the session's end, the modules together would fill a machine's disk.
    Kept where a test failed, as pytest keeps a failing test's ``tmp_path``.
    """
    failed = request.session.testsfailed
    folder = tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2])
    yield folder
    if request.session.testsfailed == failed:
        shutil.rmtree(folder, ignore_errors=True)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--forbid-processes", action="store_true",
        help="fail each test not marked slow that starts a process (checks the slow marks: "
             "pytest -m 'not slow' --forbid-processes)")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--forbid-processes"):
        config.pluginmanager.register(_ProcessWatch(), "process-watch")


class _ProcessWatch:
    """Records every process a test starts: subprocess, fork, multiprocessing, posix_spawn.

    Fixtures count as part of the first test that uses them (a module-scoped
    fixture that starts runs makes each of its module's tests slow in effect).
    A short system command run by a fixture of this file (``mount`` for
    ``small_device``) is not a Python process and is let through.
    """

    ALLOWED = ("mount", "umount")

    def __init__(self) -> None:
        import multiprocessing.process

        self.started: list[str] = []
        self.watching = False
        watch = self

        def wrap(owner, name, describe):
            original = getattr(owner, name)

            def started(*args, **kwargs):
                what = describe(*args, **kwargs)
                if watch.watching and what is not None:
                    watch.started.append(what)
                return original(*args, **kwargs)

            setattr(owner, name, started)

        def command(args):
            argv = [args] if isinstance(args, (str, bytes)) else list(args)
            name = os.path.basename(str(argv[0])) if argv else "?"
            return None if name in self.ALLOWED else " ".join(map(str, argv))[:200]

        wrap(subprocess.Popen, "_execute_child", lambda popen, args, *a, **k: command(args))
        wrap(os, "fork", lambda: "os.fork()")
        wrap(os, "posix_spawn", lambda path, argv, *a, **k: command(argv))
        wrap(os, "posix_spawnp", lambda path, argv, *a, **k: command(argv))
        wrap(multiprocessing.process.BaseProcess, "start",
             lambda process: f"multiprocessing {type(process).__name__}")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        self.started.clear()
        self.watching = item.get_closest_marker("slow") is None
        try:
            return (yield)
        finally:
            self.watching = False

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = yield
        if call.when == "teardown" and self.started and report.passed:
            report.outcome = "failed"
            report.longrepr = (f"{item.nodeid} starts a process but is not marked slow: "
                               + "; ".join(self.started[:3]))
        return report
