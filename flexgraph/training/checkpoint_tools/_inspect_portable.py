"""``flexgraph ckpt inspect`` for portable checkpoints (no shard is read)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from flexgraph.training.checkpoint import portable_tensors, read_manifest
from flexgraph.training.checkpoint_tools._inspect import (
    CheckpointInspector,
    CheckpointSummary,
    _dtype_name,
    _model_tensors,
    state_parts,
)
from flexgraph.training.errors import CheckpointError
from flexgraph.training.formats import (
    EXTRA_NAME,
    PORTABLE_DIRECTORY,
    dcp_problem,
    read_checkpoint_file,
)


def describe_portable(path: Path) -> CheckpointSummary:
    """A portable checkpoint's summary, from its manifest and metadata alone."""
    try:
        manifest = read_manifest(path)
        problem = dcp_problem(path)
    except CheckpointError as exc:
        manifest, problem = {}, str(exc)
    held = portable_tensors(path) if (path / ".metadata").is_file() else {}
    parameters, dtypes = _model_tensors(
        (int(math.prod(shape)), _dtype_name(dtype)) for key, (shape, dtype) in held.items()
        if key.startswith("model."))
    extra = path / EXTRA_NAME
    rest = read_checkpoint_file(extra, mmap=True) if extra.is_file() and problem is None else {}
    rest = dict(rest) if isinstance(rest, Mapping) else {}
    rest.pop("optimizer_param_groups", None)
    top = {"state_dict": True, **({"optimizer": True} if any(
        k.startswith("optimizer.") for k in held) else {})}
    parts, extras = state_parts({**rest, **top})
    versions = {k: str(manifest[k]) for k in ("flexgraph_version", "torch_version")
                if manifest.get(k)}
    strategy = manifest.get("strategy") or "unknown strategy"
    return CheckpointSummary(
        str(path), PORTABLE_DIRECTORY.name, f"flexgraph portable, {strategy}",
        problem is None, problem, world_size=manifest.get("world_size"),
        epoch=manifest.get("epoch"), iteration=manifest.get("iter"), parameters=parameters,
        dtypes=dtypes, contents=parts, extras=extras, versions=versions)


PORTABLE_INSPECTOR = CheckpointInspector(PORTABLE_DIRECTORY, describe_portable)
"""The ``flexgraph.checkpoint_inspectors`` entry point of portable checkpoints."""
