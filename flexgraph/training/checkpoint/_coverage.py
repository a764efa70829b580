"""Whether the weights a run loads (``load_from``, ``Pretrained``) cover its model, so that
``init_weights`` can be pruned; only the files' indexes are read."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch
from torch import nn

from flexgraph.core.rewrite import Configure, Prune, Rewrite
from flexgraph.training.config import is_pretrained, names_pretrained
from flexgraph.training.errors import CheckpointError
from flexgraph.training.formats import weights_index

LOAD_FROM = "load_from"
PRETRAINED = "init_cfg Pretrained"
_SHOWN = 5


@attrs.frozen
class WeightSource:
    """One file whose weights the run loads; ``module``: the submodule whose ``init_cfg``
    names it (``''``: the model)."""

    path: str
    origin: str = LOAD_FROM
    module: str = ""
    prefix: str | None = None

    def file_key(self, model_key: str) -> str | None:
        """The name ``model_key`` has in the file, or ``None`` when the file does not set it."""
        if self.module:
            if not model_key.startswith(self.module + "."):
                return None
            model_key = model_key[len(self.module) + 1:]
        if self.prefix:
            return self.prefix.removesuffix(".") + "." + model_key
        return model_key

    def describe(self) -> str:
        where = f" of {self.module}" if self.module else ""
        prefix = f" (prefix {self.prefix!r})" if self.prefix else ""
        return f"{self.origin} {self.path!r}{where}{prefix}"

    def as_params(self) -> dict[str, Any]:
        """The source as a ``pretrained`` entry of the ``load_checkpoint`` step."""
        return {"path": self.path, "module": self.module, "prefix": self.prefix}

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> WeightSource:
        return cls(path=str(params["path"]), origin=PRETRAINED,
                   module=str(params.get("module") or ""), prefix=params.get("prefix"))


@attrs.frozen
class Coverage:
    """Which entries of a model's ``state_dict`` the loaded files set, and which file last."""

    entries: tuple[str, ...]
    set_by: Mapping[str, WeightSource]
    sources: tuple[WeightSource, ...]
    unreadable: tuple[str, ...] = ()
    reshaped: tuple[str, ...] = ()

    @property
    def uncovered(self) -> tuple[str, ...]:
        return tuple(e for e in self.entries if e not in self.set_by)

    @property
    def covered(self) -> bool:
        """Whether every entry comes from a file whose index could be read."""
        return not self.unreadable and not self.uncovered

    @property
    def needed(self) -> tuple[WeightSource, ...]:
        """The sources that set an entry's final value, in load order."""
        used = set(self.set_by.values())
        return tuple(s for s in self.sources if s in used)

    def reason(self) -> str:
        return "every state_dict entry comes from " + " and ".join(
            s.describe() for s in self.needed)

    def missing(self) -> str:
        """Why ``init_weights`` stays."""
        if self.unreadable:
            return "; ".join(self.unreadable)
        left = self.uncovered
        names = ", ".join(left[:_SHOWN]) + (f" and {len(left) - _SHOWN} more"
                                            if len(left) > _SHOWN else "")
        files = ", ".join(s.describe() for s in self.sources)
        shapes = (f" ({len(self.reshaped)} held under another shape)" if self.reshaped
                  else "")
        return (f"{files} leave{'s' if len(self.sources) == 1 else ''} {len(left)} of "
                f"{len(self.entries)} state_dict entries to init_weights{shapes}: {names}")


def pretrained_sources(model: nn.Module) -> list[WeightSource]:
    """The ``Pretrained`` initialisers ``model.init_weights()`` would run, inner ones first."""
    found: list[WeightSource] = []

    def visit(module: nn.Module, name: str) -> None:
        for child_name, child in module.named_children():
            if callable(getattr(child, "init_weights", None)):
                visit(child, f"{name}.{child_name}" if name else child_name)
        init_cfg = getattr(module, "init_cfg", None)
        for entry in init_cfg if isinstance(init_cfg, (list, tuple)) else [init_cfg]:
            if is_pretrained(entry):
                found.append(WeightSource(path=str(entry.get("checkpoint")), origin=PRETRAINED,
                                          module=name, prefix=entry.get("prefix")))

    if callable(getattr(model, "init_weights", None)):
        visit(model, "")
    return found


