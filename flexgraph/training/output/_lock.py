"""One owner per work_dir: a lock that a run holds for its whole life.

An OS lock (``flock``) holds where the filesystem grants one; elsewhere a
fresh heartbeat in the file does, and of two starters only the last writer
after :data:`SETTLE` goes on. A work_dir only this host sees gets no heartbeat
thread (a process's first thread slows every later step).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from flexgraph.training.errors import WorkDirBusyError

LOCK_FILE = "flexgraph.lock"
HEARTBEAT_EVERY = 30.0
"""Seconds between two refreshes of the owner's heartbeat."""
STALE_AFTER = 120.0
"""A heartbeat older than this is a dead owner's (where no OS lock tells)."""
SETTLE = 1.0
"""Seconds a starter waits before reading back a lock the OS could not lock."""
_NO_OS_LOCKS = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)
HOST_LOCAL_FILESYSTEMS = frozenset({
    "ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "bcachefs", "jfs", "reiserfs",
    "tmpfs", "ramfs", "overlay", "vfat", "exfat", "ntfs", "ntfs3", "hfsplus", "squashfs"})
"""Filesystem types (Linux's names) that only the host that mounts them can see."""


def is_host_local(path: str | os.PathLike[str], mounts: str | None = None) -> bool:
    """Whether only this host can see ``path`` (its filesystem: :data:`HOST_LOCAL_FILESYSTEMS`).

    Parameters
    ----------
    path : str or PathLike
    mounts : str, optional
        The text of ``/proc/self/mounts``; without one (not Linux) the answer is False.

    Returns
    -------
    bool
    """
    if mounts is None:
        try:
            mounts = Path("/proc/self/mounts").read_text()
        except OSError:
            return False
    target = Path(os.path.realpath(path))
    best, kind = -1, ""
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = Path(fields[1].replace("\\040", " ").replace("\\011", "\t"))
        depth = len(point.parts)  # a later mount on the same point hides the earlier: >=
        if depth >= best and (target == point or point in target.parents):
            best, kind = depth, fields[2]
    return kind in HOST_LOCAL_FILESYSTEMS


def _owner_text(owner: dict[str, Any]) -> str:
    return f"host {owner.get('host', '?')} pid {owner.get('pid', '?')}"


def _read(fd: int) -> dict[str, Any]:
    """The lock's content (``{}``: empty, or not written whole yet)."""
    try:
        data = os.pread(fd, 4096, 0)
        owner = json.loads(data) if data.strip() else {}
    except (OSError, ValueError):
        return {}
    return owner if isinstance(owner, dict) else {}


def _pid_alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, TypeError):
        return True  # someone else's process, or unreadable: assume it lives
    return True


def _alive(owner: dict[str, Any], *, os_locked: bool, stale_after: float) -> bool:
    """Whether ``owner`` (a lock's content) is a live run.

    Under ``os_locked`` an owner on this host is dead; one on another host may
    live where the filesystem keeps locks per host, and its heartbeat tells.
    """
    if not owner:
        return False
    same_host = owner.get("host") == socket.gethostname()
    if same_host:
        return not os_locked and _pid_alive(owner.get("pid"))
    return time.time() - float(owner.get("heartbeat", 0)) < stale_after


def _busy(work_dir: Path, owner: dict[str, Any]) -> WorkDirBusyError:
    return WorkDirBusyError(
        f"work_dir {str(work_dir)!r} belongs to another run ({_owner_text(owner)}, since "
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(owner.get('started', 0)))}); "
        f"wait for it to end, or give this run another --work-dir")


