"""The run's settings as the config gives them, and components built from it.

:func:`read_settings` reads the sections flexgraph acts on into one frozen
:class:`RunSettings` before any step runs; :func:`check_sections` refuses a
malformed component section before anything is built; :func:`build_from_cfg`
builds components through MMEngine's registries in the config's default scope.
Every reader here refuses a bad section with a ``ConfigError`` naming the key.
"""

from flexgraph.training.config._access import (
    is_pretrained,
    names_pretrained,
    section,
    type_name,
)
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
from flexgraph.training.config._watch import (
    LONG_PHASE_ALLOWANCE,
    WatchPolicy,
    collective_timeout,
    watch_policy,
)
from flexgraph.training.config._writer import WIDTH, config_text, write_config

__all__ = [
    "ACTED_ON",
    "CheckpointPolicy",
    "LONG_PHASE_ALLOWANCE",
    "LogProcessorPolicy",
    "LoggerPolicy",
    "NOT_ACTED_ON",
    "RunSettings",
    "StopPolicy",
    "TrainLength",
    "TrainSchedule",
    "WatchPolicy",
    "WIDTH",
    "build_from_cfg",
    "check_paths",
    "check_sections",
    "collective_timeout",
    "checkpoint_policy",
    "config_text",
    "experiment_name_of",
    "is_pretrained",
    "log_processor_policy",
    "logger_policy",
    "names_pretrained",
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
    "watch_policy",
    "work_dir_of",
    "write_config",
]
