"""The run's settings as the config gives them, and components built from it.

:func:`read_settings`, which reads the config's sections (schedule,
checkpoint, logger and stop policies, the work_dir, what to load and resume)
into one frozen :class:`RunSettings` before any step runs, the readers of
each section it uses, the table of keys flexgraph acts on and the warning
for the others, :func:`check_sections`, which refuses a malformed component
section (hooks, optimizer, schedulers, dataloaders) before anything is built,
:func:`check_paths` for the work_dir and the checkpoints named, the writer
of the work_dir's ``config.py``, and :func:`build_from_cfg` /
:func:`resolve_type`, which build components through MMEngine's registries in
the config's default scope.
"""

from flexgraph.training.config._access import section, type_name
from flexgraph.training.config._build import build_from_cfg, registered_names, resolve_type
from flexgraph.training.config._checks import check_sections
from flexgraph.training.config._keys import ACTED_ON, NOT_ACTED_ON, unused_keys, warn_unused_keys
from flexgraph.training.config._settings import (
    CheckpointPolicy,
    LoggerPolicy,
    LogProcessorPolicy,
    RunSettings,
    StopPolicy,
    TrainLength,
    TrainSchedule,
    check_paths,
    checkpoint_policy,
    experiment_name_of,
    log_processor_policy,
    logger_policy,
    read_settings,
    restart_count,
    resume_source,
    stop_policy,
    train_length,
    work_dir_of,
)
from flexgraph.training.config._writer import WIDTH, config_text, write_config

__all__ = [
    "ACTED_ON",
    "CheckpointPolicy",
    "LogProcessorPolicy",
    "LoggerPolicy",
    "NOT_ACTED_ON",
    "RunSettings",
    "StopPolicy",
    "TrainLength",
    "TrainSchedule",
    "WIDTH",
    "build_from_cfg",
    "check_paths",
    "check_sections",
    "checkpoint_policy",
    "config_text",
    "experiment_name_of",
    "log_processor_policy",
    "logger_policy",
    "read_settings",
    "registered_names",
    "resolve_type",
    "restart_count",
    "resume_source",
    "section",
    "stop_policy",
    "train_length",
    "type_name",
    "unused_keys",
    "warn_unused_keys",
    "work_dir_of",
    "write_config",
]
