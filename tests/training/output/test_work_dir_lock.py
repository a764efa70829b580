"""One owner per work_dir: the lock a run holds, as other runs and its own ranks meet it.

Owners are real processes (forks of this one: cheap, and they hold real OS
locks and really die). The filesystem without OS locks (Lustre without
``-o flock``) cannot be mounted here, so that one case makes ``flock`` fail
as such a filesystem does, and checks the heartbeat that then holds the lock.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import threading
import time
import warnings
from pathlib import Path

import pytest

from flexgraph.core.errors import FlexgraphError
from flexgraph.training.errors import WorkDirBusyError
from flexgraph.training.output import (
    LOCK_FILE,
    check_work_dir_owner,
    is_host_local,
    take_work_dir,
)


def _owner_in_child(work_dir: Path, run: str = "other-run") -> tuple[int, int]:
    """Fork a process that takes ``work_dir`` and waits; returns ``(pid, pipe to end it)``."""
    ready_r, ready_w = os.pipe()
    end_r, end_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the owner: take it, say so, wait for the end, then die without releasing
        try:
            os.close(end_w)  # EOF on end_r once the test closes its end
            take_work_dir(work_dir, run)
            os.write(ready_w, b"1")
            os.read(end_r, 1)
        finally:
            os._exit(0)
    os.read(ready_r, 1)
    for fd in (ready_r, ready_w, end_r):
        os.close(fd)
    return pid, end_w


def _end(pid: int, pipe: int) -> None:
    os.close(pipe)
    os.waitpid(pid, 0)


@pytest.mark.slow
def test_a_second_run_is_refused_naming_the_owner_and_writes_nothing(tmp_path):
    work = tmp_path / "work"
    pid, pipe = _owner_in_child(work)
    try:
        before = sorted(work.iterdir())
        with pytest.raises(WorkDirBusyError) as refused:
            take_work_dir(work, "this-run")
        assert sorted(work.iterdir()) == before == [work / LOCK_FILE]
        message = str(refused.value)
        assert f"host {socket.gethostname()} pid {pid}" in message
        assert str(work) in message and "--work-dir" in message and "\n" not in message
        assert isinstance(refused.value, FlexgraphError)  # the CLI: one line, exit 2
    finally:
        _end(pid, pipe)


def test_the_lock_names_its_owner_and_is_gone_after_a_normal_end(tmp_path):
    lock = take_work_dir(tmp_path, "run-1")
    content = json.loads((tmp_path / LOCK_FILE).read_text())
    assert (content["host"], content["pid"], content["run"]) == (
        socket.gethostname(), os.getpid(), "run-1")
    assert lock.os_locked
    lock.release()
    assert not (tmp_path / LOCK_FILE).exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a normal end leaves nothing to take over
        take_work_dir(tmp_path, "run-2").release()


@pytest.mark.slow
def test_a_dead_owners_lock_is_taken_over_with_a_warning(tmp_path):
    pid, pipe = _owner_in_child(tmp_path)
    _end(pid, pipe)  # it died holding the lock: the file stays, the OS lock went with it
    assert (tmp_path / LOCK_FILE).exists()
    with pytest.warns(UserWarning, match=f"took over .* pid {pid}"):
        lock = take_work_dir(tmp_path, "next-run")
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()


@pytest.fixture
def seen_from_other_hosts(monkeypatch):
    """The work_dir is taken for one on a network filesystem (NFS cannot be mounted here):
    the owner keeps a heartbeat there, as on a cluster's shared disk."""
    import flexgraph.training.output._lock as lock_module

    monkeypatch.setattr(lock_module, "is_host_local", lambda path: False)


@pytest.mark.slow
def test_processes_of_the_same_run_recognise_its_lock_and_rank0_keeps_its_heartbeat(
        tmp_path, seen_from_other_hosts):
    pid, pipe = _owner_in_child(tmp_path, run="launch-7")
    try:
        rank0 = take_work_dir(tmp_path, "launch-7", heartbeat_every=0.05)  # under its launcher
        assert not rank0.owned
        time.sleep(0.3)
        content = json.loads((tmp_path / LOCK_FILE).read_text())
        assert content["pid"] == pid and content["heartbeat"] > content["started"]  # kept
        rank0.release()
        assert (tmp_path / LOCK_FILE).exists()  # still the launcher's
        check_work_dir_owner(tmp_path, "launch-7")  # any other rank of it
        with pytest.raises(WorkDirBusyError, match=f"pid {pid}"):
            check_work_dir_owner(tmp_path, "launch-8")  # a rank of another run stops too
    finally:
        _end(pid, pipe)
    check_work_dir_owner(tmp_path, "launch-8")  # its owner is dead: nothing stops a rank


def test_a_requeued_job_takes_over_its_earlier_attempts_lock_from_another_host(tmp_path):
    """The same SLURM job and step (one run id) killed on node07 and requeued here at once:
    its heartbeat is fresh, but this process holds the OS lock, so that attempt is dead."""
    _write_owner(tmp_path, "node07", time.time())
    content = json.loads((tmp_path / LOCK_FILE).read_text())
    (tmp_path / LOCK_FILE).write_text(json.dumps({**content, "run": "slurm-42.0"}))
    with pytest.warns(UserWarning, match="took over .*host node07"):
        lock = take_work_dir(tmp_path, "slurm-42.0")
    assert lock.owned
    lock.release()


