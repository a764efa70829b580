"""The run's context: what a run knows beyond its config, in one frozen value passed down.

``flexgraph run`` learns things about its run that no config holds: the plan
it is about to run, the record it opened in the work_dir (and that record's
logger), this process's rank and the world size, and how the process was
launched (by whom, which strategy ``--strategy auto`` chose and why, the
memory estimate, the node's rank and rendezvous, the progress record its
launcher reads). It puts them in one :class:`RunContext`, built once where the
command line has been parsed, and hands it to the plan as the standard
graph's ``run_context`` input, the way the settings are handed in; the steps
that need any of it take it as an argument (``build_hooks``,
``build_checkpointer``, ``resume``, ``train``, ``val``, ``test``). Nothing
writes it back anywhere, and nothing reads it from anywhere but its argument.

The command builds it in stages, each a new value (``attrs.evolve``): the
launch facts while it loads the config and chooses the strategy, the plan once
it has planned, the record once the work_dir is its own and the plan valid.

Without the command (the Python API, a test), :func:`standard_inputs
<flexgraph.training.graph.standard_inputs>` gives a context of this process
alone: no plan, no record, no launcher. A portable checkpoint's manifest then
records no plan, because none was given; pass ``RunContext(plan=...)`` to
have one recorded.

It lives in :mod:`flexgraph.training.output` because it holds the run's
record, and every part that reads it (checkpoint, loop, resume, steps) sits
above output in training's layers; the command line builds it, above them all.
"""

from __future__ import annotations

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


@attrs.frozen
class RunContext:
    """What a run knows beyond its config: the standard graph's ``run_context`` input.

    Parameters
    ----------
    rank : int
        This process's global rank (0 alone).
    world_size : int
        How many processes train (1 alone).
    plan : mapping, optional
        The plan being run, as ``flexgraph plan --format json`` prints it, parsed;
        a portable checkpoint's manifest records it. ``None``: no plan was given.
    record : RunRecord, optional
        The run's record in its work_dir (log file, config, plan), opened by
        ``flexgraph run``; ``None``: no record (a Python API run, a pipeline,
        a dry run).
    launch : LaunchFacts
        How the process was started (see :class:`LaunchFacts`).

    Examples
    --------
    >>> context = RunContext(plan={"strategy": "ddp"}, world_size=2)
    >>> context.plan["strategy"], context.record, context.logger
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

    @property
    def logger(self) -> Any:
        """The record's logger (``None`` without a record: each reader makes its own)."""
        return self.record.logger if self.record is not None else None

    @classmethod
    def of_this_process(cls, plan: Mapping[str, Any] | None = None) -> RunContext:
        """The context of a run that no command set up: this process as its launcher placed it.

        The rank and world size are the ones a launcher gave the process
        (``RANK`` / ``WORLD_SIZE``; 0 and 1 without one); no record, no launch facts.

        Parameters
        ----------
        plan : mapping, optional
            The plan's JSON dict, for the manifests of portable checkpoints.

        Returns
        -------
        RunContext
        """
        from flexgraph.training.runtime import launch_rank, launch_world_size

        return cls(rank=launch_rank(), world_size=launch_world_size(), plan=plan)
