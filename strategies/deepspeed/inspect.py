"""What a DeepSpeed checkpoint directory holds, for ``flexgraph ckpt inspect``.

Reached through the ``flexgraph.checkpoint_inspectors`` entry point, never imported from
below. It reads only the model-states file; the ``*optim_states.pt`` files are counted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from flexgraph.strategies.deepspeed.checkpoint import (
    model_states_file,
    read_deepspeed_file,
    zero_stage,
)

from flexgraph.training.checkpoint_tools import (
    CheckpointInspector,
    CheckpointSummary,
    state_parts,
)
from flexgraph.training.formats import DEEPSPEED_DIRECTORY

__all__ = ["DEEPSPEED_INSPECTOR", "describe_deepspeed_directory"]

#: a model-states file's own keys, neither state parts nor hook extras
_ENGINE_KEYS = ("module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes",
                "shared_params", "frozen_param_fragments", "lr_scheduler", "data_sampler",
                "random_ltd", "sparse_tensor_module_names", "skipped_steps", "global_steps",
                "global_samples", "dp_world_size", "mp_world_size", "ds_config", "ds_version",
                "checkpoint_parallel_dimensions")


def _model_tensors(state: Mapping[str, Any]) -> tuple[int, dict[str, int]]:
    """Elements of the parameters (from ``param_shapes``, whole even under ZeRO-3) and buffers."""
    module = state.get("module") or {}
    shapes: dict[str, Any] = {}
    for group in state.get("param_shapes") or []:
        shapes.update(group)
    for name in state.get("buffer_names") or []:
        if isinstance(module.get(name), torch.Tensor):
            shapes.setdefault(name, module[name].shape)
    if not shapes:
        shapes = {k: v.shape for k, v in module.items() if isinstance(v, torch.Tensor)}
    per_dtype: dict[str, int] = {}
    for name, shape in shapes.items():
        tensor = module.get(name)
        dtype = str(tensor.dtype).removeprefix("torch.") if isinstance(tensor, torch.Tensor) \
            else "unknown"
        per_dtype[dtype] = per_dtype.get(dtype, 0) + math.prod(shape)
    return sum(per_dtype.values()), per_dtype


def describe_deepspeed_directory(path: Path) -> CheckpointSummary:
    """Describe a DeepSpeed tag directory."""
    state = read_deepspeed_file(model_states_file(path))
    stage = zero_stage(state)
    ranks = int(state.get("dp_world_size") or 1)
    optim_files = len(list(path.glob("*optim_states.pt")))
    problem = None
    if any(p.stat().st_size == 0 for p in path.glob("*.pt")):
        problem = f"DeepSpeed checkpoint {str(path)!r} has empty files (its save was interrupted?)"
    elif stage > 0 and optim_files < ranks:
        problem = (f"DeepSpeed checkpoint {str(path)!r} has {optim_files} optimizer files for "
                   f"{ranks} ranks (its save was interrupted?)")
    meta = state.get("meta") if isinstance(state.get("meta"), Mapping) else {}
    parts, extras = state_parts(state, engine_keys=_ENGINE_KEYS)
    parts = ("model", *(["optimizer"] if optim_files or state.get("optimizer") else []),
             *(["lr scheduler (DeepSpeed's)"] if state.get("lr_scheduler") else []),
             *(p for p in parts if p not in ("model", "optimizer")))
    parameters, dtypes = _model_tensors(state)
    versions = {k: str(meta[k]) for k in ("flexgraph_version", "torch_version") if meta.get(k)}
    if state.get("ds_version"):
        versions["ds_version"] = str(state["ds_version"])
    writer = f"DeepSpeed ZeRO-{stage}"
    writer = f"flexgraph, {writer}" if "flexgraph_version" in meta else writer
    return CheckpointSummary(
        str(path), DEEPSPEED_DIRECTORY.name, writer, problem is None, problem,
        world_size=int(meta.get("world_size") or ranks),
        epoch=meta.get("epoch") if isinstance(meta.get("epoch"), int) else None,
        iteration=meta.get("iter") if isinstance(meta.get("iter"), int) else None,
        parameters=parameters, dtypes=dtypes, contents=parts, extras=extras,
        versions=versions)


DEEPSPEED_INSPECTOR = CheckpointInspector(DEEPSPEED_DIRECTORY, describe_deepspeed_directory)
