"""``plan --estimate / --compare`` and ``--strategy auto``: what a plan costs per rank."""

from __future__ import annotations

import argparse
from typing import Any

from flexgraph.core.strategy import Strategy

AUTO = "auto"


def add_arguments(parser: argparse.ArgumentParser, *, views: bool = True) -> None:
    """``--device-memory`` and ``--estimate``; with ``views``, ``--compare`` and the sizes."""
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
        group.add_argument("--nproc-per-node", type=int, default=None, metavar="N",
                           help="ranks per node, which share its host memory during setup "
                           "(default: all of --world-size on one node)")
    else:
        group.add_argument("--estimate", action="store_true",
                           help="estimate the plan's per-rank peak before it runs and record "
                           "it next to the measured peak (work_dir's memory.json)")
    group.add_argument("--device-memory", metavar="SIZE",
                       help="memory of one GPU, e.g. 80GB: the estimate is then for CUDA "
                       "(default: the local GPU's, else RAM / ranks and the CPU's kernels)")
    group.add_argument("--host-memory", metavar="SIZE",
                       help="host memory (RAM) of one node, e.g. 512GB, which its ranks share "
                       "while the model is set up (default: this machine's RAM)")


def _with_verdicts(report: dict[str, Any], given: str | None, world_size: int,
                   margin: float, host: tuple[str | None, int]) -> dict[str, Any]:
    """Each candidate's peak against a device, its setup against a node's host memory."""
    from flexgraph.training.estimate import device_memory, host_memory

    capacity, source = device_memory(given, world_size)
    report["device_memory"] = {"bytes": capacity, "source": source, "margin": margin}
    usable = capacity * (1 - margin)
    node, node_source = host_memory(host[0])
    per_node = host[1]
    report["host_memory"] = {"bytes": node, "source": node_source, "margin": margin,
                             "processes_per_node": per_node}
    for row in report["candidates"]:
        traced = row["parts"]["activations"] is not None
        row["fits"] = (row["peak_bytes"] <= usable) if traced else None
        setup = row["setup"]
        if setup is not None:
            setup["node_bytes"] = setup["rank0_bytes"] + (per_node - 1) * setup["other_bytes"]
            setup["fits"] = setup["node_bytes"] <= node * (1 - margin)
    return report


def _weights_loaded(cfg: Any) -> bool:
    """Whether the files the run loads set every weight (``init_weights`` may be pruned)."""
    from flexgraph.training.checkpoint import derive_from_weights
    from flexgraph.training.config import read_settings

    load_from = read_settings(cfg).weights_to_load()
    return bool(derive_from_weights(cfg, load_from, ("init_weights",)).rewrites)


def _per_node(given: int | None, world_size: int) -> int:
    return max(1, min(given or world_size, world_size))


def _config_candidate(strategy: Strategy, amp: str | None) -> Any:
    from flexgraph.training.estimate import Candidate

    return Candidate(label=strategy.name, strategy=strategy, amp=amp, name=strategy.name)


def estimate_report(spec: Any, strategy: Strategy | None, args: argparse.Namespace) -> dict:
    """The ``flexgraph.estimate/1`` dict for ``--estimate`` or ``--compare``."""
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

        candidates = [_config_candidate(strategy or get_strategy("single"), amp)]
    result = estimate(spec.cfg, candidates, world_size=world,
                      device=target_device(args.device_memory),
                      weights_loaded=_weights_loaded(spec.cfg))
    per_node = _per_node(args.nproc_per_node, world)
    return _with_verdicts(result.as_dict(), args.device_memory, world, AUTO_MARGIN,
                          (args.host_memory, per_node))


def choose_auto(spec: Any, world_size: int, device_memory: str | None,
                chosen: str | None = None, *, host_memory: str | None = None,
                per_node: int | None = None) -> tuple[Strategy, dict[str, Any], Any]:
    """``--strategy auto``: ``(strategy, report, candidate)``, the first candidate that fits.

    ``chosen`` is a launcher's choice, taken without estimating again.
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
    from flexgraph.training.estimate import (
        host_memory as node_memory_of,
    )

    amp = amp_precision(spec.cfg)
    if chosen:
        candidate = parse_candidate(chosen, spec.cfg.get("strategy"), amp)
        return candidate.strategy, {}, candidate
    candidates = parse_candidates(",".join(auto_candidates(world_size)),
                                  spec.cfg.get("strategy"), amp)
    result = estimate(spec.cfg, candidates, world_size=world_size,
                      device=target_device(device_memory),
                      weights_loaded=_weights_loaded(spec.cfg))
    capacity, _ = memory_of(device_memory, world_size)
    node, _ = node_memory_of(host_memory)
    per_node = _per_node(per_node, world_size)
    choice = choose_strategy(result, capacity, AUTO_MARGIN, host_memory=node,
                             processes_per_node=per_node)
    report = _with_verdicts(result.as_dict(), device_memory, world_size, AUTO_MARGIN,
                            (host_memory, per_node))
    report["auto"] = {"choice": choice.label, "reason": choice.reason}
    candidate = next(c for c in candidates if c.label == choice.label)
    return candidate.strategy, report, candidate


def run_estimate(spec: Any, strategy: Strategy | None, world_size: int,
                 device_memory: str | None, *, host_memory: str | None = None,
                 per_node: int | None = None) -> Any:
    """``run --estimate``: the plan's per-rank peak and its setup's, to measure against."""
    from flexgraph.training.output import RunEstimate

    args = argparse.Namespace(compare=None, world_size=world_size, device_memory=device_memory,
                              host_memory=host_memory, nproc_per_node=per_node)
    report = estimate_report(spec, strategy, args)
    return RunEstimate.from_report(report, report["candidates"][0]["candidate"])
