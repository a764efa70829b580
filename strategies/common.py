"""What more than one strategy uses: shared rewrites, option checks, memory-model checks.

* :func:`join_process_group`: the ``setup_env`` of a strategy that runs one
  process per device (DDP, FSDP): it joins the process group.
* :func:`format_rewrites`: ``checkpoint_format='portable'`` for a strategy
  whose own format is MMEngine's one ``.pth`` file (single device, DDP).
* :func:`refuse`: the error for an option a strategy cannot take, naming the
  strategy and the option (FSDP, DeepSpeed).
* :func:`refuse_stages`: the error for a ``--compare`` candidate with a stage,
  for a strategy that has none (the memory models of single, DDP, FSDP).

Nothing here imports torch: the rewrites are built when a plan is made.
"""

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
    device : str or None
        The strategy's ``device`` option (default: CUDA when available, else CPU).
    dist_cfg : mapping or None
        MMEngine's ``dist_cfg``: ``backend``, ``timeout`` in seconds.

    Returns
    -------
    Replace
    """
    return Replace("setup_env", Step(
        "setup_env", "flexgraph.training.runtime:setup_process_group",
        requires="cfg", provides="env", params={"device": device, **dict(dist_cfg or {})},
        doc="join the process group, pick this rank's device"))


def format_rewrites(checkpoint_format: str) -> list[Configure]:
    """``checkpoint_format='portable'`` for a strategy whose own format is one ``.pth`` file.

    That file stays the default: MMEngine's own tools read it, and every
    flexgraph strategy resumes it (its optimizer state renumbered by name).

    Parameters
    ----------
    checkpoint_format : str
        ``'native'`` (MMEngine's ``.pth``) or ``'portable'``.

    Returns
    -------
    list of Configure
        Nothing for ``'native'``; otherwise the checkpointer configured.
    """
    if checkpoint_format == "native":
        return []
    return [Configure("build_checkpointer", {"checkpoint_format": checkpoint_format})]


def refuse(strategy: str, key: str, why: str) -> StrategyOptionError:
    """The error for option ``key`` of ``strategy``: ``strategy 'fsdp': KEY WHY``.

    Parameters
    ----------
    strategy : str
        The strategy's registry name.
    key : str
        The option as the config writes it (``model_wrapper.type``), with its
        value where that is the culprit.
    why : str
        Why it is refused, and what to write instead.

    Returns
    -------
    StrategyOptionError
        For the caller to raise.
    """
    return StrategyOptionError(f"strategy {strategy!r}: {key} {why}")


def refuse_stages(strategy: str, stage: str | None) -> None:
    """Refuse a ``--compare`` candidate's stage for ``strategy``, which has none.

    Parameters
    ----------
    strategy : str
        The strategy's registry name.
    stage : str or None
        The candidate's ``STAGE`` (``NAME[:STAGE][:PRECISION]``); ``None`` passes.

    Raises
    ------
    CandidateError
        ``stage`` is given.
    """
    if stage is None:
        return
    from flexgraph.training.estimate import CandidateError  # imports torch: estimates only

    raise CandidateError(f"candidate {strategy}:{stage}: {strategy} has no stages; write "
                         f"{strategy}[:fp16|:bf16]")
