"""What a run leaves in its work_dir, and which of its log lines reach the console.

The layout is docs/guide/work_dir.rst's; only rank 0 writes. MMEngine's INFO
lines go to the log file only.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import mmengine
from mmengine.logging import MMLogger
from mmengine.logging.logger import MMFormatter

from flexgraph.training.config import RunSettings, write_config

FILE_ONLY = {"flexgraph_file_only": True}
"""``logger.info(msg, extra=FILE_ONLY)``: a line for the log file, not the console."""

_MMENGINE_DIR = os.path.dirname(os.path.abspath(mmengine.__file__)) + os.sep
_NUMBERS = itertools.count()  # MMLogger instance names are process-global


class _ConsoleFilter(logging.Filter):
    """Keeps file-only lines, and (when a log file has them) MMEngine's INFO, off the console."""

    def __init__(self, quiet_mmengine: bool) -> None:
        super().__init__()
        self.quiet_mmengine = quiet_mmengine

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "flexgraph_file_only", False):
            return False
        return not (self.quiet_mmengine and record.levelno < logging.WARNING
                    and record.pathname.startswith(_MMENGINE_DIR))


def _console_handler(logger: MMLogger) -> logging.Handler:
    return next(h for h in logger.handlers if type(h) is logging.StreamHandler)


def console_logger(timestamp: str, log_level: Any = "INFO", *, rank: int = 0,
                   quiet_mmengine: bool = False) -> MMLogger:
    """A new MMLogger (MMEngine's *current* one from now on) printing to stdout.

    ``log_level`` is rank 0's; other ranks print errors only.
    """
    logger = MMLogger.get_instance(f"flexgraph_{timestamp}_{next(_NUMBERS)}",
                                   logger_name="flexgraph", log_level=log_level)
    console = _console_handler(logger)
    # MMLogger reads the rank from the process group, which may not exist yet.
    console.setLevel(console.level if rank == 0 else logging.ERROR)
    console.addFilter(_ConsoleFilter(quiet_mmengine))
    return logger


class RunRecord:
    """One run's log file, config and plan in ``work_dir/<timestamp>/``."""

    def __init__(self, logger: MMLogger, timestamp: str, run_dir: Path,
                 file_handler: logging.Handler | None) -> None:
        self.logger = logger
        self.timestamp = timestamp
        self.run_dir = run_dir
        self._file_handler = file_handler
        self._writes = file_handler is not None  # rank 0 only

    def note(self, message: str) -> None:
        """A line for the log file only (the console already showed it)."""
        self.logger.info(message, extra=FILE_ONLY)

    def write_json(self, name: str, data: Any) -> None:
        """``run_dir/name`` as indented JSON, atomically; only rank 0 writes."""
        if self._writes:
            text = json.dumps(data, indent=2) + "\n"
            _atomic_text(self.run_dir / name, lambda path: Path(path).write_text(text))

    def failed(self, exc: BaseException) -> None:
        """Put the traceback in the log file; the console gets the CLI's one-line error."""
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        self.logger.error(f"the run failed:\n{text}", extra=FILE_ONLY)

    def close(self) -> None:
        """Close the log file; later runs in this process open their own record."""
        if self._file_handler is not None:
            self.logger.removeHandler(self._file_handler)
            self._file_handler.close()
            self._file_handler = None


class _LogFile(logging.FileHandler):
    """The run's log file; a write the device refuses is dropped, silently (on a full
    device the run fails with its own one-line error, which tracebacks would bury)."""

    def handleError(self, record: logging.LogRecord) -> None:
        if not isinstance(sys.exc_info()[1], OSError):
            super().handleError(record)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            super().close()


def _new_run_dir(work_dir: Path, timestamp: str) -> tuple[str, Path]:
    for n in itertools.count():
        name = timestamp if n == 0 else f"{timestamp}_{n}"
        try:
            (work_dir / name).mkdir(parents=True)
        except FileExistsError:
            continue
        return name, work_dir / name
    raise AssertionError("unreachable")


def _atomic_text(path: Path, write: Any) -> None:
    """``write(temp_path)``, then rename it to ``path``: never half a file under ``path``."""
    temp = path.with_name(f".tmp-{path.name}")
    try:
        write(temp)
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)


def open_run_record(cfg: Any, settings: RunSettings, plan_json: str, *, rank: int = 0,
                    strategy: str | None = None) -> RunRecord:
    """Start the run's record: folder, config, plan and log file on rank 0.

    Parameters
    ----------
    cfg : Config
        After ``--cfg-options`` and the command line's flags.
    settings : RunSettings
    plan_json : str
        The plan about to run, as ``flexgraph plan --format json`` prints it.
    rank : int
    strategy : str, optional
        Written into ``config.py`` so that the config plans the same way again.

    Returns
    -------
    RunRecord
    """
    log_level = settings.log_level
    timestamp = time.strftime("%Y%m%d_%H%M%S", time.localtime())
    work_dir = Path(settings.work_dir)
    file_handler = None
    if rank == 0:
        timestamp, run_dir = _new_run_dir(work_dir, timestamp)
        config = cfg.copy()
        if strategy:
            config.merge_from_dict({"strategy": strategy})
        _atomic_text(run_dir / "config.py", lambda path: write_config(config, path))
        _atomic_text(run_dir / "plan.json", lambda p: Path(p).write_text(plan_json + "\n"))
        file_handler = _LogFile(run_dir / f"{timestamp}.log", encoding="utf-8")
        file_handler.setFormatter(MMFormatter(color=False, datefmt="%Y/%m/%d %H:%M:%S"))
        file_handler.setLevel(log_level)
    else:
        run_dir = work_dir / timestamp
    logger = console_logger(timestamp, log_level, rank=rank, quiet_mmengine=True)
    if file_handler is not None:
        logger.addHandler(file_handler)
    return RunRecord(logger, timestamp, run_dir, file_handler)
