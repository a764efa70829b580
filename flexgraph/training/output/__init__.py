"""What a run shows and leaves behind: log lines, progress, metrics, the work_dir record.

Also the run's context, handed to the steps that need it as an argument, and
what a launcher hands its ranks through their environment.
"""

from importlib import import_module
from typing import Any

from flexgraph.training.output._launch_env import (
    LAUNCHER_PID_VAR,
    PROGRESS_DIR_VAR,
    RUN_ESTIMATE_VAR,
    LaunchEnv,
)
from flexgraph.training.output._progress import Progress, open_progress, read_progress

_LAZY = {
    "TrainOutput": "_train_output",
    "open_run_record": "_workdir",
    "LOCK_FILE": "_lock",
    "is_host_local": "_lock",
    "check_work_dir_owner": "_lock",
    "take_work_dir": "_lock",
    "MEMORY_FILE": "_memory",
    "MeasuredPeaks": "_memory",
    "RunEstimate": "_memory",
    "memory_summary": "_memory",
    "summary_line": "_memory",
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
    "LAUNCHER_PID_VAR",
    "LOCK_FILE",
    "MEMORY_FILE",
    "PROGRESS_DIR_VAR",
    "RUN_ESTIMATE_VAR",
    "AutoChoice",
    "LaunchEnv",
    "LaunchFacts",
    "MeasuredPeaks",
    "Progress",
    "RunContext",
    "RunEstimate",
    "StepTimings",
    "TrainOutput",
    "check_work_dir_owner",
    "is_host_local",
    "memory_summary",
    "open_progress",
    "open_run_record",
    "read_progress",
    "summary_line",
    "take_work_dir",
    "write_run_page",
]
