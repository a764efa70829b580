"""The DeepSpeed strategy's checkpoints: DeepSpeed's own format, read safely.

* :class:`DeepSpeedCheckpointIO`: DeepSpeed's ``save_checkpoint`` /
  ``load_checkpoint`` (every rank writes its partition), with flexgraph's loop
  position, schedulers, RNG states and hook extras in the client state.
* :func:`safe_checkpoint_engine`: DeepSpeed reads every checkpoint file with
  ``torch.load(weights_only=False)``; the engine's checkpoint engine is made to
  load with ``weights_only=True`` and an allow-list of the classes DeepSpeed
  itself writes.
* :func:`load_weights_into_engine`: ``load_from`` (a full file, or a DeepSpeed
  checkpoint directory) into a running engine; under ZeRO-3 without any rank
  but rank 0 holding the whole model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from flexgraph.strategies.deepspeed_engine import EngineModel

from flexgraph.training.checkpoint import CheckpointIO, rank_of
from flexgraph.training.errors import CheckpointError

__all__ = ["DeepSpeedCheckpointIO", "load_weights_into_engine", "safe_checkpoint_engine"]


def _safe_globals() -> list[Any]:
    """The non-tensor classes DeepSpeed's own checkpoints hold, and nothing else."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


_SAFE_ENGINES: dict[type, type] = {}


def safe_checkpoint_engine(engine: Any) -> None:
    """Make ``engine``'s checkpoint engine load with ``weights_only=True``.

    DeepSpeed's ``TorchCheckpointEngine`` reads every file of a checkpoint with
    ``torch.load(weights_only=False)``, so a crafted checkpoint could run code.
    The engine's instance gets a subclass whose ``load`` admits tensors, plain
    containers and the few DeepSpeed classes its checkpoints hold. A checkpoint
    engine the user configured (a decoupled or NVMe one) is left alone.
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
        with torch.serialization.safe_globals(_safe_globals()):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        detail = next((line.strip() for line in str(exc).splitlines()
                       if "GLOBAL" in line or "Unsupported" in line), "")
        raise UnsafeCheckpointError(
            f"refused to load {path!r}: it holds objects a DeepSpeed checkpoint never "
            f"holds. {detail}") from None


class DeepSpeedCheckpointIO(CheckpointIO):
    """DeepSpeed's own checkpoint directories (``iter_40.ds/``), every rank writing.

    The checkpoint dict (loop position, schedulers, RNG states, hook extras)
    travels in DeepSpeed's ``client_state``; the engine writes the weights and
    the optimizer partitions itself, so the dict has no ``state_dict`` or
    ``optimizer`` entry.
    """

    suffix = ".ds"

    def __init__(self, exclude_frozen_parameters: bool = False) -> None:
        self.exclude_frozen_parameters = bool(exclude_frozen_parameters)

    def states(self, model: Any, optim_wrapper: Any) -> dict[str, Any]:
        return {}

    def write(self, checkpoint: dict[str, Any], path: Path, *, model: Any = None,
              optim_wrapper: Any = None) -> None:
        model.engine.save_checkpoint(str(path.parent), tag=path.name, client_state=checkpoint,
                                     save_latest=False,
                                     exclude_frozen_parameters=self.exclude_frozen_parameters)

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

    def is_complete(self, path: Path) -> bool:
        return path.is_dir() and any(p.stat().st_size for p in path.glob("*model_states.pt"))


def _refresh_master_weights(engine: Any) -> None:
    """Copy freshly loaded weights into the optimizer's fp32 master copies (ZeRO, fp16)."""
    refresh = getattr(engine.optimizer, "refresh_fp32_params", None)
    if callable(refresh):
        refresh()


def _read_full_file(path: Path) -> tuple[Any, dict[str, torch.Tensor]]:
    from flexgraph.training.checkpoint import read_checkpoint_file, weights_in

    checkpoint = read_checkpoint_file(path)
    weights = {k.removeprefix("module."): v for k, v in weights_in(checkpoint, str(path)).items()}
    return checkpoint, weights


