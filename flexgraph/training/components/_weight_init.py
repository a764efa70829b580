"""A model's own ``init_weights()``, with the failed copies MMEngine only logs made errors
(missing and unexpected keys stay warnings: a backbone's checkpoint has no head)."""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Iterator
from typing import Any

import attrs
from torch import nn

from flexgraph.training.errors import InitWeightsError

_FAILED_COPY = re.compile(r'While copying the parameter named "([^"]+)".*an exception occurred'
                          r' : \((.*)\)\.?$')


class _FailedCopies(logging.Handler):

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.failed: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        for line in str(record.getMessage()).splitlines():
            found = _FAILED_COPY.search(line)
            if found:
                self.failed.append((found.group(1), found.group(2).strip(" ,'\"")))


@contextlib.contextmanager
def _failed_copies() -> Iterator[_FailedCopies]:
    from mmengine.logging import MMLogger

    logger = MMLogger.get_current_instance()  # where MMEngine's print_log('current') goes
    handler = _FailedCopies()
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def _pretrained_modules(model: nn.Module) -> list[str]:
    found = []
    for name, module in model.named_modules():
        init_cfg: Any = getattr(module, "init_cfg", None)
        entries = init_cfg if isinstance(init_cfg, (list, tuple)) else [init_cfg]
        if any(isinstance(e, dict) and e.get("type") == "Pretrained" for e in entries):
            found.append(name or "model")  # the root: the config's own model
    return found


LoadPretrained = Callable[[nn.Module, str, "str | None"], None]
"""Loads a ``Pretrained`` initialiser's checkpoint: (module, checkpoint, prefix)."""


@contextlib.contextmanager
def _pretrained_loaded_by(load: LoadPretrained | None) -> Iterator[None]:
    """MMEngine's ``Pretrained`` initialiser, for the duration, loading through ``load``
    (URLs stay with MMEngine's loaders)."""
    if load is None:
        yield
        return
    from mmengine.model.weight_init import PretrainedInit, update_init_info
    from mmengine.registry import WEIGHT_INITIALIZERS

    class LoadedLikeLoadFrom(PretrainedInit):
        def __call__(self, module: nn.Module) -> None:
            if "://" in str(self.checkpoint):
                super().__call__(module)
                return
            from mmengine.logging import print_log

            where = "model" if self.prefix is None else f"{self.prefix} in model"
            print_log(f"load {where} from: {self.checkpoint}", logger="current")
            load(module, str(self.checkpoint), self.prefix)
            if hasattr(module, "_params_init_info"):
                update_init_info(module, init_info=self._get_init_info())

    original = WEIGHT_INITIALIZERS.get("Pretrained")
    WEIGHT_INITIALIZERS.register_module("Pretrained", module=LoadedLikeLoadFrom, force=True)
    try:
        yield
    finally:
        WEIGHT_INITIALIZERS.register_module("Pretrained", module=original, force=True)


def initialise(model: nn.Module, *, load_pretrained: LoadPretrained | None = None) -> None:
    """``model.init_weights()`` when it has one; raise if an initialiser failed.

    Parameters
    ----------
    model : torch.nn.Module
        Holding whole tensors, not shards.
    load_pretrained : callable, optional
        What a ``Pretrained`` ``init_cfg`` loads with; ``None`` keeps MMEngine's.

    Raises
    ------
    InitWeightsError
        A parameter's copy raised inside an initialiser.
    """
    if not callable(getattr(model, "init_weights", None)):
        return
    with _failed_copies() as copies, _pretrained_loaded_by(load_pretrained):
        model.init_weights()
    if copies.failed:
        name, error = copies.failed[0]
        modules = _pretrained_modules(model)
        where = f" of {', '.join(repr(m) for m in modules)}" if modules else ""
        raise InitWeightsError(
            f"init_weights: the init_cfg{where} could not set {len(copies.failed)} "
            f"parameters (e.g. {name!r}: {error}); MMEngine logs this and trains on the "
            f"previous values. Check the checkpoint against the model, or initialise the "
            f"model before it is sharded or cast")


def record_one_device_setup(cfg: Any, env: Any, *, load_pretrained: LoadPretrained | None = None,
                            whole: tuple[str, ...] = ()) -> Any:
    """``cfg.model`` built and initialised as one device does it, recorded without values.

    Parameters
    ----------
    cfg, env, load_pretrained
    whole : tuple of str
        Modules initialised on real parameters from the start (``''``: the model).

    Returns
    -------
    SetupRecord
    """
    from mmengine.logging import MMLogger

    from flexgraph.training.components._model import build_model_from_cfg
    from flexgraph.training.runtime import ReplayError, capture_rng, record_setup, restore_rng

    before = capture_rng()
    reasons: tuple[str, ...] = ()
    while True:
        try:
            record = record_setup(lambda: build_model_from_cfg(cfg, env),
                                  lambda model: initialise(model, load_pretrained=load_pretrained),
                                  whole=whole)[1]
            return attrs.evolve(record, reasons=reasons)
        except ReplayError as exc:
            if "" in whole or exc.module in whole:
                raise (exc.__cause__ or exc) from None  # real parameters fail too: the setup's
            restore_rng(before)
            where = f"{exc.module}'s init_weights" if exc.module else "the model's constructors"
            MMLogger.get_current_instance().warning(
                f"init_weights: {where} cannot run on parameters without values ({exc}); "
                f"{exc.module or 'the model'} is initialised whole on this rank")
            whole, reasons = ((("",), (str(exc),)) if not exc.module
                              else ((*whole, exc.module), (*reasons, str(exc))))
