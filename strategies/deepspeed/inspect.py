"""What a DeepSpeed checkpoint directory holds, for ``flexgraph ckpt inspect``.

DeepSpeed's format is the DeepSpeed strategy's knowledge, so its inspector and
its opener live here and reach the training layer through the
``flexgraph.checkpoint_inspectors`` and ``flexgraph.checkpoint_openers`` entry
points (:data:`DEEPSPEED_INSPECTOR`, :func:`open_deepspeed_directory`), never
through an import from below.

A tag directory (``iter_40.ds/``) holds ``mp_rank_00_model_states.pt`` (under
ZeRO-3 one ``zero_pp_rank_<r>_mp_rank_00_model_states.pt`` per rank) with the
module's state, the parameters' shapes, DeepSpeed's config and flexgraph's
client state at the top level, and one ``*optim_states.pt`` per rank under
ZeRO. Describing opens only the model-states file (``mmap=True``,
``weights_only=True`` with the allow-list of DeepSpeed's own classes); the
optimizer files are counted, never read.

Reading the weights (``load_from`` under any strategy, ``flexgraph ckpt
convert``) goes through DeepSpeed's own ``zero_to_fp32``
(``get_fp32_state_dict_from_zero_checkpoint``, ``lazy_mode=True``), which
rebuilds the fp32 master weights from the optimizer files; every file is
first read the safe way, since the converter itself unpickles anything.
Memory: the optimizer files are memory-mapped; under ZeRO-3 each parameter is
gathered from its partitions when it is fetched (one tensor at a time), while
under ZeRO-1/2 DeepSpeed concatenates each parameter group's partitions first
(about the fp32 weights' size once, as DeepSpeed's own script needs).
Without ZeRO (stage 0) the weights are the model-states file's ``module``.
DeepSpeed's optimizer state is not converted: its universal-checkpoint
conversion writes DeepSpeed's own format, which only DeepSpeed reads.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from flexgraph.strategies.deepspeed.checkpoint import safe_globals

from flexgraph.training.checkpoint_tools import (
    CheckpointInspector,
    CheckpointSummary,
    state_parts,
)
from flexgraph.training.errors import CheckpointError
from flexgraph.training.formats import DEEPSPEED_DIRECTORY, CheckpointSource, weights_layout

__all__ = ["DEEPSPEED_INSPECTOR", "describe_deepspeed_directory", "open_deepspeed_directory"]

#: Keys of a model-states file that are DeepSpeed's own, neither state parts nor hook extras.
_ENGINE_KEYS = ("module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes",
                "shared_params", "frozen_param_fragments", "lr_scheduler", "data_sampler",
                "random_ltd", "sparse_tensor_module_names", "skipped_steps", "global_steps",
                "global_samples", "dp_world_size", "mp_world_size", "ds_config", "ds_version",
                "checkpoint_parallel_dimensions")


def _model_states_file(path: Path) -> Path:
    """``mp_rank_00_model_states.pt``, or under ZeRO-3 rank 0's own."""
    return min(path.glob("*model_states.pt"),
               key=lambda p: (p.name != "mp_rank_00_model_states.pt", p.name))


def _deepspeed_classes() -> list[Any]:
    """:func:`safe_globals`, importing DeepSpeed with its log lines sent to stderr.

    DeepSpeed's logger writes to the ``sys.stdout`` of its import, which is
    where ``--format json`` prints the summary.
    """
    with contextlib.redirect_stdout(sys.stderr):
        return safe_globals()


def _read(file: Path) -> dict[str, Any]:
    try:
        with torch.serialization.safe_globals(_deepspeed_classes()):
            state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise CheckpointError(f"DeepSpeed checkpoint file {str(file)!r} cannot be read: "
                              f"{first}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"DeepSpeed checkpoint file {str(file)!r} holds a "
                              f"{type(state).__name__}, not DeepSpeed's model states")
    return state


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
    """Describe a DeepSpeed tag directory (see the module docstring).

    Parameters
    ----------
    path:
        A directory holding ``*model_states.pt``.

    Returns
    -------
    CheckpointSummary

    Raises
    ------
    CheckpointError
        Its model-states file cannot be read, or holds something else.
    """
    state = _read(_model_states_file(path))
    stage = _zero_stage(state)
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


def _zero_stage(state: Mapping[str, Any]) -> int:
    config = state.get("ds_config") if isinstance(state.get("ds_config"), Mapping) else {}
    return int((config.get("zero_optimization") or {}).get("stage", 0) or 0)


def _fp32_weights(path: Path) -> dict[str, Any]:
    """``zero_to_fp32``'s weights (lazy: partitions gathered on ``.contiguous()``), read safely."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    for file in sorted(path.glob("*.pt")):
        _read(file)  # refuses a file holding anything a DeepSpeed checkpoint never holds
    with contextlib.redirect_stdout(sys.stderr):  # its progress lines, not on stdout
        try:
            return dict(get_fp32_state_dict_from_zero_checkpoint(
                str(path.parent), tag=path.name, lazy_mode=True))
        except (ValueError, FileNotFoundError, KeyError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise CheckpointError(f"DeepSpeed checkpoint {str(path)!r} cannot be converted to "
                                  f"weights by DeepSpeed's zero_to_fp32: {first}") from None


def open_deepspeed_directory(path: Path) -> CheckpointSource:
    """A DeepSpeed tag's weights as ``{'state_dict': ...}`` (see the module docstring).

    Parameters
    ----------
    path:
        A directory holding ``*model_states.pt``.

    Returns
    -------
    CheckpointSource

    Raises
    ------
    CheckpointError
        A file cannot be read or holds what DeepSpeed never writes, or
        DeepSpeed's converter refuses the directory (a rank's files missing).
    """
    state = _read(_model_states_file(path))
    if _zero_stage(state) == 0:
        module = state.get("module")
        if not isinstance(module, Mapping) or not module:
            raise CheckpointError(f"DeepSpeed checkpoint {str(path)!r} has no module weights")
        weights: dict[str, Any] = dict(module)
    else:
        weights = _fp32_weights(path)
    layout = weights_layout({k: torch.empty(tuple(v.shape), dtype=v.dtype, device="meta")
                             for k, v in weights.items()})
    stored = {k.removeprefix("module."): k for k in weights}

    def fetch(key: tuple[Any, ...]) -> torch.Tensor:
        value = weights[stored[key[-1]]]
        return value if isinstance(value, torch.Tensor) else value.contiguous()

    return CheckpointSource(path, DEEPSPEED_DIRECTORY.name, layout, fetch,
                            note="optimizer: DeepSpeed's own partitions are not converted "
                                 "(weights only, as DeepSpeed's zero_to_fp32 gives them)")


DEEPSPEED_INSPECTOR = CheckpointInspector(DEEPSPEED_DIRECTORY, describe_deepspeed_directory)
"""The ``flexgraph.checkpoint_inspectors`` entry point of DeepSpeed's directories."""