def _read_deepspeed_dir(path: Path) -> tuple[Any, dict[str, torch.Tensor]]:
    """A DeepSpeed checkpoint's full fp32 weights, with DeepSpeed's own converter.

    The converter reads with ``weights_only=False``, so every file is first read
    the safe way; a file holding anything else is refused before it runs.
    """
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    for file in sorted(path.glob("*.pt")):
        _safe_load(None, str(file), map_location="cpu")
    weights = get_fp32_state_dict_from_zero_checkpoint(str(path.parent), tag=path.name)
    return {"meta": {}}, dict(weights)


def _on_rank0(read: Any, path: Path) -> tuple[Any, dict[str, torch.Tensor]]:
    """``read(path)`` on rank 0 (the others get nothing); an error reaches every rank."""
    checkpoint, weights, error = None, {}, None
    if rank_of() == 0:
        try:
            checkpoint, weights = read(path)
        except Exception as exc:  # the other ranks must learn it, or they wait forever
            error = exc
    box = [error]
    torch.distributed.broadcast_object_list(box, src=0)
    if box[0] is not None:
        raise box[0]
    return checkpoint, weights


def _load_partitioned(module: torch.nn.Module, path: Path, weights: dict[str, torch.Tensor]
                      ) -> list[str]:
    """Rank 0's ``weights`` into ZeRO-3 partitions, one module's parameters gathered at a time."""
    import deepspeed

    names = [n for n, _ in module.named_parameters()] + [n for n, _ in module.named_buffers()]
    box = [[n for n in names if n not in weights] if rank_of() == 0 else None]
    torch.distributed.broadcast_object_list(box, src=0)
    missing = box[0]
    if len(missing) == len(names):
        raise CheckpointError(f"none of the weights in {str(path)!r} match a parameter of "
                              f"{type(module).__name__}; is it the right checkpoint?")
    for prefix, sub in module.named_modules():
        own = list(sub.named_parameters(recurse=False))
        if own:
            with deepspeed.zero.GatheredParameters([p for _, p in own], modifier_rank=0), \
                    torch.no_grad():
                for name, param in own:
                    key = f"{prefix}.{name}" if prefix else name
                    if rank_of() == 0 and key in weights:
                        param.copy_(weights[key])
        for name, buffer in sub.named_buffers(recurse=False):
            key = f"{prefix}.{name}" if prefix else name
            if key not in missing:
                with torch.no_grad():
                    if rank_of() == 0:
                        buffer.copy_(weights[key])
                    torch.distributed.broadcast(buffer, src=0)
    return missing


def load_weights_into_engine(model: EngineModel, path: Path) -> tuple[dict[str, Any], list[str]]:
    """``load_from`` into a running engine; returns (what hooks see, missing keys).

    A file is a full state dict; a directory is a DeepSpeed checkpoint (its
    weights only). Under ZeRO-3 rank 0 reads it and each module's parameters
    are gathered only while their values go in, so no other rank ever holds the
    whole model; otherwise every rank loads its full copy. Either way the
    optimizer's master copies follow the loaded weights.
    """
    from flexgraph.training.checkpoint import apply_weights

    engine = model.engine
    partitioned = engine.zero_optimization_partition_weights()
    if path.is_dir():
        if not DeepSpeedCheckpointIO().is_complete(path):
            raise CheckpointError(f"{str(path)!r} is a directory but not a DeepSpeed checkpoint "
                                  f"(no *model_states.pt)")
        if not partitioned:
            _, client_state = engine.load_checkpoint(
                str(path.parent), tag=path.name, load_module_strict=False,
                load_optimizer_states=False, load_lr_scheduler_states=False,
                load_module_only=True)
            _refresh_master_weights(engine)
            return {"meta": dict((client_state or {}).get("meta") or {})}, []
    read = _read_deepspeed_dir if path.is_dir() else _read_full_file
    if partitioned:
        checkpoint, weights = _on_rank0(read, path)
        missing = _load_partitioned(model.module, path, weights)
        checkpoint = {"meta": dict((checkpoint or {}).get("meta") or {})}
    else:
        checkpoint, weights = read(path)
        apply_weights(model.module, {"state_dict": weights}, str(path), strict=False)
        missing = []
    _refresh_master_weights(engine)
    return checkpoint, missing


