"""What a run shows and leaves behind: log lines, progress, metrics, the work_dir record.

Also the run's context, handed to the steps that need it as an argument, and
what a launcher hands its ranks through their environment.
"""

from importlib import import_module
from typing import Any

from flexgraph.training.output._bar import TerminalBar, format_duration
from flexgraph.training.output._launch_env import (
    AUTO_CHOICE_VAR,
    AUTO_REASON_VAR,
    LAUNCH_VARS,
    LAUNCHER_PID_VAR,
    PLAN_DIGEST_VAR,
    PROGRESS_DIR_VAR,
    RUN_ESTIMATE_VAR,
    RUN_ID_VAR,
    LaunchEnv,
)
from flexgraph.training.output._progress import Progress, open_progress, read_progress

_LAZY = {
    "METRICS_FILE": "_train_output",
    "TrainOutput": "_train_output",
    "FILE_ONLY": "_workdir",
    "RunRecord": "_workdir",
    "console_logger": "_workdir",
    "open_run_record": "_workdir",
    "LOCK_FILE": "_lock",
    "HOST_LOCAL_FILESYSTEMS": "_lock",
    "WorkDirLock": "_lock",
    "is_host_local": "_lock",
    "check_work_dir_owner": "_lock",
    "take_work_dir": "_lock",
    "MEMORY_FILE": "_memory",
    "MeasuredPeaks": "_memory",
    "RunEstimate": "_memory",
    "memory_summary": "_memory",
    "summary_line": "_memory",
    "PAGE_FILE": "_run_page",
    "TIMINGS_FILE": "_run_page",
    "StepTimings": "_run_page",
    "write_run_page": "_run_page",
    "AutoChoice": "_run_context",
    "LaunchFacts": "_run_context",
    "RunContext": "_run_context",
}


def __getattr__(name: str) -> Any:
    """Import the torch- and MMEngine-backed names on first use.

    The launcher and ``flexgraph plan`` read progress and draw the bar; they
    must not pay for torch.
    """
    if name not in _LAZY:
        raise AttributeError(f"module 'flexgraph.training.output' has no attribute {name!r}")
    return getattr(import_module(f"flexgraph.training.output.{_LAZY[name]}"), name)


__all__ = [
    "AUTO_CHOICE_VAR",
    "AUTO_REASON_VAR",
    "FILE_ONLY",
    "HOST_LOCAL_FILESYSTEMS",
    "LAUNCHER_PID_VAR",
    "LAUNCH_VARS",
    "LOCK_FILE",
    "MEMORY_FILE",
    "METRICS_FILE",
    "PAGE_FILE",
    "PLAN_DIGEST_VAR",
    "PROGRESS_DIR_VAR",
    "RUN_ESTIMATE_VAR",
    "RUN_ID_VAR",
    "AutoChoice",
    "LaunchEnv",
    "LaunchFacts",
    "MeasuredPeaks",
    "Progress",
    "RunContext",
    "RunEstimate",
    "RunRecord",
    "StepTimings",
    "TIMINGS_FILE",
    "TerminalBar",
    "TrainOutput",
    "WorkDirLock",
    "check_work_dir_owner",
    "console_logger",
    "format_duration",
    "is_host_local",
    "memory_summary",
    "open_progress",
    "open_run_record",
    "read_progress",
    "summary_line",
    "take_work_dir",
    "write_run_page",
]
