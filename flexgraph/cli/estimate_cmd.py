"""``plan --estimate / --compare`` and ``--strategy auto``: what a plan costs per rank.

Everything here imports torch lazily, inside the functions: ``flexgraph plan``
without these flags never does. The estimate itself is
:mod:`flexgraph.training.estimate`; each strategy's memory model lives in its
own module beside it (``Strategy.memory_model``).
"""

from __future__ import annotations

import argparse
from typing import Any

from flexgraph.core.strategy import Strategy

AUTO = "auto"


def add_arguments(parser: argparse.ArgumentParser, *, views: bool = True) -> None:
    """``--device-memory`` and ``--estimate``; with ``views`` (plan's), ``--compare``
    and ``--world-size`` too."""
    group = parser.add_argument_group("memory estimate (imports torch; allocates nothing)")
    if views:
        group.add_argument("--estimate", action="store_true",
                           help="per-rank memory of the plan: parameters, gradients, optimizer "
                           "states, activations (one step traced on the meta device), buffers")
        group.add_argument("--compare", metavar="CANDIDATES",
                           help="estimate several strategies side by side: "
                           "NAME[:STAGE][:PRECISION],... e.g. ddp,ddp:fp16,"
                           "deepspeed:zero1:fp16,deepspeed:zero3,fsdp:bf16")
        group.add_argument("--world-size", type=int, default=None, metavar="N",
                           help="ranks to estimate for (default: 1)")
    else:
        group.add_argument("--estimate", action="store_true",
                           help="estimate the plan's per-rank peak before it runs and record "
                           "it next to the measured peak (work_dir's memory.json)")
    group.add_argument("--device-memory", metavar="SIZE",
                       help="memory of one GPU, e.g. 80GB: the estimate is then for CUDA "
                       "(default: the local GPU's, else RAM / ranks and the CPU's kernels)")


def _with_verdicts(report: dict[str, Any], given: str | None, world_size: int,
                   margin: float) -> dict[str, Any]:
    from flexgraph.training.estimate import device_memory

    capacity, source = device_memory(given, world_size)
    report["device_memory"] = {"bytes": capacity, "source": source, "margin": margin}
    usable = capacity * (1 - margin)
    for row in report["candidates"]:
        traced = row["parts"]["activations"] is not None
        row["fits"] = (row["peak_bytes"] <= usable) if traced else None
    return report


def _config_candidate(spec: Any, strategy: Strategy, amp: str | None) -> Any:
    from flexgraph.training.estimate import Candidate

    return Candidate(label=strategy.name, strategy=strategy, amp=amp, name=strategy.name)


def estimate_report(spec: Any, strategy: Strategy | None, args: argparse.Namespace) -> dict:
    """The ``flexgraph.estimate/1`` dict for ``--estimate`` (the plan's strategy) or
    ``--compare`` (its candidates)."""
    from flexgraph.training.estimate import (
        AUTO_MARGIN,
        amp_precision,
        estimate,
        parse_candidates,
        target_device,
    )

    if spec.cfg is None:
        from flexgraph.training.errors import ConfigError

        raise ConfigError(f"{spec.source}: an estimate needs a training config (cfg.py with "
                          "model, train_dataloader and optim_wrapper)")
    world = args.world_size or 1
    amp = amp_precision(spec.cfg)
    if args.compare:
        candidates = parse_candidates(args.compare, spec.cfg.get("strategy"), amp)
    else:
        from flexgraph.core.strategy import get_strategy

        candidates = [_config_candidate(spec, strategy or get_strategy("single"), amp)]
    result = estimate(spec.cfg, candidates, world_size=world,
                      device=target_device(args.device_memory))
    return _with_verdicts(result.as_dict(), args.device_memory, world, AUTO_MARGIN)


def choose_auto(spec: Any, world_size: int, device_memory: str | None,
                chosen: str | None = None) -> tuple[Strategy, dict[str, Any], Any]:
    """``--strategy auto``: the strategy chosen, the estimate report, the candidate.

    Parameters
    ----------
    spec : Spec
        The loaded config.
    world_size : int
        The ranks the run will have.
    device_memory : str or None
        ``--device-memory`` as written; ``None``: this machine's.
    chosen : str, optional
        The candidate a launcher chose for this rank
        (:data:`~flexgraph.training.output.AUTO_CHOICE_VAR`), taken without
        estimating again (the report is then empty).

    Returns
    -------
    tuple
        ``(strategy, report, candidate)``.

    Raises
    ------
    NothingFitsError
        No candidate fits: the smallest estimate and what would make it fit.
    """
    from flexgraph.training.estimate import (
        AUTO_MARGIN,
        amp_precision,
        auto_candidates,
        choose_strategy,
        estimate,
        parse_candidate,
        parse_candidates,
        target_device,
    )
    from flexgraph.training.estimate import (
        device_memory as memory_of,
    )

    amp = amp_precision(spec.cfg)
    if chosen:
        candidate = parse_candidate(chosen, spec.cfg.get("strategy"), amp)
        return candidate.strategy, {}, candidate
    candidates = parse_candidates(",".join(auto_candidates(world_size)),
                                  spec.cfg.get("strategy"), amp)
    result = estimate(spec.cfg, candidates, world_size=world_size,
                      device=target_device(device_memory))
    capacity, _ = memory_of(device_memory, world_size)
    choice = choose_strategy(result, capacity, AUTO_MARGIN)
    report = _with_verdicts(result.as_dict(), device_memory, world_size, AUTO_MARGIN)
    report["auto"] = {"choice": choice.label, "reason": choice.reason}
    candidate = next(c for c in candidates if c.label == choice.label)
    return candidate.strategy, report, candidate


def run_estimate(spec: Any, strategy: Strategy | None, world_size: int,
                 device_memory: str | None) -> Any:
    """``run --estimate``: the plan's per-rank peak, as a ``RunEstimate`` to measure against."""
    from flexgraph.training.output import RunEstimate

    args = argparse.Namespace(compare=None, world_size=world_size, device_memory=device_memory)
    report = estimate_report(spec, strategy, args)
    return RunEstimate.from_report(report, report["candidates"][0]["candidate"])
