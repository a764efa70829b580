"""``flexgraph run``: plan a config, then execute the plan.

What can be checked before a step runs is checked first, so bad input exits 2
without starting processes or writing files. A rank whose plan's digest
differs from its launcher's refuses to run.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from flexgraph.cli.collector import imports_kept_from_collector
from flexgraph.cli.errors import UsageError
from flexgraph.cli.planning import (
    choose_strategy,
    derived_plan,
    load_config,
    make_run_plan,
    plan_digest,
)
from flexgraph.cli.slurm import LAUNCHERS, resume_after_requeue
from flexgraph.core.errors import FlexgraphError
from flexgraph.core.executor import RunResult
from flexgraph.core.plan import Plan
from flexgraph.core.references import check_references, resolve_functions, resolve_unchecked
from flexgraph.core.strategy import Strategy
from flexgraph.training.output import (
    AutoChoice,
    LaunchEnv,
    LaunchFacts,
    RunContext,
    RunEstimate,
    open_progress,
)


class PlanMismatchError(FlexgraphError, RuntimeError):
    """A launched process planned something other than what its launcher printed."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="a cfg.py, a Python pipeline script, or a YAML spec")
    parser.add_argument("--work-dir", help="where checkpoints and metrics go")
    parser.add_argument("--resume", help="'auto' (latest checkpoint in the work dir) or a path")
    parser.add_argument("--load-from", help="weights to start from (checkpoint or state_dict)")
    parser.add_argument("--strategy", help="strategy name (default: the config's, else "
                        "single, or ddp with more than one process); 'auto': the fastest "
                        "whose memory estimate fits the device (see --device-memory)")
    parser.add_argument("--cfg-options", nargs="+", default=[], metavar="K=V",
                        help="override config keys, mmengine style (a.b=1 c=[1,2])")
    parser.add_argument("--entry", choices=("train", "val", "test"), default="train",
                        help="for a training config: train (default), or one val / test "
                        "pass (with --load-from to evaluate a checkpoint)")
    parser.add_argument("--dry-run", action="store_true", help="plan and check, run nothing")
    parser.add_argument("--preempt-signal", metavar="SIGNAL",
                        help="a signal that stops training cleanly (checkpoint, exit 75) "
                        "besides SIGTERM and SIGINT, e.g. USR1 for SLURM's --signal=USR1@90 "
                        "(config: preemption.signal)")
    parser.add_argument("--launcher", choices=LAUNCHERS, default=None,
                        help="how the ranks were started (default: the config's launcher, "
                        "else auto: an srun step of several tasks is detected); slurm: one "
                        "srun task per rank; none: ignore SLURM's variables")
    from flexgraph.cli import estimate_cmd

    estimate_cmd.add_arguments(parser, views=False)
    launch = parser.add_argument_group("launch (torch.distributed.run)")
    launch.add_argument("--nproc-per-node", type=_positive, default=1, metavar="N",
                        help="processes per node")
    launch.add_argument("--nnodes", type=_nodes, default="1",
                        help="nodes, or MIN:MAX for elastic")
    launch.add_argument("--node-rank", type=_non_negative, default=0)
    launch.add_argument("--master-addr", default=None)
    launch.add_argument("--master-port", type=_port, default=None)
    launch.add_argument("--max-restarts", type=_non_negative, default=0, metavar="K",
                        help="restart the whole group up to K times after a rank dies; "
                        "restarted ranks resume from the last complete checkpoint")


def _at_least(low: int, text: str, high: int | None = None) -> int:
    """``text`` as an integer in ``low..high``."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < low or (high is not None and value > high):
        limits = f"{low} or more" if high is None else f"in {low}..{high}"
        raise argparse.ArgumentTypeError(f"must be {limits}, not {value}")
    return value


def _non_negative(text: str) -> int:
    return _at_least(0, text)


def _positive(text: str) -> int:
    return _at_least(1, text)


def _port(text: str) -> int:
    return _at_least(1, text, high=65535)


def _nodes(text: str) -> str:
    """``N`` or torch's elastic ``MIN:MAX``, both at least 1, kept as text."""
    low, _, high = text.partition(":")
    if _positive(low) > _positive(high or low):
        raise argparse.ArgumentTypeError(f"MIN:MAX needs MIN <= MAX, not {text}")
    return text


