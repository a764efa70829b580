"""The DeepSpeed strategy's checkpoints: DeepSpeed's own format, read safely.

DeepSpeed unpickles every file (``weights_only=False``); here each is read with
``weights_only=True`` and an allow-list of DeepSpeed's own classes. The weights of a
directory come from DeepSpeed's ``zero_to_fp32``; its optimizer state is not converted.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from flexgraph.strategies.deepspeed.engine import EngineModel
from flexgraph.strategies.deepspeed.partitions import PARTITIONS

from flexgraph.training.checkpoint import (
    CheckpointIO,
    OnRead,
    WeightsLoaded,
    apply_weights,
    load_into_slices,
    tensor_bytes,
)
from flexgraph.training.errors import CheckpointError
from flexgraph.training.formats import (
    DCP_DIRECTORY,
    DEEPSPEED_DIRECTORY,
    SAFETENSORS_FILE,
    TORCH_SAVE_FILE,
    CheckpointFormat,
    CheckpointSource,
    read_any_checkpoint,
    weights_layout,
)
from flexgraph.training.runtime import world_size

__all__ = [
    "DeepSpeedCheckpointIO",
    "model_states_file",
    "open_deepspeed_directory",
    "read_deepspeed_file",
    "safe_checkpoint_engine",
    "safe_globals",
    "zero_stage",
]


def safe_globals() -> list[Any]:
    """The non-tensor classes DeepSpeed's own checkpoints hold, and nothing else."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


_SAFE_ENGINES: dict[type, type] = {}


def safe_checkpoint_engine(engine: Any) -> None:
    """Make ``engine``'s ``TorchCheckpointEngine`` load with ``weights_only=True``.

    A checkpoint engine the user configured (decoupled, NVMe) is left alone.
    """
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import (
        TorchCheckpointEngine,
    )

    original = engine.checkpoint_engine
    if type(original) is not TorchCheckpointEngine:
        return
    if TorchCheckpointEngine not in _SAFE_ENGINES:
        _SAFE_ENGINES[TorchCheckpointEngine] = type(
            "SafeTorchCheckpointEngine", (TorchCheckpointEngine,), {"load": _safe_load})
    original.__class__ = _SAFE_ENGINES[TorchCheckpointEngine]


def _safe_load(self: Any, path: str, map_location: Any = None) -> Any:
    import pickle

    from flexgraph.training.errors import UnsafeCheckpointError

    try:
        with torch.serialization.safe_globals(safe_globals()):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        detail = next((line.strip() for line in str(exc).splitlines()
                       if "GLOBAL" in line or "Unsupported" in line), "")
        raise UnsafeCheckpointError(
            f"refused to load {path!r}: it holds objects a DeepSpeed checkpoint never "
            f"holds. {detail}") from None


class DeepSpeedCheckpointIO(CheckpointIO):
    """DeepSpeed's own directories (``iter_40.ds/``), the loop state in its ``client_state``."""

    suffix = ".ds"
    format = DEEPSPEED_DIRECTORY
    weight_formats = (TORCH_SAVE_FILE, DEEPSPEED_DIRECTORY, SAFETENSORS_FILE, DCP_DIRECTORY)

    def __init__(self, exclude_frozen_parameters: bool = False) -> None:
        self.exclude_frozen_parameters = bool(exclude_frozen_parameters)

    def states(self, model: Any, optim_wrapper: Any) -> dict[str, Any]:
        return {}

    def write(self, checkpoint: dict[str, Any], path: Path, *, model: Any = None,
              optim_wrapper: Any = None) -> None:
        model.engine.save_checkpoint(str(path.parent), tag=path.name, client_state=checkpoint,
                                     save_latest=False,
                                     exclude_frozen_parameters=self.exclude_frozen_parameters)

    def size_needed(self, checkpoint: dict[str, Any], *, model: Any = None,
                    optim_wrapper: Any = None) -> int:
        """The engine's whole weights and every rank's optimizer partition."""
        engine = model.engine
        weights = sum(int(getattr(p, "ds_numel", p.numel())) * p.element_size()
                      for p in engine.module.parameters())
        optimizer = engine.optimizer
        state = getattr(getattr(optimizer, "optimizer", optimizer), "state", {})
        masters = (getattr(optimizer, "single_partition_of_fp32_groups", None)  # ZeRO-1/2
                   or getattr(optimizer, "fp32_partitioned_groups_flat", None) or [])  # ZeRO-3
        partition = tensor_bytes(list(state.values())) + tensor_bytes(list(masters))
        return tensor_bytes(checkpoint) + weights + partition * world_size()

    def read(self, path: Path, *, model: Any = None, optim_wrapper: Any = None) -> dict[str, Any]:
        if not self.is_complete(path):
            raise CheckpointError(f"{str(path)!r} is not a complete DeepSpeed checkpoint "
                                  f"directory (no *model_states.pt); was its save interrupted?")
        engine = model.engine
        loaded, client_state = engine.load_checkpoint(
            str(path.parent), tag=path.name, load_optimizer_states=True,
            load_lr_scheduler_states=engine.lr_scheduler is not None)
        if loaded is None:
            raise CheckpointError(f"DeepSpeed could not load {str(path)!r}")
        return dict(client_state or {})

    def apply(self, checkpoint: dict[str, Any], path: Path, *, model: Any, optim_wrapper: Any,
              strict: bool = True) -> None:
        """Nothing left to do: the engine loaded its state in :meth:`read`."""

    def load_weights(self, path: Path, model: Any, *, held: CheckpointFormat,
                     on_read: OnRead) -> WeightsLoaded:
        """``load_from`` into the engine, or, before it exists (ZeRO-3), into the partitions."""
        if not isinstance(model, EngineModel):
            return load_into_slices(path, held, model, PARTITIONS, on_read=on_read)
        return _load_weights_into_engine(model, path, held, on_read)

    def is_complete(self, path: Path) -> bool:
        return path.is_dir() and any(p.stat().st_size for p in path.glob("*model_states.pt"))


