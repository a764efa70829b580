"""The standard graph's contracts: cheap checks of the model after a setup step, each
returning ``None`` when it holds, else what is wrong and the fix."""

from __future__ import annotations

from typing import Any

from flexgraph.training.checkpoint import Checkpointer, local_checksums
from flexgraph.training.components import unwrap_model
from flexgraph.training.runtime import meta_parameters

__all__ = ["no_meta_parameters", "optimizer_holds_model", "weights_as_read"]


def no_meta_parameters(model: Any) -> str | None:
    """No parameter or buffer is left on the meta device (without storage)."""
    unmade = meta_parameters(unwrap_model(model))
    if not unmade:
        return None
    return (f"{len(unmade)} tensors of the model have no storage (on the meta device, e.g. "
            f"{unmade[0]!r}); fix: run the step that gives them storage (a strategy's "
            f"materialize, or build_model without device='meta') before this one")


def _optimizers(optim_wrapper: Any) -> list[Any]:
    wrappers = getattr(optim_wrapper, "optim_wrappers", None)  # OptimWrapperDict
    found = [w.optimizer for w in wrappers.values()] if wrappers else [optim_wrapper.optimizer]
    return [getattr(o, "optimizer", o) if not hasattr(o, "param_groups") else o for o in found]


def optimizer_holds_model(model: Any, optim_wrapper: Any) -> str | None:
    """The optimizer holds exactly the parameters the (wrapped) model trains."""
    params = dict(unwrap_model(model).named_parameters())
    held = {id(p) for o in _optimizers(optim_wrapper) for g in o.param_groups
            for p in g["params"]}
    ours = {id(p) for p in params.values()}
    strangers = len(held - ours)
    if strangers:
        return (f"the optimizer holds {strangers} tensors that are not the model's parameters "
                f"(copies made before the model was wrapped or sharded: they would train and "
                f"the model would not); fix: build the optimizer after the step that wraps "
                f"or shards the model")
    untrained = [n for n, p in params.items() if p.requires_grad and id(p) not in held]
    if untrained:
        return (f"{len(untrained)} trainable parameters are not in the optimizer (e.g. "
                f"{untrained[0]!r}), so they never train; fix: freeze them "
                f"(requires_grad=False) before the optimizer is built, or give them to it")
    return None


def weights_as_read(model: Any, checkpointer: Checkpointer) -> str | None:
    """The model's weights are what this rank read of ``load_from`` (their checksums)."""
    read = checkpointer.loaded.checksums if checkpointer.loaded is not None else {}
    if not read:
        return None
    now = local_checksums(unwrap_model(model), read)
    changed = [name for name, value in read.items()
               if not _close(now.get(name), value)]
    if not changed:
        return None
    return (f"{len(changed)} weights differ from what was read of the checkpoint (e.g. "
            f"{changed[0]!r}): the load went into tensors the model does not use (a copy, or "
            f"the model before it was wrapped), or something overwrote them; fix: load "
            f"through the run's checkpoint IO, into the model as this step holds it")


def _close(now: float | None, read: float) -> bool:
    return now is not None and abs(now - read) <= 1e-6 * max(1.0, abs(read))

