"""What a checkpoint holds, from its metadata alone, without building the model.

The portable layout's and strategies' inspectors come through
:data:`INSPECTOR_ENTRY_POINTS`, so this layer never imports a strategy.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import attrs
import torch

from flexgraph.training.checkpoint import optimizer_keyed_by
from flexgraph.training.errors import CheckpointError, CheckpointNotFoundError
from flexgraph.training.formats import (
    DCP_DIRECTORY,
    EXTRA_NAME,
    SAFETENSORS_FILE,
    TORCH_DTYPES,
    TORCH_SAVE_FILE,
    CheckpointFormat,
    SafeDCPStorage,
    dcp_problem,
    file_problem,
    read_checkpoint_file,
    safetensors_header,
    unrecognised_by,
)

INSPECTOR_ENTRY_POINTS = "flexgraph.checkpoint_inspectors"
"""The entry-point group of added inspectors (each a :class:`CheckpointInspector`)."""


_PARTS = {"state_dict": "model", "optimizer": "optimizer",
          "param_schedulers": "param_schedulers", "meta": "loop state",
          "rng_states": "rng states", "message_hub": "message hub (MMEngine)",
          "loss_scaler": "loss scaler"}


@attrs.frozen
class CheckpointSummary:
    """What a checkpoint holds, as ``flexgraph ckpt inspect`` shows it (plain data).

    Parameters
    ----------
    path, format
    writer
        What wrote it, as far as the content tells.
    complete, problem
    world_size, epoch, iteration
    parameters, dtypes
        Elements of the model's tensors, in all and per dtype.
    contents, extras
        The training-state parts inside, and other top-level entries (hooks').
    versions
    """

    path: str
    format: str
    writer: str
    complete: bool
    problem: str | None = None
    world_size: int | None = None
    epoch: int | None = None
    iteration: int | None = None
    parameters: int | None = None
    dtypes: dict[str, int] = attrs.field(factory=dict,
                                         converter=lambda value: dict(sorted(value.items())))
    contents: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    extras: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    versions: dict[str, str] = attrs.field(factory=dict, converter=dict)

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen
class CheckpointInspector:
    """How ``flexgraph ckpt inspect`` describes checkpoints of one format.

    Parameters
    ----------
    format
    describe
        ``path -> CheckpointSummary``; raises :class:`CheckpointError` naming the path.
    """

    format: CheckpointFormat
    describe: Callable[[Path], CheckpointSummary] = attrs.field(eq=False, repr=False)


def _is_tensor_dict(value: Any) -> bool:
    return isinstance(value, Mapping) and bool(value) and all(
        isinstance(v, torch.Tensor) for v in value.values())


def _model_tensors(shapes_and_dtypes: Iterable[tuple[int, str]]) -> tuple[int, dict[str, int]]:
    """Total elements, and per dtype, of ``(numel, dtype name)`` pairs."""
    per_dtype: Counter[str] = Counter()
    for numel, dtype in shapes_and_dtypes:
        per_dtype[dtype] += int(numel)
    return sum(per_dtype.values()), dict(per_dtype)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def state_parts(checkpoint: Mapping[str, Any], *, engine_keys: Iterable[str] = ()
                ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The training-state parts a checkpoint dict holds, and its other (hook) entries.

    Parameters
    ----------
    checkpoint
    engine_keys
        Keys of the format itself.

    Returns
    -------
    (tuple of str, tuple of str)
    """
    skip = set(engine_keys)
    parts = tuple(name for key, name in _PARTS.items()
                  if checkpoint.get(key) is not None)
    extras = tuple(sorted(str(k) for k in checkpoint if k not in _PARTS and k not in skip))
    return parts, extras


def _loop_fields(meta: Any) -> dict[str, Any]:
    meta = meta if isinstance(meta, Mapping) else {}

    def number(key: str) -> int | None:
        value = meta.get(key)
        return int(value) if isinstance(value, int) else None

    versions = {k: str(meta[k]) for k in ("flexgraph_version", "torch_version",
                                          "mmengine_version") if meta.get(k)}
    return {"world_size": number("world_size"), "epoch": number("epoch"),
            "iteration": number("iter"), "versions": versions}


def _file_writer(checkpoint: Mapping[str, Any]) -> str:
    meta = checkpoint.get("meta") if isinstance(checkpoint.get("meta"), Mapping) else {}
    if "flexgraph_version" not in meta:
        return "MMEngine" if "mmengine_version" in meta or "message_hub" in checkpoint \
            else "unknown (a checkpoint dict)"
    # FSDP's full state keys the optimizer by parameter name; MMEngine's wrapper by position.
    return ("flexgraph, FSDP (state_dict_cfg='full')"
            if optimizer_keyed_by(checkpoint.get("optimizer")) == "name"
            else "flexgraph, single device or DDP")


def _describe_file(path: Path) -> CheckpointSummary:
    problem = file_problem(path, verify=False)
    if problem is not None:
        return CheckpointSummary(str(path), TORCH_SAVE_FILE.name, "unknown", False, problem)
    checkpoint = read_checkpoint_file(path, mmap=True)
    if _is_tensor_dict(checkpoint):  # a plain state_dict, as torch.save(model.state_dict())
        checkpoint = {"state_dict": checkpoint}
        writer = "a plain state_dict"
    elif isinstance(checkpoint, Mapping):
        writer = _file_writer(checkpoint)
    else:
        raise CheckpointError(f"{str(path)!r} holds a {type(checkpoint).__name__}, neither a "
                              f"checkpoint dict nor a state_dict")
    weights = checkpoint.get("state_dict")
    weights = weights if isinstance(weights, Mapping) else {}
    parameters, dtypes = _model_tensors((t.numel(), _dtype_name(t.dtype))
                                        for t in weights.values()
                                        if isinstance(t, torch.Tensor))
    parts, extras = state_parts(checkpoint)
    return CheckpointSummary(str(path), TORCH_SAVE_FILE.name, writer, True,
                             parameters=parameters, dtypes=dtypes, contents=parts,
                             extras=extras, **_loop_fields(checkpoint.get("meta")))


def _describe_dcp(path: Path) -> CheckpointSummary:
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    problem = dcp_problem(path, need_extra=False)
    metadata = SafeDCPStorage(path).read_metadata()
    tensors = metadata.state_dict_metadata
    model = [(m.size.numel(), _dtype_name(m.properties.dtype)) for key, m in tensors.items()
             if key.startswith("state_dict.") and isinstance(m, TensorStorageMetadata)]
    if not model:  # a DCP checkpoint of a bare state dict, written by another tool
        model = [(m.size.numel(), _dtype_name(m.properties.dtype)) for m in tensors.values()
                 if isinstance(m, TensorStorageMetadata)]
    parameters, dtypes = _model_tensors(model)
    top = {key.split(".", 1)[0]: True for key in tensors}
    extra = path / EXTRA_NAME
    rest = read_checkpoint_file(extra, mmap=True) if extra.is_file() and problem is None else {}
    rest = rest if isinstance(rest, Mapping) else {}
    parts, extras = state_parts({**rest, **top})
    # a shard file is __<rank>_<n>.distcp; a rank may write several
    ranks = len({shard.name.split("_")[2] for shard in path.glob("__*_*.distcp")})
    fields = _loop_fields(rest.get("meta"))
    fields["world_size"] = fields["world_size"] or ranks or None
    writer = ("flexgraph, FSDP (sharded)" if extra.is_file()
              else "torch.distributed.checkpoint (no flexgraph loop state)")
    if not extra.is_file() and "state_dict" not in top:
        parts, extras = ("model",), ()
    return CheckpointSummary(str(path), DCP_DIRECTORY.name, writer, problem is None, problem,
                             parameters=parameters, dtypes=dtypes, contents=parts,
                             extras=extras, **fields)


def _describe_safetensors(path: Path) -> CheckpointSummary:
    header = safetensors_header(path)
    entries = [v for k, v in header.items() if k != "__metadata__" and isinstance(v, Mapping)]
    parameters, dtypes = _model_tensors(
        (math.prod(v.get("shape") or []), _dtype_name(TORCH_DTYPES[v["dtype"]])
         if v.get("dtype") in TORCH_DTYPES else str(v.get("dtype"))) for v in entries)
    metadata = header.get("__metadata__") if isinstance(header.get("__metadata__"), Mapping) \
        else {}
    return CheckpointSummary(str(path), SAFETENSORS_FILE.name,
                             f"safetensors (format {metadata.get('format', 'unknown')})", True,
                             parameters=parameters, dtypes=dtypes, contents=("model",))


_BUILT_IN = (CheckpointInspector(TORCH_SAVE_FILE, _describe_file),
             CheckpointInspector(DCP_DIRECTORY, _describe_dcp),
             CheckpointInspector(SAFETENSORS_FILE, _describe_safetensors))


def checkpoint_inspectors() -> tuple[CheckpointInspector, ...]:
    """flexgraph's inspectors, then those added through :data:`INSPECTOR_ENTRY_POINTS`."""
    added = tuple(ep.load() for ep in entry_points(group=INSPECTOR_ENTRY_POINTS))
    return _BUILT_IN + tuple(i for i in added if isinstance(i, CheckpointInspector))


def describe_checkpoint(path: str | Path) -> CheckpointSummary:
    """Describe the checkpoint at ``path``, whatever wrote it, without reading its tensors.

    Parameters
    ----------
    path

    Returns
    -------
    CheckpointSummary
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointNotFoundError(f"checkpoint {str(path)!r} does not exist")
    inspectors = checkpoint_inspectors()
    inspector = next((i for i in inspectors if i.format.recognise(path)), None)
    if inspector is None:
        raise CheckpointError(unrecognised_by(path, [i.format for i in inspectors]))
    return inspector.describe(path)
