"""``env_cfg.stall_timeout`` and ``env_cfg.shutdown_timeout``: how long a run may make no
progress, and how long its ranks get to stop.

The process group's timeout is derived from them so that the CLI's watchdog, which
names the rank at fault, reports before a collective times out, which names none.
"""

from __future__ import annotations

import os
from typing import Any

import attrs

from flexgraph.training.config._access import section
from flexgraph.training.errors import ConfigError

AUTO_FLOOR = 300.0
"""Seconds: the smallest bound an iteration gets by default."""
AUTO_FACTOR = 10
"""By default an iteration may take this many times the slowest one seen so far."""
LONG_PHASE_ALLOWANCE = 1800.0
"""Seconds a long phase may make no progress (torch's default process-group timeout on gloo)."""
COLLECTIVE_MARGIN = 120.0
"""Seconds a collective's timeout exceeds the longest limit: the watchdog reports first."""
DEFAULT_SHUTDOWN_TIMEOUT = 30.0
"""Seconds between SIGTERM and SIGKILL of a stopping run's ranks (torch's default)."""
PHASES = ("iteration", "first iteration", "setup", "evaluation", "save")
"""What a watched process can be doing; every phase but an iteration is long."""


@attrs.frozen
class WatchPolicy:
    """How long a run may make no progress, and how long its ranks get to stop.

    Parameters
    ----------
    stall_timeout : float or None
        Seconds an iteration may take; ``None``: from the slowest seen; ``0``: unwatched.
    shutdown_timeout : float
        Seconds between SIGTERM and SIGKILL of a stopping run's ranks.

    Examples
    --------
    >>> WatchPolicy(stall_timeout=20).limit("save", slowest=0.5)
    1800.0
    """

    stall_timeout: float | None = None
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT

    @property
    def enabled(self) -> bool:
        return self.stall_timeout != 0

    def iteration_bound(self, slowest: float = 0.0) -> float:
        if self.stall_timeout is not None:
            return float(self.stall_timeout)
        return max(AUTO_FLOOR, AUTO_FACTOR * slowest)

    def limit(self, phase: str, slowest: float = 0.0) -> float:
        bound = self.iteration_bound(slowest)
        return bound if phase == "iteration" else max(bound, LONG_PHASE_ALLOWANCE)


def _seconds(cfg: Any, key: str, default: Any) -> Any:
    value = section(section(cfg, "env_cfg", {}), key, default)
    if value is None or value is default:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ConfigError(f"env_cfg.{key} must be a number of seconds >= 0, got {value!r}"
                          + (" (0 turns the watchdog off)" if key == "stall_timeout" else ""))
    return float(value)


def watch_policy(cfg: Any, environ: Any = None) -> WatchPolicy:
    """Read ``env_cfg.stall_timeout`` and ``env_cfg.shutdown_timeout``.

    Parameters
    ----------
    cfg : Config or Mapping
    environ : Mapping, optional
        Where ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` is looked up (``os.environ``).

    Returns
    -------
    WatchPolicy
    """
    environ = os.environ if environ is None else environ
    torch_default = environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT")
    try:
        shutdown_default = float(torch_default) if torch_default else DEFAULT_SHUTDOWN_TIMEOUT
    except ValueError:
        shutdown_default = DEFAULT_SHUTDOWN_TIMEOUT
    return WatchPolicy(stall_timeout=_seconds(cfg, "stall_timeout", None),
                       shutdown_timeout=_seconds(cfg, "shutdown_timeout", shutdown_default))


def collective_timeout(policy: WatchPolicy) -> float:
    """The process group's timeout when ``dist_cfg`` gives none: beyond every watchdog limit.

    Parameters
    ----------
    policy : WatchPolicy

    Returns
    -------
    float
        Seconds.
    """
    if not policy.enabled:
        return LONG_PHASE_ALLOWANCE
    longest = max(policy.limit(phase) for phase in PHASES)
    return longest + COLLECTIVE_MARGIN
