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
from flexgraph.training.config._keys import warn_unused_keys
from flexgraph.training.config._settings import (
    CheckpointPolicy,
    LogProcessorPolicy,
    RunSettings,
    StopPolicy,
    TrainSchedule,
    check_paths,
    read_settings,
    resume_source,
)
from flexgraph.training.config._watch import WatchPolicy, collective_timeout, watch_policy
from flexgraph.training.config._writer import config_text, write_config

__all__ = [
    "CheckpointPolicy",
    "LogProcessorPolicy",
    "RunSettings",
    "StopPolicy",
    "TrainSchedule",
    "WatchPolicy",
    "build_from_cfg",
    "check_paths",
    "collective_timeout",
    "config_text",
    "is_pretrained",
    "names_pretrained",
    "read_settings",
    "resolve_type",
    "resume_source",
    "section",
    "type_name",
    "warn_unused_keys",
    "watch_policy",
    "write_config",
]
