"""``flexgraph plan CONFIG``: the plan a strategy makes; imports no torch without ``--estimate``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flexgraph import render as views
from flexgraph.cli import estimate_cmd
from flexgraph.cli.collector import imports_kept_from_collector
from flexgraph.cli.console import print_renderable
from flexgraph.cli.errors import UsageError
from flexgraph.cli.options import parse_cfg_options
from flexgraph.cli.planning import choose_strategy, derived_plan, load_config, make_run_plan
from flexgraph.core.plan import Plan
from flexgraph.core.references import check_references, resolve_fn
from flexgraph.render.html import compare_page, plan_page

if TYPE_CHECKING:
    from flexgraph.core.strategy import Strategy
    from flexgraph.spec import Spec

FORMATS = ("text", "json", "dot", "mermaid", "html")

NO_STRATEGY = "none"
"""``--strategy none``: plan the base graph even when the config names a strategy."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="a YAML spec (.yaml, .yml) or a Python config (.py)")
    parser.add_argument(
        "--strategy",
        "-s",
        metavar="NAME",
        help="strategy to plan with (default: the one the config names); "
        "'none' plans the base graph as declared; 'auto' the fastest whose memory "
        "estimate fits the device (see --world-size, --device-memory)",
    )
    parser.add_argument(
        "--format",
        "-f",
        choices=FORMATS,
        default="text",
        help="text (table, default), json (schema flexgraph.plan/2), dot (Graphviz), mermaid, "
        "html (one self-contained page; with --estimate or --compare, memory per step)",
    )
    parser.add_argument("--output", "-o", metavar="FILE",
                        help="write to FILE instead of stdout (written only if the plan is made)")
    view = parser.add_mutually_exclusive_group()
    view.add_argument(
        "--diff",
        action="store_true",
        help="show the base order and the planned order side by side, and the rewrites",
    )
    view.add_argument(
        "--explain", metavar="STEP", help="say why STEP sits where it does in the plan"
    )
    parser.add_argument(
        "--cfg-options",
        nargs="+",
        action="extend",
        default=[],
        metavar="K=V",
        help="override config keys, mmengine style (a.b=1 c=[1,2]); repeatable",
    )
    estimate_cmd.add_arguments(parser)


def checkpoint_notes(cfg: Any, plan: Plan) -> dict[str, str]:
    """Which reader will read ``load_from`` and an explicit ``resume`` path, by step.

    Only for a path that exists now, recognised by its content without torch.
    """
    if cfg is None or not {"load_checkpoint", "resume"} & set(plan.order):
        return {}
    from flexgraph.training.config import resume_source, section

    load_from, resume = section(cfg, "load_from"), resume_source(cfg)
    asked = {"load_checkpoint": ("load_from", None if load_from == resume else load_from),
             "resume": ("resume", None if resume == "auto" else resume)}
    notes = {}
    for step, (key, path) in asked.items():
        if step in plan.order and path is not None and Path(path).exists():
            notes[step] = _reader_note(key, Path(path))
    return notes


def pruning_notes(cfg: Any, strategy: Any, plan: Plan) -> dict[str, str]:
    """``init_weights``: what a run decides about it, where only a run can (no torch here)."""
    if cfg is None or strategy is None or "init_weights" not in strategy.prunable \
            or "init_weights" not in plan.order:
        return {}
    from flexgraph.training.config import names_pretrained, resume_source, section

    load_from = section(cfg, "load_from")
    files = [f"load_from {str(load_from)!r}"] if load_from and load_from != resume_source(
        cfg) else []
    if names_pretrained(cfg):
        files.append("the init_cfg Pretrained files")
    if not files:
        return {}
    cover = "covers" if len(files) == 1 and files[0].startswith("load_from") else "cover"
    return {"init_weights": f"pruned at run time when {' and '.join(files)} {cover} every "
                            f"state_dict entry (flexgraph plan --estimate says whether)"}


def strategy_notes(cfg: Any, strategy: Strategy | None) -> dict[str, str]:
    """What the strategy's steps will make of the config, by step (``Strategy.plan_notes``)."""
    if cfg is None or strategy is None or not strategy.plan_notes:
        return {}
    return resolve_fn(strategy.plan_notes)(cfg, strategy)


def _load_from(spec: Spec) -> str | None:
    from flexgraph.training.config import read_settings

    return read_settings(spec.cfg).weights_to_load() if spec.cfg is not None else None


def _reader_note(key: str, path: Path) -> str:
    from flexgraph.training.formats import format_of

    found = format_of(path)
    if found is None:
        return (f"{key} {str(path)!r} is in no checkpoint format flexgraph recognises; "
                f"the run will say what it is")
    return f"{key} {str(path)!r} is read as {found.name}"


def load_spec_and_plan(config: str, strategy: str | None, cfg_options: list[str]
                       ) -> tuple[Spec, Plan]:
    spec = load_config(config, parse_cfg_options(cfg_options))
    return spec, make_run_plan(spec, _strategy_of(spec, strategy))


def _strategy_of(spec: Spec, name: str | None) -> Strategy | None:
    """The strategy ``--strategy`` names (``none``: no strategy at all)."""
    return None if name == NO_STRATEGY else choose_strategy(spec, name)


def render(plan: Plan, args: argparse.Namespace, notes: dict[str, str] | None = None) -> None:
    """Print ``plan`` the way ``args`` ask; the table and the JSON carry ``notes``."""
    if args.format == "json":
        sys.stdout.write(views.plan_json(plan, notes) + "\n")
    elif args.format == "dot":
        sys.stdout.write(views.plan_dot(plan))
    elif args.format == "mermaid":
        sys.stdout.write(views.plan_mermaid(plan))
    elif args.explain:
        text = views.explain_step(plan, args.explain)
        sys.stdout.write(text + "\n")
    elif args.diff:
        print_renderable(views.plan_diff(plan))
    else:
        print_renderable(views.plan_table(plan))
        for step, note in (notes or {}).items():
            sys.stdout.write(f"{step}: {note}\n")