def _cfg_options(args: argparse.Namespace, resume: str | None) -> dict[str, Any]:
    """``--cfg-options`` and the flags that set config keys; ``resume`` is the launch's."""
    from flexgraph.cli.options import parse_cfg_options

    options = parse_cfg_options(args.cfg_options)
    if args.work_dir:
        options["work_dir"] = args.work_dir
    if resume:
        options["resume"] = resume
    if args.load_from:
        options["load_from"] = args.load_from
    if args.preempt_signal:
        options["preemption.signal"] = args.preempt_signal
    return options


def _is_launched() -> bool:
    """This process is a rank that torch's elastic agent (ours or torchrun) started."""
    return "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ


def _is_launcher(args: argparse.Namespace) -> bool:
    many = args.nproc_per_node > 1 or args.nnodes != "1" or args.max_restarts > 0
    return many and not _is_launched()


def _world_size(args: argparse.Namespace) -> int:
    if "WORLD_SIZE" in os.environ:
        return int(os.environ["WORLD_SIZE"])
    nodes = int(str(args.nnodes).split(":")[-1])
    return args.nproc_per_node * nodes


def _read_settings(spec: Any) -> Any:
    """A training config's settings, checked before anything is planned (``None``: a pipeline)."""
    if spec.cfg is None:
        return None
    from flexgraph.training.config import check_paths, read_settings

    settings = read_settings(spec.cfg)
    check_paths(settings)
    return settings


def _choose_strategy(args: argparse.Namespace, spec: Any, world: int, handed_down: LaunchEnv,
                     launched: bool) -> tuple[Strategy | None, AutoChoice | None, Any]:
    """The strategy, checked against the world size; ``--strategy auto``'s choice and estimate."""
    if args.strategy == "auto" and spec.cfg is not None:
        return _choose_auto(args, spec, world, handed_down, launched)
    strategy = choose_strategy(spec, args.strategy, world)
    if strategy is not None and strategy.world_size == "one" and world > 1:
        from flexgraph.core.strategy import StrategyOptionError

        raise StrategyOptionError(
            f"strategy {strategy.name!r} runs one process but the world size is {world}; "
            "use --strategy ddp"
        )
    return strategy, None, None


def _choose_auto(args: argparse.Namespace, spec: Any, world: int, handed_down: LaunchEnv,
                 launched: bool) -> tuple[Strategy, AutoChoice, Any]:
    """``--strategy auto``: (strategy, choice, estimate).

    A launched rank takes its launcher's choice without estimating (estimate ``None``).
    """
    from flexgraph.cli import estimate_cmd
    from flexgraph.cli.console import stdout_console
    from flexgraph.render import estimate_view

    strategy, report, candidate = estimate_cmd.choose_auto(
        spec, world, args.device_memory, chosen=handed_down.auto_choice,
        host_memory=args.host_memory, per_node=args.nproc_per_node)
    estimate = RunEstimate.from_report(report, candidate.label) if report else None
    auto = AutoChoice(label=candidate.label, strategy={"type": candidate.name, **candidate.options},
                      reason=report.get("auto", {}).get("reason") or handed_down.auto_reason)
    if report and not launched:
        stdout_console().print(estimate_view(report))
    return strategy, auto, estimate


def _choose_launch(args: argparse.Namespace, spec: Any) -> dict[str, Any]:
    """This process's place in the launch (the :class:`LaunchFacts` of it), and what launched it."""
    from flexgraph.cli.slurm import become_slurm_rank, choose_launcher, slurm_node

    launched_by, node = None, None
    requested = args.launcher
    if requested is None and spec.cfg is not None:  # MMEngine's key; its 'none' is its default
        requested = {"none": None}.get(spec.cfg.get("launcher"), spec.cfg.get("launcher"))
    if requested == "none":
        pass
    elif _is_launcher(args):
        node = slurm_node(args.nnodes, os.environ, master_addr=args.master_addr,
                          master_port=args.master_port)
        launched_by = node.describe(args.nproc_per_node) if node else "torch elastic"
    elif choose_launcher(requested, os.environ) == "slurm":
        launched_by = become_slurm_rank(os.environ)  # torchrun's variables, for torch too
    elif _is_launched():
        launched_by = "torch elastic"
    place = ({"node_rank": node.node_rank, "master_addr": node.master_addr,
              "master_port": node.master_port} if node else
             {"node_rank": args.node_rank, "master_addr": args.master_addr,
              "master_port": args.master_port})
    return {"launched_by": launched_by, "launches_ranks": _is_launcher(args),
            "launched": _is_launched(), **place}