class WorkDirLock:
    """A held work_dir lock; :meth:`release` (or the owner's death) frees it.

    Closing ``fd`` drops the OS lock; without ``os_locked`` only the heartbeat
    holds it. ``owned=False``: a rank that only keeps its launcher's heartbeat.
    """

    def __init__(self, path: Path, fd: int, content: dict[str, Any], os_locked: bool,
                 heartbeat_every: float | None, *, owned: bool = True) -> None:
        self.path = path
        self.os_locked = os_locked
        self.owned = owned
        self._fd = fd
        self._content = content
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        if heartbeat_every is not None:
            self._beat = threading.Thread(target=self._beat_until_released,
                                          args=(heartbeat_every,), daemon=True,
                                          name="flexgraph-work-dir-heartbeat")
            self._beat.start()

    def _write(self) -> None:
        data = json.dumps(self._content).encode()
        os.pwrite(self._fd, data.ljust(len(data) + 1, b"\n"), 0)
        os.ftruncate(self._fd, len(data) + 1)

    def _beat_until_released(self, every: float) -> None:
        while not self._stop.wait(every):
            self._content["heartbeat"] = time.time()
            with contextlib.suppress(OSError):
                self._write()

    def release(self) -> None:
        """Remove the lock file and drop the OS lock (a rank that does not own it only
        stops its heartbeat)."""
        if self._fd < 0:
            return
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        with contextlib.suppress(OSError):
            if self.owned and _read(self._fd).get("token") == self._content["token"]:
                self.path.unlink()
        os.close(self._fd)  # drops the OS lock (flock: only this open file's)
        self._fd = -1

    def __enter__(self) -> WorkDirLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _open_locked(path: Path) -> tuple[int, bool | None]:
    """Open ``path`` and try its OS lock: ``(fd, True)``, ``(fd, False)`` where the
    filesystem has none, ``(fd, None)`` where another process holds it; a file
    replaced in between is opened again."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            locked: bool | None = True
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return fd, None
            if exc.errno not in _NO_OS_LOCKS:
                os.close(fd)
                raise
            locked = False
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd, locked
        os.close(fd)


def take_work_dir(work_dir: str | os.PathLike[str], run_id: str, *,
                  heartbeat_every: float | None = HEARTBEAT_EVERY,
                  stale_after: float = STALE_AFTER, settle: float = SETTLE) -> WorkDirLock:
    """Make this process the owner of ``work_dir`` for the run ``run_id``.

    Parameters
    ----------
    work_dir : str or PathLike
        Created if missing.
    run_id : str
        A lock held under it is this run's launcher's, whose heartbeat this process keeps.
    heartbeat_every : float or None, default HEARTBEAT_EVERY
        ``None``: no heartbeat thread (a launcher, which forks).
    stale_after : float, default STALE_AFTER
    settle : float, default SETTLE

    Returns
    -------
    WorkDirLock

    Raises
    ------
    WorkDirBusyError
        Another live run owns ``work_dir``; nothing was written.
    """
    work_dir = Path(work_dir)
    path = work_dir / LOCK_FILE
    if not path.exists():
        work_dir.mkdir(parents=True, exist_ok=True)
    fd, locked = _open_locked(path)
    previous = _read(fd)
    ours = previous.get("run") == run_id
    # Held by our launcher (its OS lock, or its live heartbeat where there are no OS locks):
    # keep its heartbeat. Under an OS lock we hold, an earlier attempt of this same run (a
    # requeued SLURM job, maybe on another node) is dead and taken over like any other.
    if heartbeat_every is not None and locked is not False and is_host_local(work_dir):
        heartbeat_every = None  # no other host can look (see the module docstring)
    if ours and (locked is None or (locked is False and _alive(
            previous, os_locked=False, stale_after=stale_after))):
        return WorkDirLock(path, fd, previous, False, heartbeat_every, owned=False)
    if locked is None or (not ours and _alive(previous, os_locked=bool(locked),
                                              stale_after=stale_after)):
        os.close(fd)  # never held: closing it cannot drop the owner's lock (flock)
        if locked is None and not previous:  # the owner locked it but has not written yet
            previous = {"host": "?", "pid": "?"}
        raise _busy(work_dir, previous)
    now = time.time()
    content = {"host": socket.gethostname(), "pid": os.getpid(), "run": run_id,
               "started": now, "heartbeat": now, "token": f"{os.getpid()}-{now!r}"}
    lock = WorkDirLock(path, fd, content, bool(locked), heartbeat_every)
    lock._write()
    if not locked:  # no OS lock: the last of two simultaneous writers owns it
        time.sleep(settle)
        if _read(fd).get("token") != content["token"]:
            winner = _read(fd)
            lock.owned = False
            lock.release()
            raise _busy(work_dir, winner)
    if previous:
        warnings.warn(f"took over the lock of work_dir {str(work_dir)!r} from a run that "
                      f"did not end ({_owner_text(previous)}); its last complete checkpoint "
                      f"is still there", stacklevel=2)
    return lock


def check_work_dir_owner(work_dir: str | os.PathLike[str], run_id: str) -> None:
    """Refuse to start a rank of ``run_id`` in a ``work_dir`` that another live run owns.

    Parameters
    ----------
    work_dir : str or PathLike
    run_id : str

    Raises
    ------
    WorkDirBusyError
    """
    path = Path(work_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        owner = _read(fd)
        if owner and owner.get("run") != run_id and _alive(owner, os_locked=False,
                                                           stale_after=STALE_AFTER):
            raise _busy(Path(work_dir), owner)
    finally:
        os.close(fd)