def _unreadable(source: WeightSource) -> str | None:
    if "://" in source.path:
        return (f"{source.describe()} is a URL, which MMEngine downloads when init_weights "
                f"runs")
    if not Path(source.path).exists():
        return f"{source.describe()} does not exist (the load will say so)"
    return None


def weights_coverage(model: nn.Module, sources: Sequence[WeightSource]) -> Coverage:
    """Which entries of ``model``'s ``state_dict`` ``sources`` set, from their indexes alone."""
    shapes = {k: tuple(v.shape) for k, v in model.state_dict(keep_vars=True).items()}
    set_by: dict[str, WeightSource] = {}
    reshaped: set[str] = set()
    unreadable = []
    for source in sources:
        problem = _unreadable(source)
        index = None
        if problem is None:
            try:
                index = weights_index(source.path)
            except CheckpointError as exc:
                problem = f"{source.describe()}: {exc}"
        if index is None:
            unreadable.append(problem or f"{source.describe()} is in a format whose weights "
                                         f"cannot be listed without reading them")
            continue
        for key, shape in shapes.items():
            held = index.weights.get(source.file_key(key) or "")
            if held is None:
                continue
            if held[0] == shape:
                set_by[key] = source
                reshaped.discard(key)
            elif key not in set_by:
                reshaped.add(key)
    return Coverage(entries=tuple(shapes), set_by=set_by, sources=tuple(sources),
                    unreadable=tuple(unreadable), reshaped=tuple(sorted(reshaped)))


def _meta_model(cfg: Any) -> nn.Module:
    from flexgraph.training.components import build_model_from_cfg
    from flexgraph.training.runtime import use_default_scope

    use_default_scope(cfg)
    with torch.device("meta"):
        return build_model_from_cfg(cfg, env=None)


@attrs.frozen
class WeightsDerivation:
    """What the run's weight files change in its plan (``coverage=None``: nothing looked at)."""

    rewrites: tuple[Rewrite, ...] = ()
    notes: Mapping[str, str] = attrs.field(factory=dict)
    coverage: Coverage | None = None


def derive_from_weights(cfg: Any, load_from: str | None, prunable: Sequence[str]
                        ) -> WeightsDerivation:
    """Prune ``init_weights`` when the files the run loads cover the model.

    Parameters
    ----------
    cfg
    load_from
        What ``load_checkpoint`` loads, or ``None``.
    prunable
        The strategy's :attr:`~flexgraph.core.strategy.Strategy.prunable`.

    Returns
    -------
    WeightsDerivation
    """
    if "init_weights" not in prunable or not (load_from or names_pretrained(cfg)):
        return WeightsDerivation()
    try:
        model = _meta_model(cfg)
    except Exception as exc:  # the build step reports it properly, with the config's culprit
        why = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
        return WeightsDerivation(notes={"init_weights": (
            f"kept: the model could not be built on the meta device to list its weights "
            f"({type(exc).__name__}: {why})")})
    sources = pretrained_sources(model) + ([WeightSource(load_from)] if load_from else [])
    if not sources:
        return WeightsDerivation()
    coverage = weights_coverage(model, sources)
    if not coverage.covered:
        return WeightsDerivation(notes={"init_weights": f"kept: {coverage.missing()}"},
                                 coverage=coverage)
    rewrites: list[Rewrite] = [Prune("init_weights", coverage.reason())]
    pretrained = [s.as_params() for s in coverage.needed if s.origin == PRETRAINED]
    if pretrained:
        rewrites.append(Configure("load_checkpoint", {"pretrained": pretrained}))
    return WeightsDerivation(rewrites=tuple(rewrites), coverage=coverage)
