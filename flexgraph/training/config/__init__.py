"""The run's settings as the config gives them (:func:`read_settings`, before any step
runs), and components built from it through MMEngine's registries (:func:`build_from_cfg`).
"""

from flexgraph.training.config._access import (
    is_pretrained,
    names_pretrained,
    section,
    type_name,
)
from flexgraph.training.config._build import build_from_cfg, resolve_type
from flexgraph.training.config._keys import unused_keys, warn_unused_keys
from flexgraph.training.config._settings import (
    CheckpointPolicy,
    LogProcessorPolicy,
    RunSettings,
    StopPolicy,
    TrainSchedule,
    check_paths,
    checkpoint_policy,
    read_settings,
    resume_source,
    stop_policy,
)
from flexgraph.training.config._watch import (
    LONG_PHASE_ALLOWANCE,
    WatchPolicy,
    collective_timeout,
    watch_policy,
)
from flexgraph.training.config._writer import WIDTH, config_text, write_config

__all__ = [
    "CheckpointPolicy",
    "LONG_PHASE_ALLOWANCE",
    "LogProcessorPolicy",
    "RunSettings",
    "StopPolicy",
    "TrainSchedule",
    "WatchPolicy",
    "WIDTH",
    "build_from_cfg",
    "check_paths",
    "collective_timeout",
    "checkpoint_policy",
    "config_text",
    "is_pretrained",
    "names_pretrained",
    "read_settings",
    "resolve_type",
    "resume_source",
    "section",
    "stop_policy",
    "type_name",
    "unused_keys",
    "warn_unused_keys",
    "watch_policy",
    "write_config",
]
