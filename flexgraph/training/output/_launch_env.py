"""What a launcher hands the processes it starts, through their environment.

torch's elastic agent passes ranks nothing but their environment, so these
facts travel as ``FLEXGRAPH_*`` variables. Standard library and attrs only:
the launcher imports it without torch.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

LAUNCHER_PID_VAR = "FLEXGRAPH_LAUNCHER"
PLAN_DIGEST_VAR = "FLEXGRAPH_PLAN_DIGEST"
RUN_ID_VAR = "FLEXGRAPH_RUN_ID"
PROGRESS_DIR_VAR = "FLEXGRAPH_PROGRESS_DIR"
AUTO_CHOICE_VAR = "FLEXGRAPH_AUTO_CHOICE"
AUTO_REASON_VAR = "FLEXGRAPH_AUTO_REASON"
RUN_ESTIMATE_VAR = "FLEXGRAPH_RUN_ESTIMATE"

_FIELDS = {
    "launcher_pid": LAUNCHER_PID_VAR,
    "plan_digest": PLAN_DIGEST_VAR,
    "run_id": RUN_ID_VAR,
    "progress_dir": PROGRESS_DIR_VAR,
    "auto_choice": AUTO_CHOICE_VAR,
    "auto_reason": AUTO_REASON_VAR,
    "run_estimate": RUN_ESTIMATE_VAR,
}


@attrs.frozen
class LaunchEnv:
    """The launcher's facts for its ranks, as text, the way the environment carries them.

    Every field is ``None`` when the variable is unset or empty (a process
    that no flexgraph launcher started has none of them).

    Parameters
    ----------
    launcher_pid : str, optional
        :data:`LAUNCHER_PID_VAR`.
    plan_digest : str, optional
        :data:`PLAN_DIGEST_VAR`.
    run_id : str, optional
        :data:`RUN_ID_VAR`.
    progress_dir : str, optional
        :data:`PROGRESS_DIR_VAR`.
    auto_choice, auto_reason : str, optional
        :data:`AUTO_CHOICE_VAR`, :data:`AUTO_REASON_VAR`.
    run_estimate : str, optional
        :data:`RUN_ESTIMATE_VAR` (JSON).

    Examples
    --------
    >>> handed = LaunchEnv(plan_digest="0123abcd", run_id="host-42")
    >>> handed.variables()
    {'FLEXGRAPH_PLAN_DIGEST': '0123abcd', 'FLEXGRAPH_RUN_ID': 'host-42'}
    >>> LaunchEnv.read(handed.variables()) == handed
    True
    """

    launcher_pid: str | None = None
    plan_digest: str | None = None
    run_id: str | None = None
    progress_dir: str | None = None
    auto_choice: str | None = None
    auto_reason: str | None = None
    run_estimate: str | None = None

    @classmethod
    def read(cls, environ: Mapping[str, str]) -> LaunchEnv:
        """What ``environ`` (a process's environment) holds of the launcher's facts."""
        return cls(**{field: environ.get(name) or None for field, name in _FIELDS.items()})

    def variables(self) -> dict[str, str]:
        """The variables to set in a launched process's environment (the fields that are set)."""
        values = attrs.asdict(self)
        return {name: values[field] for field, name in _FIELDS.items() if values[field]}
