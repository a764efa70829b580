"""A portable checkpoint's manifest: what wrote it, where the run stood, and the plan."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from flexgraph.training.errors import CheckpointError
from flexgraph.training.formats import MANIFEST_NAME

MANIFEST_FORMAT = "flexgraph.portable/1"


def _dtype_name(value: Any) -> str:
    return str(value.dtype).removeprefix("torch.") if isinstance(value, torch.Tensor) else \
        type(value).__name__


def make_manifest(meta: dict[str, Any], model_state: dict[str, Any],
                  optimizer_state: dict[str, Any] | None, *, world_size: int,
                  plan: Mapping[str, Any] | None) -> dict[str, Any]:
    """The manifest of a checkpoint holding ``model_state`` and ``optimizer_state``."""
    keys = sorted({k for per_param in (optimizer_state or {}).values()
                   for k in (per_param or {})})
    return {
        "format": MANIFEST_FORMAT,
        "strategy": (plan or {}).get("strategy"),
        "world_size": int(world_size),
        **{k: meta.get(k) for k in ("epoch", "iter", "batch_idx", "data_pass", "seed")},
        "flexgraph_version": meta.get("flexgraph_version"),
        "torch_version": meta.get("torch_version"),
        "time": meta.get("time"),
        "dtypes": {name: _dtype_name(v) for name, v in model_state.items()},
        "optimizer_keys": keys,
        "plan": None if plan is None else dict(plan),
    }


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of the portable checkpoint ``path``.

    Parameters
    ----------
    path : Path

    Returns
    -------
    dict
    """
    file = path / MANIFEST_NAME
    if not file.is_file():
        raise CheckpointError(f"portable checkpoint {str(path)!r} is incomplete: it has no "
                              f"{MANIFEST_NAME} (written last; its save was interrupted?)")
    try:
        manifest = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"portable checkpoint {str(path)!r}: its {MANIFEST_NAME} is "
                              f"not JSON ({exc})") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise CheckpointError(f"portable checkpoint {str(path)!r}: its {MANIFEST_NAME} is "
                              f"not a {MANIFEST_FORMAT} manifest")
    return manifest