def _check_launched_plan(digest: str, handed_down: LaunchEnv, rank: int) -> None:
    expected = handed_down.plan_digest
    if expected and digest != expected:
        raise PlanMismatchError(
            f"rank {rank} planned differently from its launcher (plan digest {digest}, "
            f"launcher's {expected}); the config or the files it imports differ between "
            f"the launcher and this process"
        )


def run_command(args: argparse.Namespace) -> int:
    handed_down = LaunchEnv.read(os.environ)  # what a launcher handed this rank, if any
    if handed_down.launcher_pid is not None:  # a rank of flexgraph's launcher
        from flexgraph.cli.watchdog import die_with_parent

        die_with_parent()
    progress = open_progress(handed_down.progress_dir, int(os.environ.get("RANK", 0)))
    if not _is_launched():
        return _run(args, (), handed_down, progress)
    from flexgraph.cli.launch import RankReport, run_as_rank

    report = RankReport(progress)  # a rank: its errors go to its launcher (flexgraph.cli.launch)
    return run_as_rank(functools.partial(_run, args, [report], handed_down, progress), report,
                       to_launcher=handed_down.launcher_pid is not None, debug=args.debug)


def _run(args: argparse.Namespace, hooks: Sequence[Any] = (),
         handed_down: LaunchEnv | None = None, progress: Any = None) -> int:
    # What loading and planning import stays out of the collector's scans (see collector.py).
    with imports_kept_from_collector() as imports_done:
        prepared = prepare_run(args, args.config, handed_down or LaunchEnv(), progress,
                               imports_done)
        if prepared.launching:
            return _launch_ranks(args, prepared.digest, prepared.place.launch,
                                 prepared.settings)
        return _execute(args, hooks, prepared)


@attrs.frozen
class _Place:
    rank: int
    world_size: int
    launch: LaunchFacts


@attrs.frozen
class PreparedRun:
    """What a process settled before anything runs (``derived``: what the run's files changed)."""

    spec: Any
    strategy: Strategy | None
    plan: Plan
    derived: dict[str, Any]
    settings: Any
    digest: str
    launching: bool
    place: _Place


def prepare_run(args: argparse.Namespace, config: Any, handed_down: LaunchEnv, progress: Any,
                imports_done: Callable[[], None]) -> PreparedRun:
    """Load ``config`` (a path, or a Config), choose the strategy, plan and check it.

    ``imports_done`` is called once the plan's functions are imported.
    """
    resume = args.resume
    if args.launcher != "none":
        resume = resume_after_requeue(resume, os.environ)
    spec = load_config(config, _cfg_options(args, resume), entry=args.entry)
    if args.work_dir and spec.cfg is None and "work_dir" not in spec.graph.artifacts:
        raise UsageError(f"--work-dir: no step of the pipeline {spec.source} takes a "
                         f"work_dir; drop the flag, or give a step the input work_dir")
    where = _choose_launch(args, spec)
    rank, world = int(os.environ.get("RANK", 0)), _world_size(args)
    strategy, auto, estimate = _choose_strategy(args, spec, world, handed_down,
                                                where["launched"])
    targets = () if args.entry == "train" else (args.entry,)
    digest = plan_digest(spec, strategy, targets)
    launching = where["launches_ranks"] and not args.dry_run
    if not launching:
        _check_launched_plan(digest, handed_down, rank)
    settings = _read_settings(spec)
    if launching or settings is None:  # a launcher builds no model: it derives nothing
        plan, derived = make_run_plan(spec, strategy, targets=targets), {}
    else:
        plan, derived = derived_plan(spec, strategy, settings.weights_to_load(), targets)
    unchecked = check_references(plan)  # fail fast: a typo is found before any import,
    if launching:
        resolve_unchecked(unchecked)  # then what only an import settles, before any rank
    else:
        resolve_functions(plan)  # or every function, before any step runs
    imports_done()
    estimate = _run_estimate(args, spec, strategy, world, handed_down, estimate)
    launch = LaunchFacts(**where, resume=resume, auto=auto, estimate=estimate,
                         progress=progress, handed_down=handed_down)
    return PreparedRun(spec, strategy, plan, derived, settings, digest, launching,
                       _Place(rank, world, launch))


