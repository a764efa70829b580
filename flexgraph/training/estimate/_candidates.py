"""``NAME[:STAGE][:PRECISION]``: the strategies an estimate compares; what a stage or
precision means is the strategy's memory model's to say (``candidate_options``)."""

from __future__ import annotations

from collections.abc import Mapping
from importlib import import_module
from typing import Any

import attrs

from flexgraph.core.strategy import Strategy, get_strategy, same_strategy

from ._parts import CandidateError

PRECISIONS = ("fp32", "fp16", "bf16")


@attrs.frozen
class Candidate:
    """One strategy to estimate: its label, the strategy it builds, the AMP precision.

    Parameters
    ----------
    label, name : str
        The candidate as written; the strategy's registry name.
    strategy : Strategy
    amp : str or None
        The AMP precision it computes in; ``None`` for fp32.
    options : Mapping, default {}
        The strategy's options (``--strategy auto`` hands them to the run).
    """

    label: str
    strategy: Strategy
    amp: str | None
    name: str
    options: Mapping[str, Any] = attrs.field(factory=dict)


def memory_module(strategy: Strategy) -> Any:
    if not strategy.memory_model:
        raise CandidateError(f"strategy {strategy.name!r} has no memory model; "
                             f"it cannot be estimated")
    return import_module(strategy.memory_model)


def _base_options(name: str, config_strategy: Any) -> dict[str, Any]:
    if isinstance(config_strategy, Mapping) and same_strategy(name, config_strategy["type"]):
        return {k: v for k, v in config_strategy.items() if k != "type"}
    return {}


def parse_candidate(text: str, config_strategy: Any, amp: str | None) -> Candidate:
    """One candidate from its text, ``NAME[:STAGE][:PRECISION]``.

    Parameters
    ----------
    text : str
    config_strategy : Any
        The config's ``strategy``, whose options a candidate of the same strategy starts from.
    amp : str or None
        The config's AMP precision, kept without a PRECISION.

    Returns
    -------
    Candidate

    Raises
    ------
    CandidateError
        The text is malformed, or the strategy has no memory model or refuses the stage.
    UnknownStrategyError
        No strategy of that name is registered.
    """
    name, *rest = text.strip().split(":")
    precision = rest.pop() if rest and rest[-1] in PRECISIONS else None
    if len(rest) > 1:
        raise CandidateError(f"candidate {text!r}: write NAME[:STAGE][:PRECISION], "
                             f"PRECISION one of {', '.join(PRECISIONS)}")
    stage = rest[0] if rest else None
    base = get_strategy(name)
    module = memory_module(base)
    options = module.candidate_options(_base_options(name, config_strategy), stage,
                                       precision or amp)
    strategy = get_strategy(name, **options)
    chosen = amp if precision is None else (None if precision == "fp32" else precision)
    return Candidate(label=text.strip(), strategy=strategy, amp=chosen, name=name,
                     options=options)


def parse_candidates(text: str, config_strategy: Any, amp: str | None) -> list[Candidate]:
    """``ddp,deepspeed:zero1:fp16,...`` as :class:`Candidate` values, in order.

    Parameters
    ----------
    text, config_strategy, amp
        As :func:`parse_candidate` takes them.

    Returns
    -------
    list of Candidate
    """
    labels = [part for part in text.split(",") if part.strip()]
    if not labels:
        raise CandidateError("--compare needs at least one NAME[:STAGE][:PRECISION]")
    return [parse_candidate(label, config_strategy, amp) for label in labels]
