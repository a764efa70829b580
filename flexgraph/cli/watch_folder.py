"""Where a run's processes tell each other how far they got, and what stopped the run.

A stuck rank cannot join a collective, so the watchdogs share a folder::

    work_dir/.watchdog/<run key>/attempt<K>/    K: the launcher's restart count
      beats/rank<R>.json  stacks/rank<R>.txt  events/{claim,report,failed-rank<R>}

Only the standard library is imported: the launcher reads the folder too.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

WATCH_FOLDER = ".watchdog"
"""The work_dir's folder of watch folders, one per run."""
CLAIM, REPORT, FAILED = "claim", "report", "failed-rank"


def run_key(run_id: str, environ: Mapping[str, str]) -> str:
    """The name of a run's watch folder: its run id, and a requeued SLURM job's restart count."""
    restarts = environ.get("SLURM_RESTART_COUNT")
    return re.sub(r"[^\w.-]", "_", run_id + (f".requeue{restarts}" if restarts else ""))


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_bytes() or b"null")
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` whole or not at all (a temporary file, then a rename)."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temp.write_text(json.dumps(data))
        os.replace(temp, path)
    except OSError:  # a full device: leave no half-written record behind
        temp.unlink(missing_ok=True)
        raise


class WatchFolder:
    """One attempt's watch folder, ``work_dir/.watchdog/<run key>/attempt<K>``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    @classmethod
    def of_run(cls, work_dir: str | os.PathLike[str], run_id: str, attempt: int = 0,
               environ: Mapping[str, str] | None = None) -> WatchFolder:
        """The folder of attempt ``attempt`` (the launcher's restart count) of run ``run_id``."""
        key = run_key(run_id, os.environ if environ is None else environ)
        return cls(Path(work_dir) / WATCH_FOLDER / key / f"attempt{attempt}")

    def make(self) -> WatchFolder:
        """Create the folder and its parts (every rank does; they may race)."""
        for part in ("beats", "stacks", "events"):
            (self.path / part).mkdir(parents=True, exist_ok=True)
        return self

    def beat_path(self, rank: int) -> Path:
        return self.path / "beats" / f"rank{rank}.json"

    def stacks_path(self, rank: int) -> Path:
        return self.path / "stacks" / f"rank{rank}.txt"

    @property
    def stacks(self) -> Path:
        return self.path / "stacks"

    def read_beats(self) -> dict[int, dict[str, Any]]:
        beats = {}
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.path / "beats"):
                if entry.name.startswith("rank") and entry.name.endswith(".json"):
                    beat = _read_json(Path(entry.path))
                    if beat is not None:
                        beats[int(beat["rank"])] = beat
        return beats

    def events(self) -> list[str]:
        try:
            return [name for name in os.listdir(self.path / "events")
                    if not name.startswith(".")]
        except OSError:
            return []

    def claim(self, rank: int) -> bool:
        """Become the rank that reports the stall: True for the first to ask only."""
        try:
            fd = os.open(self.path / "events" / CLAIM, os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                         0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            json.dump({"rank": rank, "time": time.time()}, f)
        return True

    def read_claim(self) -> dict[str, Any] | None:
        return _read_json(self.path / "events" / CLAIM)

    def write_report(self, report: dict[str, Any]) -> None:
        _write_json(self.path / "events" / REPORT, report)

    def read_report(self) -> dict[str, Any] | None:
        return _read_json(self.path / "events" / REPORT)

    def write_failure(self, rank: int, failure: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):
            _write_json(self.path / "events" / f"{FAILED}{rank}", failure)

    def read_failures(self, names: list[str] | None = None) -> dict[int, dict[str, Any]]:
        """The failures ranks recorded, by rank (``names``: :meth:`events`, if read)."""
        failures = {}
        for name in self.events() if names is None else names:
            if name.startswith(FAILED):
                failure = _read_json(self.path / "events" / name)
                if failure is not None:
                    failures[int(name[len(FAILED):])] = failure
        return failures

    def copy_stacks(self, destination: Path) -> Path:
        """Copy every rank's stacks into ``destination``; where they are after."""
        try:
            destination.mkdir(parents=True, exist_ok=True)
            for entry in os.scandir(self.stacks):
                if entry.is_file() and os.path.getsize(entry.path):
                    shutil.copyfile(entry.path, destination / entry.name)
        except OSError:
            return self.stacks
        return destination


def remove_other_runs(work_dir: str | os.PathLike[str], run_id: str | None) -> None:
    """Remove the watch folders of every run but ``run_id`` (``None``: of every run).

    A rank 0 keeps its own run's, which its peers may have started to write.
    """
    root = Path(work_dir) / WATCH_FOLDER
    keep = None if run_id is None else run_key(run_id, os.environ)
    with contextlib.suppress(OSError):
        for entry in os.scandir(root):
            if entry.name != keep:
                shutil.rmtree(entry.path, ignore_errors=True)


def remove_run(work_dir: str | os.PathLike[str], run_id: str) -> None:
    """Remove the watch folder of run ``run_id`` (it ended well), and the parent when empty."""
    root = Path(work_dir) / WATCH_FOLDER
    shutil.rmtree(root / run_key(run_id, os.environ), ignore_errors=True)
    with contextlib.suppress(OSError):
        root.rmdir()
