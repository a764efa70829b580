"""The run's settings as the config gives them, and components built from it.

:func:`read_settings` reads the sections flexgraph acts on into one frozen
:class:`RunSettings` before any step runs, refusing a bad section with a
``ConfigError`` naming the key; :func:`build_from_cfg` builds components through
MMEngine's registries in the config's default scope.
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
