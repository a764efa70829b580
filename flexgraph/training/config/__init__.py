"""The run's settings as the config gives them, and components built from it.

Readers of the config's sections (schedule, checkpoint, logger, stop
policies, the work_dir), the table of keys flexgraph acts on and the warning
for the others, the writer of the work_dir's ``config.py``, and
:func:`build_from_cfg` / :func:`resolve_type`, which build components through
MMEngine's registries in the config's default scope.
"""

from flexgraph.training.config._build import build_from_cfg, registered_names, resolve_type
from flexgraph.training.config._keys import ACTED_ON, NOT_ACTED_ON, unused_keys, warn_unused_keys
from flexgraph.training.config._settings import (
    CheckpointPolicy,
    LoggerPolicy,
    StopPolicy,
    TrainSchedule,
    checkpoint_policy,
    log_interval,
    logger_policy,
    restart_count,
    resume_source,
    section,
    stop_policy,
    train_schedule,
    type_name,
    work_dir_of,
)
from flexgraph.training.config._writer import WIDTH, config_text, write_config

__all__ = [
    "ACTED_ON",
    "CheckpointPolicy",
    "LoggerPolicy",
    "NOT_ACTED_ON",
    "StopPolicy",
    "TrainSchedule",
    "WIDTH",
    "build_from_cfg",
    "checkpoint_policy",
    "config_text",
    "log_interval",
    "logger_policy",
    "registered_names",
    "resolve_type",
    "restart_count",
    "resume_source",
    "section",
    "stop_policy",
    "train_schedule",
    "type_name",
    "unused_keys",
    "warn_unused_keys",
    "work_dir_of",
    "write_config",
]