def _run_estimate(args: argparse.Namespace, spec: Any, strategy: Strategy | None, world: int,
                  handed_down: LaunchEnv, estimate: RunEstimate | None) -> RunEstimate | None:
    """The estimate this run's memory is measured against, or ``None``."""
    if args.dry_run or spec.cfg is None:
        return None
    if handed_down.run_estimate:
        return RunEstimate.from_json(handed_down.run_estimate)
    if estimate is not None or not args.estimate:
        return estimate
    if args.entry != "train":
        raise UsageError(f"--estimate is of a training step; drop it with --entry {args.entry}")
    from flexgraph.cli import estimate_cmd

    return estimate_cmd.run_estimate(spec, strategy, world, args.device_memory,
                                     host_memory=args.host_memory, per_node=args.nproc_per_node)


def _execute(args: argparse.Namespace, hooks: Sequence[Any], prepared: PreparedRun) -> int:
    """Run the plan here; a stop on a signal is said and requeued; a launched rank ends at once."""
    from flexgraph.training.errors import TrainingStopped

    settings, launch = prepared.settings, prepared.place.launch
    try:
        execute_run(args, hooks, prepared)
    except TrainingStopped as stop:
        if "TORCHELASTIC_RUN_ID" in os.environ:  # its launcher says it and asks to requeue
            raise
        from flexgraph.cli.stopping import report_stop

        # said before the requeue: SLURM cancels the job's step as it requeues it, and
        # what the step's tasks write after that never reaches the job's output
        status = report_stop(stop)
        _requeue(args, stop.signal_name, settings.stop.signals if settings is not None else ())
        return status
    # launch.launched was taken before the plan ran: a strategy's setup_env may describe a
    # world of one in the environment
    if launch.launched and not args.dry_run:  # done, the work_dir released: leave at once
        from flexgraph.cli.stopping import end_launched_rank
        from flexgraph.training.runtime import leave_process_group

        if launch.progress is not None:
            launch.progress.finished()  # its launcher tells a finished rank from a vanished one
        leave_process_group()
        end_launched_rank(0)
    return 0


def execute_run(args: argparse.Namespace, hooks: Sequence[Any],
                prepared: PreparedRun) -> RunResult | None:
    """Run the plan in this process, owning its work_dir meanwhile; ``None`` for a dry run."""
    from flexgraph.cli.work_dir_owner import own_work_dir, run_id

    place = prepared.place
    this_run = run_id(handed_down=place.launch.handed_down.run_id)
    with own_work_dir(None if args.dry_run else prepared.settings, owner=place.rank == 0,
                      this_run=this_run) as lock:
        return _execute_here(args, hooks, prepared.spec, prepared.plan, prepared.derived,
                             prepared.settings, place, this_run, lock)


def _remove_watch_folder(settings: Any, this_run: str, lock: Any) -> None:
    if settings is not None and lock is not None and lock.owned:
        from flexgraph.cli.watch_folder import remove_run

        remove_run(settings.work_dir, this_run)