def test_the_owner_refreshes_its_heartbeat(tmp_path, seen_from_other_hosts):
    lock = take_work_dir(tmp_path, "run", heartbeat_every=0.05)
    first = json.loads((tmp_path / LOCK_FILE).read_text())["heartbeat"]
    time.sleep(0.3)
    assert json.loads((tmp_path / LOCK_FILE).read_text())["heartbeat"] > first
    lock.release()


def test_on_a_local_filesystem_the_owner_starts_no_thread(tmp_path, monkeypatch):
    """No other host can see a local disk, and the OS lock holds there: a thread would only
    slow every step down (glibc's malloc leaves its single-threaded path)."""
    import flexgraph.training.output._lock as lock_module

    # what is_host_local says of a local disk (whatever filesystem this machine's tmp is on)
    monkeypatch.setattr(lock_module, "is_host_local", lambda path: True)
    before = threading.active_count()
    lock = take_work_dir(tmp_path, "run", heartbeat_every=0.05)
    time.sleep(0.2)
    assert threading.active_count() == before
    content = json.loads((tmp_path / LOCK_FILE).read_text())
    assert content["heartbeat"] == content["started"]
    lock.release()


MOUNTS = """\
overlay / overlay rw,relatime,lowerdir=/a,upperdir=/b,workdir=/c 0 0
proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0
/dev/nvme0n1p1 /scratch ext4 rw,relatime 0 0
nas:/export/home /scratch/shared nfs4 rw,relatime,vers=4.2 0 0
tmpfs /dev/shm tmpfs rw,nosuid,nodev 0 0
10.0.0.5@tcp:/lustre /lustre lustre rw,flock 0 0
/dev/sdb1 /mnt/my\\040disk xfs rw 0 0
/dev/sdc1 /data ext4 rw 0 0
nas:/data /data nfs rw 0 0
"""


@pytest.mark.parametrize(("path", "local"), [
    ("/scratch/runs/exp1", True),
    ("/scratch/shared/runs/exp1", False),  # the deeper mount point decides
    ("/scratch/sharedness", True),  # a name that only starts like a mount point
    ("/lustre/project/exp1", False),
    ("/dev/shm/exp1", True),
    ("/mnt/my disk/exp1", True),  # mount points with spaces, as the kernel escapes them
    ("/home/user/exp1", True),  # under the root overlay
    ("/data/exp1", False),  # mounted over: the later mount is the one seen
])
def test_which_work_dirs_only_this_host_can_see(path, local):
    assert is_host_local(path, MOUNTS) is local


def test_without_a_mount_table_the_heartbeat_stays():
    assert not is_host_local("/anywhere", "")


@pytest.fixture
def no_os_locks(monkeypatch):
    """``flock`` fails as on a filesystem without OS locks (Lustre without -o flock)."""
    import fcntl

    def refuse(fd, operation):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", refuse)


def _write_owner(work_dir: Path, host: str, heartbeat: float, pid: int = 4242) -> None:
    (work_dir / LOCK_FILE).write_text(json.dumps(
        {"host": host, "pid": pid, "run": "theirs", "started": heartbeat,
         "heartbeat": heartbeat, "token": "t"}))


def test_without_os_locks_a_fresh_heartbeat_on_another_host_holds(tmp_path, no_os_locks):
    _write_owner(tmp_path, "node07", time.time())
    with pytest.raises(WorkDirBusyError, match="host node07 pid 4242"):
        take_work_dir(tmp_path, "mine", settle=0)
    with pytest.raises(WorkDirBusyError, match="host node07"):
        check_work_dir_owner(tmp_path, "mine")


def test_without_os_locks_a_stale_heartbeat_is_taken_over(tmp_path, no_os_locks):
    _write_owner(tmp_path, "node07", time.time() - 600)
    with pytest.warns(UserWarning, match="took over .*host node07"):
        lock = take_work_dir(tmp_path, "mine", settle=0)
    assert not lock.os_locked
    lock.release()


@pytest.mark.slow
def test_without_os_locks_a_dead_process_on_this_host_holds_nothing(tmp_path, no_os_locks):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)  # a pid that no process has now
    _write_owner(tmp_path, socket.gethostname(), time.time(), pid=pid)
    with pytest.warns(UserWarning, match=f"pid {pid}"):
        take_work_dir(tmp_path, "mine", settle=0).release()


@pytest.mark.slow
def test_a_killed_owner_frees_the_work_dir_at_once(tmp_path):
    """SIGKILL, as the OOM killer or a scheduler's kill sends it: the OS drops the lock."""
    pid, pipe = _owner_in_child(tmp_path)
    os.kill(pid, signal.SIGKILL)
    _end(pid, pipe)
    with pytest.warns(UserWarning, match=f"pid {pid}"):
        take_work_dir(tmp_path, "next").release()
