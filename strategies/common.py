"""What more than one strategy uses: shared rewrites, option and stage refusals."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flexgraph.core.rewrite import Configure, Replace
from flexgraph.core.step import Step
from flexgraph.core.strategy import StrategyOptionError

__all__ = ["format_rewrites", "join_process_group", "refuse", "refuse_stages"]


def join_process_group(device: str | None, dist_cfg: Mapping[str, Any] | None) -> Replace:
    """``setup_env`` replaced by one that joins the process group and picks this rank's device.

    Parameters
    ----------
    device, dist_cfg : optional
        This rank's device; MMEngine's ``dist_cfg`` (``backend``, ``timeout`` in seconds).

    Returns
    -------
    Replace
    """
    return Replace("setup_env", Step(
        "setup_env", "flexgraph.training.runtime:setup_process_group",
        requires="cfg", provides="env", params={"device": device, **dict(dist_cfg or {})},
        doc="join the process group, pick this rank's device"),
        why="every rank joins the process group, and takes its own device, before anything "
            "is built")


def format_rewrites(checkpoint_format: str) -> list[Configure]:
    """``checkpoint_format='portable'`` for a strategy whose own format is one ``.pth`` file.

    Parameters
    ----------
    checkpoint_format : {'native', 'portable'}

    Returns
    -------
    list of Configure
    """
    if checkpoint_format == "native":
        return []
    return [Configure("build_checkpointer", {"checkpoint_format": checkpoint_format},
                      why="portable checkpoints: by parameter name, resumable under every "
                          "strategy")]


def refuse(strategy: str, key: str, why: str) -> StrategyOptionError:
    """The error, for the caller to raise, refusing option ``key``: ``strategy 'fsdp': KEY WHY``.

    Parameters
    ----------
    strategy, key, why : str

    Returns
    -------
    StrategyOptionError
    """
    return StrategyOptionError(f"strategy {strategy!r}: {key} {why}")


def refuse_stages(strategy: str, stage: str | None) -> None:
    """Raise ``CandidateError`` for a ``--compare`` candidate's stage: ``strategy`` has none.

    Parameters
    ----------
    strategy, stage : str
    """
    if stage is None:
        return
    from flexgraph.training.estimate import CandidateError  # imports torch: estimates only

    raise CandidateError(f"candidate {strategy}:{stage}: {strategy} has no stages; write "
                         f"{strategy}[:fp16|:bf16]")