def _launch_ranks(args: argparse.Namespace, digest: str, launch: LaunchFacts,
                  settings: Any) -> int:
    from flexgraph.cli.launch import launch as launch_ranks
    from flexgraph.cli.work_dir_owner import own_work_dir, run_id

    stop_signals = settings.stop.signals if settings is not None else ()

    if launch.node_rank == 0 and launch.launched_by != "torch elastic":
        print(f"flexgraph: launching with {launch.launched_by}", flush=True)
    stopped_by: list[str] = []
    # the launcher of node 0 owns the work_dir for the ranks' whole life, restarts included
    rendezvous = (f"{launch.master_addr}:{launch.master_port}" if args.nnodes != "1"
                  else None)
    this_run = run_id(rendezvous, handed_down=launch.handed_down.run_id)
    with own_work_dir(settings, owner=launch.node_rank == 0, this_run=this_run,
                      launcher=True):
        auto, estimate = launch.auto, launch.estimate
        handed_down = LaunchEnv(
            plan_digest=digest,
            run_id=this_run if settings is not None else None,
            auto_choice=auto.label if auto else None,
            auto_reason=auto.reason if auto else None,
            run_estimate=estimate.to_json() if estimate is not None else None)
        status = launch_ranks(args, launch, handed_down, stop_signals,
                              on_stop=stopped_by.append, settings=settings, run_id=this_run)
        if status == 0 and settings is not None and launch.node_rank == 0:
            from flexgraph.cli.watch_folder import remove_run

            remove_run(settings.work_dir, this_run)
    for signal_name in stopped_by:  # the work_dir released first: SLURM ends the job now
        _requeue(args, signal_name, stop_signals)
    return status


def _requeue(args: argparse.Namespace, signal_name: str, stop_signals: Sequence[str]) -> None:
    """After a stop on the preemption signal, in a SLURM job: have SLURM requeue it.

    SLURM cancels the job's step as it requeues it (SIGTERM): this process ignores it from here.
    """
    from flexgraph.cli.slurm import requeue_after_stop
    from flexgraph.cli.stopping import ignore_stop_signals

    ignore_stop_signals(signal_name)
    if args.launcher != "none":
        preempt = tuple(s for s in stop_signals if s not in ("SIGTERM", "SIGINT"))
        requeue_after_stop(signal_name, preempt, os.environ)


def _execute_here(args: argparse.Namespace, hooks: Sequence[Any], spec: Any, plan: Plan,
                  derived: dict[str, Any], settings: Any, place: _Place, this_run: str,
                  lock: Any) -> RunResult | None:
    from flexgraph.cli.console import stdout_console
    from flexgraph.render import derivation_lines
    from flexgraph.training.errors import TrainingStopped

    console = stdout_console()
    console.quiet = place.rank != 0
    launch = place.launch
    launched = f", launched by {launch.launched_by}" if launch.launched_by else ""
    summary = (f"flexgraph: {len(plan.order)} steps, strategy {plan.strategy or 'none'}"
               f"{launched}: " + " -> ".join(plan.order))
    console.print(summary)
    lines = derivation_lines(derived)
    for line in lines:  # one line each, never folded: they name files and entries
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    inputs, context, record = dict(spec.inputs), None, None
    if spec.cfg is not None:  # a YAML or Python pipeline has no work_dir and no context
        from flexgraph.render import plan_to_dict
        from flexgraph.training.graph import standard_inputs

        plan_record = plan_to_dict(plan)  # the plan's one serialised form, for all its readers
        if not args.dry_run:  # the work_dir's log, config and plan: only now the plan is valid
            record = _open_record(args, spec, settings, plan_record, place, [summary, *lines])
        context = RunContext(rank=place.rank, world_size=place.world_size, plan=plan_record,
                             record=record, launch=launch)
        inputs.update(standard_inputs(spec.cfg, context, settings=settings))
    peaks = None
    if launch.estimate is not None:
        from flexgraph.training.output import MeasuredPeaks

        peaks = MeasuredPeaks()
    from flexgraph.training.output import StepTimings

    # a training's setup is printed before it trains, a pipeline's every step at its end
    timings = StepTimings(plan, console, after_last=spec.cfg is None)
    hooks = [timings, *hooks]
    if record is None:
        result = _run_steps(args, hooks, peaks, plan, inputs)
    else:
        try:
            result = _run_watched(args, hooks, peaks, plan, inputs, settings, context,
                                  this_run, lock)
            if peaks is not None:
                _record_memory(record, console, launch.estimate, peaks, place.rank)
            if place.rank == 0:
                _write_run_page(spec, plan, record, timings, launch.estimate, console)
        except TrainingStopped as stop:  # not a failure: the run goes on with --resume auto
            record.note(str(stop))
            raise
        except BaseException as exc:
            record.failed(exc)
            raise
        finally:
            record.close()
    if args.dry_run:
        console.print("dry run: nothing executed")
        return None
    for artifact in plan.steps[-1].outputs:  # what the run was for: the last step's outputs
        value = repr(result.context[artifact])
        console.print(f"{artifact}: {value if len(value) <= 300 else value[:297] + '...'}",
                      markup=False, highlight=False)
    return result