def _refresh_master_weights(engine: Any) -> None:
    """Copy freshly loaded weights into the optimizer's fp32 master copies (ZeRO, fp16)."""
    refresh = getattr(engine.optimizer, "refresh_fp32_params", None)
    if callable(refresh):
        refresh()


def _load_weights_into_engine(model: EngineModel, path: Path, held: CheckpointFormat,
                              on_read: OnRead) -> WeightsLoaded:
    """``load_from`` into a running engine, then its master copies refreshed from the weights."""
    engine = model.engine
    partitioned = engine.zero_optimization_partition_weights()
    if partitioned:
        loaded = load_into_slices(path, held, model.module, PARTITIONS, on_read=on_read)
        _refresh_master_weights(engine)
        return loaded
    if held is DEEPSPEED_DIRECTORY:
        _, client_state = engine.load_checkpoint(
            str(path.parent), tag=path.name, load_module_strict=False,
            load_optimizer_states=False, load_lr_scheduler_states=False,
            load_module_only=True)
        on_read({"meta": dict((client_state or {}).get("meta") or {}), "state_dict": {}})
        _refresh_master_weights(engine)
        return WeightsLoaded()
    checkpoint = read_any_checkpoint(path, held=held)
    on_read(checkpoint)
    loaded = apply_weights(model.module, checkpoint, str(path), strict=False)
    _refresh_master_weights(engine)
    return loaded


def model_states_file(path: Path) -> Path:
    """A tag directory's ``mp_rank_00_model_states.pt`` (ZeRO-3: rank 0's own)."""
    return min(path.glob("*model_states.pt"),
               key=lambda p: (p.name != "mp_rank_00_model_states.pt", p.name))


def _deepspeed_classes() -> list[Any]:
    """:func:`safe_globals`, DeepSpeed's import lines on stderr (``--format json`` owns stdout)."""
    with contextlib.redirect_stdout(sys.stderr):
        return safe_globals()


def read_deepspeed_file(file: Path) -> dict[str, Any]:
    """One DeepSpeed checkpoint file as a dict, read memory-mapped with ``weights_only=True``."""
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


def zero_stage(state: Mapping[str, Any]) -> int:
    """The ZeRO stage a model-states file's DeepSpeed config names (0 without ZeRO)."""
    config = state.get("ds_config") if isinstance(state.get("ds_config"), Mapping) else {}
    return int((config.get("zero_optimization") or {}).get("stage", 0) or 0)


def _fp32_weights(path: Path) -> dict[str, Any]:
    """``zero_to_fp32``'s weights (lazy: partitions gathered on ``.contiguous()``), read safely."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    for file in sorted(path.glob("*.pt")):
        read_deepspeed_file(file)  # refuses what a DeepSpeed checkpoint never holds
    with contextlib.redirect_stdout(sys.stderr):  # its progress lines, not on stdout
        try:
            return dict(get_fp32_state_dict_from_zero_checkpoint(
                str(path.parent), tag=path.name, lazy_mode=True))
        except (ValueError, FileNotFoundError, KeyError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise CheckpointError(f"DeepSpeed checkpoint {str(path)!r} cannot be converted to "
                                  f"weights by DeepSpeed's zero_to_fp32: {first}") from None


def open_deepspeed_directory(path: Path) -> CheckpointSource:
    """A DeepSpeed tag directory's fp32 weights as a lazy ``{'state_dict': ...}`` source."""
    state = read_deepspeed_file(model_states_file(path))
    if zero_stage(state) == 0:
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
