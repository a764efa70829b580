"""The model, built from ``cfg.model`` through MMEngine's ``MODELS`` registry."""

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


def build_model_from_cfg(cfg: Any, env: Any, *, device: str | None = None,
                         init_context: str | None = None,
                         init_options: Mapping[str, Any] | None = None) -> nn.Module:
    """``cfg.model`` (a top-level ``data_preprocessor`` its default), built, not yet initialised.

    Parameters
    ----------
    cfg, env
    device : str, optional
        Where the parameters are made (``'meta'``: no memory).
    init_context, init_options : str, Mapping, optional
        ``'module:function'`` of a context manager factory the model is built
        under (DeepSpeed's ``zero.Init``), and its keyword arguments.

    Returns
    -------
    torch.nn.Module
    """
    model_cfg = section(cfg, "model")
    if model_cfg is None:
        raise ConfigError("the config has no 'model'; add model=dict(type=...)")
    preprocessor = section(cfg, "data_preprocessor")
    if preprocessor is not None and isinstance(model_cfg, Mapping):
        model_cfg = dict(model_cfg)
        model_cfg.setdefault("data_preprocessor", preprocessor)
    if isinstance(model_cfg, Mapping) and "type" in model_cfg:
        # Import the model's package before any init context: under deepspeed.zero.Init
        # the import would run with ZeRO's tensor constructors patched in, and can fail.
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
