"""The run's context: what a run knows beyond its config, in one frozen value passed down.

``flexgraph run`` makes one :class:`RunContext` after planning; steps take it
as an argument and nothing writes it back. It lives in output because it holds
the run's record and log.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from flexgraph.training.output._launch_env import LaunchEnv
from flexgraph.training.output._memory import RunEstimate
from flexgraph.training.output._progress import Progress

if TYPE_CHECKING:
    from flexgraph.training.output._workdir import RunRecord


@attrs.frozen
class AutoChoice:
    """What ``--strategy auto`` chose, and why.

    Parameters
    ----------
    label : str
        The candidate, as ``--compare`` names it (``"ddp:bf16"``).
    strategy : mapping
        ``{"type": name, **options}``, as the work_dir's ``config.py`` records it.
    reason : str, optional
        Why it was chosen, for the log.
    """

    label: str
    strategy: Mapping[str, Any]
    reason: str | None = None


@attrs.frozen
class LaunchFacts:
    """How this process was started, and what its launch decided before it planned.

    Parameters
    ----------
    launched_by : str, optional
        What started the ranks, for the summary line; ``None``: this process runs alone.
    launches_ranks : bool
        This process starts ranks and runs no step itself.
    launched : bool
        This process is a rank a launcher started.
    node_rank : int
        This node's rank among several nodes' launchers.
    master_addr, master_port : optional
        Where several nodes' launchers meet; ``None``: torch's defaults.
    resume : str, optional
        ``--resume``, or ``"auto"`` in a requeued SLURM job.
    auto : AutoChoice, optional
        ``--strategy auto``'s choice.
    estimate : RunEstimate, optional
        What the run's memory is measured against; ``None``: not measured.
    progress : Progress, optional
        The progress record this rank keeps for its launcher.
    handed_down : LaunchEnv
        What the launcher handed this rank through its environment.
    """

    launched_by: str | None = None
    launches_ranks: bool = False
    launched: bool = False
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    resume: str | None = None
    auto: AutoChoice | None = None
    estimate: RunEstimate | None = None
    progress: Progress | None = None
    handed_down: LaunchEnv = LaunchEnv()


def _now() -> str:
    return time.strftime("%Y%m%d_%H%M%S", time.localtime())


def _timestamp(context: RunContext) -> str:
    return context.record.timestamp if context.record is not None else _now()


def _logger(context: RunContext) -> Any:
    if context.record is not None:
        return context.record.logger
    from flexgraph.training.output._workdir import console_logger

    return console_logger(context.timestamp)


def _log_dir(context: RunContext) -> str | None:
    return str(context.record.run_dir) if context.record is not None else None


def _message_hub(context: RunContext) -> Any:
    from mmengine.logging import MessageHub

    # MMEngine's hub names are process-global: a number keeps each run's its own
    return MessageHub.get_instance(f"flexgraph_{context.timestamp}_{next(_HUB_NUMBERS)}")


_HUB_NUMBERS = itertools.count()


@attrs.frozen
class RunContext:
    """What a run knows beyond its config: the standard graph's ``run_context`` input.

    The log's parts default to the record's, or without one to a console
    logger named by the current time.

    Parameters
    ----------
    rank, world_size : int
        This process's global rank, and how many processes train.
    plan : mapping, optional
        The plan being run, as ``flexgraph plan --format json`` prints it.
    record : RunRecord, optional
        The work_dir's record ``flexgraph run`` opened; ``None``: no record.
    launch : LaunchFacts
        How the process was started.
    timestamp : str
        The run's ``%Y%m%d_%H%M%S`` name, as MMEngine's.
    logger : mmengine.logging.MMLogger
    log_dir : str, optional
        The run's folder (``runner.log_dir``); ``None``: the work_dir.
    message_hub : mmengine.logging.MessageHub

    Examples
    --------
    >>> context = RunContext(plan={"strategy": "ddp"}, world_size=2)
    >>> context.plan["strategy"], context.record, context.log_dir
    ('ddp', None, None)
    >>> context.rank = 1
    Traceback (most recent call last):
    ...
    attr.exceptions.FrozenInstanceError: can't set attribute
    """

    rank: int = 0
    world_size: int = 1
    plan: Mapping[str, Any] | None = None
    record: RunRecord | None = None
    launch: LaunchFacts = LaunchFacts()
    timestamp: str = attrs.field(default=attrs.Factory(_timestamp, takes_self=True))
    logger: Any = attrs.field(default=attrs.Factory(_logger, takes_self=True), eq=False,
                              repr=False)
    log_dir: str | None = attrs.field(default=attrs.Factory(_log_dir, takes_self=True))
    message_hub: Any = attrs.field(default=attrs.Factory(_message_hub, takes_self=True),
                                   eq=False, repr=False)

    @classmethod
    def of_this_process(cls, *, log_level: str | int = "INFO", log_dir: str | None = None
                        ) -> RunContext:
        """The context of a run that no command set up: this process as its launcher placed
        it (``RANK`` / ``WORLD_SIZE``), no record, a console logger."""
        from flexgraph.training.output._workdir import console_logger
        from flexgraph.training.runtime import launch_rank, launch_world_size

        timestamp = _now()
        return cls(rank=launch_rank(), world_size=launch_world_size(),
                   timestamp=timestamp, logger=console_logger(timestamp, log_level),
                   log_dir=log_dir)
