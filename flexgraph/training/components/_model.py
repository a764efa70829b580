"""The model, built from ``cfg.model`` through MMEngine's ``MODELS`` registry.

The ``build_model`` step and the memory estimate (which builds the same model
on the meta device) both call :func:`build_model_from_cfg`, so the estimate
needs none of the loop's or the checkpoint's machinery to see the model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import torch
from mmengine.registry import MODELS
from torch import nn

from flexgraph.core.step import resolve_fn
from flexgraph.training.config import build_from_cfg, resolve_type, section
from flexgraph.training.errors import ConfigError
from flexgraph.training.runtime import parameters_on_meta

__all__ = ["build_model_from_cfg"]


def build_model_from_cfg(cfg: Any, env: Any, *, device: str | None = None,
                         init_context: str | None = None,
                         init_options: Mapping[str, Any] | None = None) -> nn.Module:
    """``cfg.model`` (with a top-level ``data_preprocessor`` as its default), built.

    The model's class is resolved (and its package imported) before any init
    context is entered.

    Parameters
    ----------
    cfg : Config or Mapping
        The run's config.
    env : Env
        This rank's environment, handed to ``init_context``.
    device : str, optional
        Build the parameters on this device (``'meta'``: no memory); the default
        device when ``None``.
    init_context : str, optional
        ``'module:function'`` of a context manager factory the model is built
        under (DeepSpeed's ``zero.Init``), called as
        ``factory(cfg=cfg, env=env, **init_options)``.
    init_options : Mapping, optional
        Keyword arguments for ``init_context``.

    Returns
    -------
    torch.nn.Module
        The model, not yet initialised (``init_weights`` is a later step).

    Raises
    ------
    ConfigError
        The config has no ``model``, or its type built something other than an
        ``nn.Module``.
    """
    model_cfg = section(cfg, "model")
    if model_cfg is None:
        raise ConfigError("the config has no 'model'; add model=dict(type=...)")
    preprocessor = section(cfg, "data_preprocessor")
    if preprocessor is not None and isinstance(model_cfg, Mapping):
        # MMEngine's Runner: a top-level data_preprocessor is the model's default one.
        model_cfg = dict(model_cfg)
        model_cfg.setdefault("data_preprocessor", preprocessor)
    if isinstance(model_cfg, Mapping) and "type" in model_cfg:
        # Resolve (and so import) the model's class before any init context is
        # entered: a registry imports its package on first use, and under
        # deepspeed.zero.Init that import would run with ZeRO's tensor
        # constructors patched in (mmpretrain's pulls in torch._dynamo, which fails).
        model_cfg = dict(model_cfg, type=resolve_type(model_cfg["type"], MODELS, what="model",
                                                      scope=model_cfg.get("_scope_")))
    with contextlib.ExitStack() as stack:
        if device == "meta":
            stack.enter_context(parameters_on_meta())
        elif device is not None:
            stack.enter_context(torch.device(device))
        if init_context is not None:
            factory = resolve_fn(init_context)
            stack.enter_context(factory(cfg=cfg, env=env, **dict(init_options or {})))
        model = build_from_cfg(model_cfg, MODELS, what="model")
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model: type built a {type(model).__name__}, not a torch nn.Module")
    return model