def plan_command(args: argparse.Namespace) -> int:
    if args.output:  # what stdout would get, written to the file once the plan is made
        import contextlib
        import io

        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            status = _plan_command(args)
        Path(args.output).write_text(buffer.getvalue(), encoding="utf-8")
        return status
    return _plan_command(args)


def _plan_command(args: argparse.Namespace) -> int:
    if args.format != "text" and (args.diff or args.explain):
        flag = "--diff" if args.diff else "--explain"
        raise UsageError(f"{flag} prints text; drop --format {args.format}")
    estimating = args.estimate or args.compare
    if estimating and (args.diff or args.explain or args.format in ("dot", "mermaid")):
        raise UsageError("--estimate and --compare print a table (text), JSON or a page "
                         "(html); drop --diff / --explain / --format dot|mermaid")
    if args.estimate and args.compare:
        raise UsageError("--compare estimates every candidate it names; drop --estimate")
    if args.strategy == estimate_cmd.AUTO:
        return _plan_auto(args)
    if estimating:
        return _plan_estimate(args)
    spec = load_config(args.config, parse_cfg_options(args.cfg_options))
    strategy = _strategy_of(spec, args.strategy)
    plan = make_run_plan(spec, strategy)
    for unchecked in check_references(plan):
        print(f"note: {unchecked}", file=sys.stderr)
    notes = {**checkpoint_notes(spec.cfg, plan), **pruning_notes(spec.cfg, strategy, plan),
             **strategy_notes(spec.cfg, strategy)}
    if args.format == "html":
        sys.stdout.write(page_of_plan(plan, strategy, args.config))
        return 0
    render(plan, args, notes)
    return 0


def _print_estimate(report: dict[str, Any], args: argparse.Namespace) -> None:
    if args.format == "json":
        sys.stdout.write(views.estimate_json(report) + "\n")
    else:
        print_renderable(views.estimate_view(report))


def _load_for_estimate(args: argparse.Namespace, imports_done: Callable[[], None]) -> Any:
    """The spec, with the estimate's own imports, then frozen out of the collector."""
    spec = load_config(args.config, parse_cfg_options(args.cfg_options))
    import_module("flexgraph.training.estimate")
    imports_done()
    return spec


def _plan_estimate(args: argparse.Namespace) -> int:
    """``--estimate`` (the plan's strategy) or ``--compare`` (the candidates named)."""
    with imports_kept_from_collector() as imports_done:
        spec = _load_for_estimate(args, imports_done)
        strategy, derived, plan = None, {}, None
        if not args.compare:
            strategy = choose_strategy(spec, args.strategy, args.world_size or 1)
            # the plan estimated is one that plans, with what the run derives from its files
            plan, derived = derived_plan(spec, strategy, _load_from(spec))
        report = estimate_cmd.estimate_report(spec, strategy, args)
        if derived:
            report["plan"] = derived
        if args.format == "html":
            if args.compare:
                load_from = _load_from(spec)
                sys.stdout.write(page_of_candidates(
                    spec, report, args.config, args.compare,
                    lambda s: derived_plan(spec, s, load_from)[0]))
            else:
                sys.stdout.write(page_of_plan(plan, strategy, args.config, report))
            return 0
        _print_estimate(report, args)
    return 0


def page_of_plan(plan: Plan, strategy: Any, config: str,
                 report: dict[str, Any] | None = None) -> str:
    """The page of ``plan``, with ``report``'s memory per step when given."""
    checks = strategy.checks if strategy is not None else ()
    return plan_page(plan, checks=checks, estimate=report, source=config)


def page_of_candidates(spec: Any, report: dict[str, Any], config: str, compare: str,
                       plan_of: Callable[[Any], Plan]) -> str:
    """The ``--compare`` page: each candidate with the plan ``plan_of`` makes of it."""
    from flexgraph.training.estimate import amp_precision, parse_candidates

    candidates = parse_candidates(compare, spec.cfg.get("strategy"), amp_precision(spec.cfg))
    plans = {c.label: (plan_of(c.strategy), c.strategy.checks) for c in candidates}
    return compare_page(report, plans, source=config)


def _plan_auto(args: argparse.Namespace) -> int:
    """``--strategy auto``: the chosen plan, the candidates table and the reason."""
    with imports_kept_from_collector() as imports_done:
        spec = _load_for_estimate(args, imports_done)
        if spec.cfg is None:
            raise UsageError("--strategy auto chooses among training strategies; it needs a "
                             "training config")
        strategy, report, _ = estimate_cmd.choose_auto(
            spec, args.world_size or 1, args.device_memory, host_memory=args.host_memory,
            per_node=args.nproc_per_node)
    plan, derived = derived_plan(spec, strategy, _load_from(spec))
    if derived:
        report["plan"] = derived
    if args.format == "json":
        import json

        plan_dict = json.loads(views.plan_json(plan))
        plan_dict["estimate"] = report
        sys.stdout.write(json.dumps(plan_dict, indent=2, sort_keys=True) + "\n")
        return 0
    if args.format == "html":  # the chosen candidate's page
        chosen = [r for r in report["candidates"] if r["candidate"] == report["auto"]["choice"]]
        sys.stdout.write(page_of_plan(plan, strategy, args.config,
                                      {**report, "candidates": chosen}))
        return 0
    render(plan, args)
    print_renderable(views.estimate_view(report))
    return 0
