"""Each rank in a memory cgroup of its own, limited to what it holds after its imports plus an
allowance: the setup-memory benchmark's ``--limit`` mode.

The benchmark names the cgroups (:func:`prefix`: beside its own, in its own
memory cgroup); a rank, once its imports are done, calls :func:`enter_from_env`
(``_setup_workload`` does, as it is imported): it makes ``<prefix>-rank<R>``
(v1: ``memory.limit_in_bytes``, swap included where the kernel counts it; v2:
``memory.max``, no swap), limits it to the allowance and moves itself in. What
the rank held before stays charged where it was (the kernel does not move
charges), so the rank may hold its memory after imports plus the allowance.
Past that the kernel's OOM killer ends it; the benchmark reads that from the
cgroup (:func:`oom_killed`) and removes it (:func:`remove`).
"""

from __future__ import annotations

import os
from pathlib import Path

NAME_ENV = "SETUP_MEMORY_CGROUP"
ALLOWANCE_ENV = "SETUP_MEMORY_ALLOWANCE"
_FS = Path("/sys/fs/cgroup")


def _home() -> tuple[Path, int] | None:
    """This process's memory cgroup directory and the cgroup version, or ``None``."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(",") and (_FS / "memory").is_dir():
            return _FS / "memory" / path.lstrip("/"), 1
        if controllers == "" and "memory" in _read(_FS / "cgroup.controllers").split():
            return _FS / path.lstrip("/"), 2
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def why_not() -> str | None:
    """Why memory cgroups cannot be made here, or ``None`` where they can."""
    home = _home()
    if home is None:
        return "no memory cgroup controller is mounted (v1 memory/ or v2 cgroup.controllers)"
    probe = home[0] / f"setup-memory-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as exc:
        return f"cannot make a cgroup under {home[0]}: {exc.strerror}"
    return None


def prefix(name: str) -> str:
    """Where the ranks' cgroups go: ``name`` beside this process's own memory cgroup."""
    home = _home()
    if home is None:
        raise RuntimeError(why_not())
    return str(home[0] / name)


def _group(prefix_: str, rank: int) -> Path:
    return Path(f"{prefix_}-rank{rank}")


def enter(prefix_: str, rank: int, allowance: int) -> None:
    """Move this process into its own cgroup, limited to ``allowance`` bytes from now."""
    group = _group(prefix_, rank)
    group.mkdir(exist_ok=True)
    v1 = (group / "memory.limit_in_bytes").exists()
    (group / ("memory.limit_in_bytes" if v1 else "memory.max")).write_text(str(allowance))
    swap = group / ("memory.memsw.limit_in_bytes" if v1 else "memory.swap.max")
    if swap.exists():  # no swapping past the limit: the rank is killed instead
        swap.write_text(str(allowance) if v1 else "0")
    (group / "cgroup.procs").write_text(str(os.getpid()))


def enter_from_env() -> None:
    """:func:`enter` in a rank (a launcher's process reads the config too, and stays out)
    where the benchmark asked for it (its environment variables)."""
    prefix_ = os.environ.get(NAME_ENV)
    if prefix_ and "LOCAL_RANK" in os.environ:
        enter(prefix_, int(os.environ["RANK"]), int(os.environ[ALLOWANCE_ENV]))


def oom_killed(prefix_: str, rank: int) -> bool:
    """Whether the kernel killed a process of the rank's cgroup for its limit."""
    group = _group(prefix_, rank)
    for line in (_read(group / "memory.oom_control") + _read(group / "memory.events")).splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and int(value) > 0:
            return True
    return False


def remove(prefix_: str, rank: int) -> None:
    """The rank's cgroup removed, once its processes are gone."""
    group = _group(prefix_, rank)
    if group.is_dir():
        group.rmdir()
