"""The run's context: what a run knows beyond its config, in one frozen value passed down.

``flexgraph run`` learns things about its run that no config holds: the plan
it is about to run, the record it opened in the work_dir, this process's rank
and the world size, and how the process was launched. It also makes the
run's log: its logger, its timestamp, the folder of its files and its
MMEngine message hub. It puts them in one :class:`RunContext`, made once,
after planning and once the work_dir's record is open, and hands it to the
plan as the standard graph's ``run_context`` input, the way the settings are
handed in; the steps that need any of it take it as an argument. Nothing
writes it back anywhere.

Without the command (the Python API, a test), :func:`standard_inputs
<flexgraph.training.graph.standard_inputs>` makes a context of this process
alone: no plan, no record, no launcher, a console logger. A portable
checkpoint's manifest then records no plan; pass ``RunContext(plan=...)`` to
have one recorded.

It lives in :mod:`flexgraph.training.output` because it holds the run's
record and log, and every part that reads it (checkpoint, loop, resume,
steps) sits above output in training's layers; the command line builds it,
above them all.
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

__all__ = ["AutoChoice", "LaunchFacts", "RunContext"]


@attrs.frozen
class AutoChoice:
    """What ``--strategy auto`` chose, and why.

    Parameters
    ----------
    label : str
        The chosen candidate, as ``--compare`` names it (``"ddp:bf16"``).
    strategy : mapping
        The strategy as the work_dir's ``config.py`` records it
        (``{"type": name, **options}``), so that the config plans the same way again.
    reason : str, optional
        Why it was chosen (for the run's log).
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
        What started the ranks, as the run's summary line says it
        (``"torch elastic"``, ``"slurm (4 tasks, rendezvous node01:15042)"``);
        ``None``: this process runs alone.
    launches_ranks : bool
        This process is a launcher: it starts ranks and runs no step itself.
    launched : bool
        This process is a rank that a launcher started (torch's elastic agent,
        ``torchrun``, or an ``srun`` task per rank).
    node_rank : int
        This node's rank among the launchers of several nodes (0 alone).
    master_addr, master_port : optional
        Where the launchers of several nodes meet (``None``: torch's defaults).
    resume : str, optional
        What to resume from: ``--resume``, or ``"auto"`` in a SLURM job that
        was requeued.
    auto : AutoChoice, optional
        ``--strategy auto``'s choice (the launcher's, on its ranks).
    estimate : RunEstimate, optional
        The estimate the run's memory is measured against (``--estimate``,
        ``--strategy auto``, or the launcher's on its ranks); ``None``: not measured.
    progress : Progress, optional
        The progress record this rank keeps for its launcher (``None`` when no
        launcher asked for one).
    handed_down : LaunchEnv
        What the launcher handed this rank through its environment (empty when
        no flexgraph launcher started it).
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

    The log's parts default to the record's (its logger, timestamp and folder),
    or without one to a console logger named by the current time; the message
    hub is made with the context.

    Parameters
    ----------
    rank : int
        This process's global rank (0 alone).
    world_size : int
        How many processes train (1 alone).
    plan : mapping, optional
        The plan being run, as ``flexgraph plan --format json`` prints it (its
        ``flexgraph.plan/2`` dict); the work_dir's ``plan.json``, a portable
        checkpoint's manifest and resume's plan-change log all use it.
        ``None``: no plan was given.
    record : RunRecord, optional
        The run's record in its work_dir (log file, config, plan), opened by
        ``flexgraph run``; ``None``: no record (a Python API run, a pipeline,
        a dry run).
    launch : LaunchFacts
        How the process was started (see :class:`LaunchFacts`).
    timestamp : str
        The run's ``%Y%m%d_%H%M%S`` name, as MMEngine's.
    logger : mmengine.logging.MMLogger
        The run's logger.
    log_dir : str, optional
        The run's folder (``runner.log_dir``: the record's); ``None``: the work_dir.
    message_hub : mmengine.logging.MessageHub
        Where the loop's scalars and the runtime info go (``runner.message_hub``).

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
        """The context of a run that no command set up: this process as its launcher placed it.

        The rank and world size are the ones a launcher gave the process
        (``RANK`` / ``WORLD_SIZE``; 0 and 1 without one); no record, no launch
        facts; a console logger.
        """
        from flexgraph.training.output._workdir import console_logger
        from flexgraph.training.runtime import launch_rank, launch_world_size

        timestamp = _now()
        return cls(rank=launch_rank(), world_size=launch_world_size(),
                   timestamp=timestamp, logger=console_logger(timestamp, log_level),
                   log_dir=log_dir)