def _open_record(args: argparse.Namespace, spec: Any, settings: Any, plan_record: Any,
                 place: _Place, lines: Sequence[str]) -> Any:
    from flexgraph.training.output import open_run_record

    auto = place.launch.auto
    record_cfg = spec.cfg
    if auto and "strategy" in record_cfg:  # replaced whole, not merged into
        record_cfg = record_cfg.copy()
        del record_cfg["strategy"]
    plan_text = json.dumps(plan_record, indent=2, allow_nan=False)  # as flexgraph plan -f json
    record = open_run_record(record_cfg, settings, plan_text, rank=place.rank,
                             strategy=auto.strategy if auto else args.strategy)
    for line in lines:
        record.note(line)
    if auto:
        record.note(f"strategy auto chose {auto.label}"
                    + (f": {auto.reason}" if auto.reason else ""))
    return record


def _run_steps(args: argparse.Namespace, hooks: Sequence[Any], peaks: Any, plan: Plan,
               inputs: dict[str, Any]) -> Any:
    from flexgraph.core.executor import Executor

    executor = Executor([*hooks, *([peaks] if peaks is not None else [])])
    return executor.run(plan, inputs, dry_run=args.dry_run)


def _run_watched(args: argparse.Namespace, hooks: Sequence[Any], peaks: Any, plan: Plan,
                 inputs: dict[str, Any], settings: Any, context: RunContext, this_run: str,
                 lock: Any) -> Any:
    """The steps under the progress watchdog, unless ``env_cfg.stall_timeout`` is 0."""
    from flexgraph.cli.watchdog import start_watchdog
    from flexgraph.training.errors import TrainingStopped

    watchdog = start_watchdog(settings, context, this_run,
                              release=lock.release if lock is not None else None)
    if watchdog is None:
        result = _run_steps(args, hooks, peaks, plan, inputs)
        _remove_watch_folder(settings, this_run, lock)
        return result
    try:
        result = _run_steps(args, [*hooks, watchdog], peaks, plan, inputs)
    except TrainingStopped:
        raise
    except Exception as exc:
        watchdog.failed(exc)  # ends the process here when another rank failed first
        raise
    finally:
        watchdog.stop()
    _remove_watch_folder(settings, this_run, lock)
    return result


def _write_run_page(spec: Any, plan: Plan, record: Any, timings: Any, estimate: Any,
                    console: Any) -> None:
    """The run folder's ``plan.html`` and ``timings.txt`` (a warning if not written)."""
    from flexgraph.training.output import write_run_page

    strategy = spec.resolve_strategy(plan.strategy) if plan.strategy else None
    try:
        write_run_page(record.run_dir, plan, timings.by_rank, estimate=estimate,
                       checks=strategy.checks if strategy is not None else ())
    except OSError as exc:
        line = f"warning: the run's timings and page were not written: {exc}"
        console.print(line, markup=False, highlight=False)
        record.note(line)


def _record_memory(record: Any, console: Any, estimate: Any, peaks: Any, rank: int) -> None:
    """The work_dir's ``memory.json`` and one console line: measured peaks beside the estimate."""
    from flexgraph.training.output import MEMORY_FILE, memory_summary, summary_line

    summary = memory_summary(estimate, peaks.steps, rank, peaks.setup_by_rank)
    record.write_json(MEMORY_FILE, summary)
    line = summary_line(summary)
    console.print(line, markup=False, highlight=False)
    record.note(line)
