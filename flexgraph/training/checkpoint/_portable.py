"""The portable checkpoint: one layout every strategy writes and every strategy reads.

A directory written through ``torch.distributed.checkpoint`` (DCP) by every rank::

    .flexgraph-portable   written first: marks the format
    __0_0.distcp ...      ``model.<name>``, ``optimizer.<name>.<key>`` (DCP reshards on load)
    .metadata             DCP's index (global shapes, dtypes)
    extra.pth             rank 0's: loop position, param groups, schedulers, RNG, hook extras
    manifest.json         written last: strategy, world size, dtypes, the plan
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemWriter

from flexgraph.training.checkpoint._access import StateAccess, TorchStateAccess, restore_into
from flexgraph.training.checkpoint._checkpointer import atomic_write, checkpoint_meta
from flexgraph.training.checkpoint._dcp import full_tensors
from flexgraph.training.checkpoint._file import FileCheckpointIO
from flexgraph.training.checkpoint._io import NOTHING_READ, CheckpointIO, OnRead, WeightLoader
from flexgraph.training.checkpoint._manifest import make_manifest, read_manifest
from flexgraph.training.checkpoint._staging import StagedWriter, Staging
from flexgraph.training.checkpoint._weights import WeightsLoaded
from flexgraph.training.errors import CheckpointError
from flexgraph.training.formats import (
    EXTRA_NAME,
    MANIFEST_NAME,
    PORTABLE_DIRECTORY,
    PORTABLE_MARKER,
    CheckpointFormat,
    SafeDCPStorage,
    dcp_load,
    dcp_problem,
    file_problem,
    read_checkpoint_file,
)
from flexgraph.training.runtime import this_rank, world_size

MODEL, OPTIMIZER = "model", "optimizer"
_GROUPS = "optimizer_param_groups"


def _begin(path: Path, manifest: dict[str, Any]) -> None:
    """Rank 0 marks the directory before any shard is in it."""
    if this_rank() == 0:
        path.mkdir(parents=True, exist_ok=True)
        (path / PORTABLE_MARKER).write_text(manifest["format"] + "\n")


def _finish(path: Path, rest: dict[str, Any], manifest: dict[str, Any]) -> None:
    """Rank 0, once every shard is on disk: ``extra.pth``, then the manifest last."""
    if this_rank() == 0:
        atomic_write(path / EXTRA_NAME, lambda f: torch.save(rest, f))
        text = json.dumps(manifest, indent=1, sort_keys=False).encode()
        atomic_write(path / MANIFEST_NAME, lambda f: f.write(text))


def _save(tensors: dict[str, Any], rest: dict[str, Any], path: Path, *,
          manifest: dict[str, Any]) -> None:
    import torch.distributed.checkpoint as dcp

    _begin(path, manifest)
    # dcp.save returns on rank 0 only after every rank reported its shards written
    # and .metadata is on disk: the manifest below is the checkpoint's last file.
    dcp.save(tensors, storage_writer=FileSystemWriter(path))
    _finish(path, rest, manifest)


_SAVE_GROUP: list[Any] = []


def _background_group() -> Any:
    """A gloo group of its own for background saves, so DCP's collectives never interleave
    with training's (``None`` without a process group)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    if not _SAVE_GROUP:
        _SAVE_GROUP.append(dist.new_group(backend="gloo"))
    return _SAVE_GROUP[0]


class BackgroundWrite:
    """A portable checkpoint whose shards DCP writes in the background (``async_save``)."""

    def __init__(self, future: Any, path: Path, rest: dict[str, Any],
                 manifest: dict[str, Any]) -> None:
        self.future = getattr(future, "upload_completion", future)
        self.path, self.rest, self.manifest = path, rest, manifest

    def wait(self) -> None:
        self.future.result()
        _finish(self.path, self.rest, self.manifest)


def _split(checkpoint: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The tensors DCP writes (name-keyed) and the rest (rank 0's ``extra.pth``)."""
    optimizer = checkpoint.get("optimizer") or None
    tensors: dict[str, Any] = {MODEL: checkpoint.get("state_dict") or {}}
    rest = {k: v for k, v in checkpoint.items() if k not in ("state_dict", "optimizer")}
    if optimizer is not None:
        tensors[OPTIMIZER] = optimizer.get("state") or {}
        rest[_GROUPS] = optimizer.get("param_groups") or []
    return tensors, rest


def write_portable(path: str | Path, model_state: dict[str, torch.Tensor],
                   optimizer_state: dict[str, Any] | None = None, *,
                   meta: dict[str, Any] | None = None, extra: dict[str, Any] | None = None,
                   strategy: str | None = None) -> Path:
    """Write a portable checkpoint at ``path`` from a full, name-keyed state, in one process.

    Parameters
    ----------
    path : str or Path
    model_state : dict of str to torch.Tensor
    optimizer_state : dict, optional
        torch's, name-keyed.
    meta : dict, optional
        The loop position (default: step 0).
    extra : dict, optional
    strategy : str, optional

    Returns
    -------
    Path
    """
    path = Path(path)
    if path.exists():
        raise CheckpointError(f"{str(path)!r} exists; write a portable checkpoint to a new path")
    meta = dict(meta or checkpoint_meta(epoch=0, iteration=0, batch_idx=0, seed=None))
    checkpoint = {"meta": meta, **dict(extra or {}), "state_dict": dict(model_state)}
    if optimizer_state is not None:
        checkpoint["optimizer"] = optimizer_state
    tensors, rest = _split(checkpoint)
    manifest = make_manifest(meta, tensors[MODEL], tensors.get(OPTIMIZER), world_size=1,
                             plan=None)
    manifest["strategy"] = strategy
    _save(tensors, rest, path, manifest=manifest)
    return path


def portable_tensors(path: str | Path) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Every tensor a portable (or any DCP) checkpoint holds, from ``.metadata`` alone.

    Parameters
    ----------
    path : str or Path

    Returns
    -------
    dict
        Key -> (global shape, dtype).
    """
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = SafeDCPStorage(Path(path)).read_metadata()
    return {key: (tuple(info.size), info.properties.dtype)
            for key, info in metadata.state_dict_metadata.items()
            if isinstance(info, TensorStorageMetadata)}


def read_portable_tensor(path: str | Path, key: str) -> torch.Tensor:
    """One whole tensor of a portable checkpoint, on the CPU, reading only its shards.

    Parameters
    ----------
    path : str or Path
    key : str

    Returns
    -------
    torch.Tensor
    """
    held = portable_tensors(path)
    if key not in held:
        raise CheckpointError(f"{str(path)!r} holds no tensor {key!r}")
    shape, dtype = held[key]
    out = {key: torch.empty(shape, dtype=dtype)}
    dcp_load(out, Path(path), partial=True)
    return out[key]


def _flat_keys(tree: dict[str, Any], prefix: str) -> Iterator[tuple[str, tuple[str, ...]]]:
    for key, value in tree.items():
        if isinstance(value, dict):
            for flat, path in _flat_keys(value, f"{prefix}.{key}"):
                yield flat, (key, *path)
        else:
            yield f"{prefix}.{key}", (key,)


def _keep_saved(tree: dict[str, Any], prefix: str, saved: set[str]) -> dict[str, Any]:
    """``tree`` without the tensors the checkpoint does not hold (DCP's template)."""
    out: dict[str, Any] = {}
    for flat, path in _flat_keys(tree, prefix):
        if flat in saved:
            node = out
            for part in path[:-1]:
                node = node.setdefault(part, {})
            value = tree
            for part in path:
                value = value[part]
            node[path[-1]] = value
    return out


class PortableCheckpointIO(CheckpointIO):
    """Portable checkpoint directories (``iter_40.ckpt/``): every rank writes, any strategy reads.

    Parameters
    ----------
    access
        The strategy's :class:`StateAccess` (default: torch's).
    weights
        The IO that loads ``load_from`` files of other formats.
    plan
    async_save
        :meth:`write` returns once the state is in CPU memory.
    """

    suffix = ".ckpt"
    format = PORTABLE_DIRECTORY

    def __init__(self, access: StateAccess | None = None, *,
                 weights: CheckpointIO | None = None, async_save: bool = False,
                 plan: Mapping[str, Any] | None = None) -> None:
        self.access = access or TorchStateAccess()
        self.plan = plan
        self.async_save = bool(async_save)
        self.staging = Staging()
        self.weights = weights or FileCheckpointIO()
        self.weight_formats = (PORTABLE_DIRECTORY, *(
            f for f in self.weights.weight_formats if f != PORTABLE_DIRECTORY))

    def states(self, model: Any, optim_wrapper: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"state_dict": self.access.model_state(model)}
        if optim_wrapper is not None:
            out["optimizer"] = self.access.optimizer_state(model, optim_wrapper)
        return out

    def write(self, checkpoint: dict[str, Any], path: Path, *, model: Any = None,
              optim_wrapper: Any = None) -> BackgroundWrite | None:
        import torch.distributed.checkpoint as dcp

        tensors, rest = _split(checkpoint)
        rest = full_tensors(rest)  # hook extras holding shards: extra.pth is rank 0's alone
        manifest = make_manifest(rest.get("meta") or {}, tensors[MODEL],
                                 tensors.get(OPTIMIZER), world_size=world_size(), plan=self.plan)
        if not self.async_save:
            _save(tensors, rest, path, manifest=manifest)
            return None
        _begin(path, manifest)
        future = dcp.async_save(self.staging.stage(tensors), storage_writer=StagedWriter(path),
                                process_group=_background_group())
        return BackgroundWrite(future, path, rest, manifest)

    def read(self, path: Path, *, model: Any = None, optim_wrapper: Any = None) -> dict[str, Any]:
        problem = self.incomplete(path)
        if problem is not None:
            raise CheckpointError(problem)
        checkpoint = dict(read_checkpoint_file(path / EXTRA_NAME))
        checkpoint["manifest"] = read_manifest(path)
        saved = set(SafeDCPStorage(path).read_metadata().state_dict_metadata)
        shapes = {k: shape for k, (shape, _) in portable_tensors(path).items()}
        model_part, optimizer_part = self.access.templates(model, optim_wrapper, shapes)
        state: dict[str, Any] = {MODEL: _keep_saved(model_part, MODEL, saved)}
        groups = checkpoint.pop(_GROUPS, None)
        if optimizer_part is not None and groups is not None:
            state[OPTIMIZER] = _keep_saved(optimizer_part, OPTIMIZER, saved)
        dcp_load(state, path, partial=True)
        checkpoint["state_dict"] = state[MODEL]
        if OPTIMIZER in state:
            checkpoint["optimizer"] = {"state": state[OPTIMIZER], "param_groups": groups}
        return checkpoint

    def apply(self, checkpoint: dict[str, Any], path: Path, *, model: Any,
              optim_wrapper: Any, strict: bool = True) -> None:
        restore_into(self.access, checkpoint, f"the portable checkpoint {str(path)!r}", model=model,
                     optim_wrapper=optim_wrapper, full=False, strict=strict)

    def loader_of(self, held: CheckpointFormat) -> WeightLoader:
        return self if held is PORTABLE_DIRECTORY else self.weights.loader_of(held)

    def load_weights(self, path: Path, model: Any, *, held: CheckpointFormat,
                     on_read: OnRead) -> WeightsLoaded:
        if held is not PORTABLE_DIRECTORY:
            return self.weights.load_weights(path, model, held=held, on_read=on_read)
        problem = self.incomplete(path)
        if problem is not None:
            raise CheckpointError(problem)
        on_read(dict(NOTHING_READ))
        held = portable_tensors(path)
        model_part, _ = self.access.templates(model, None, {k: v[0] for k, v in held.items()})
        wanted = _keep_saved(model_part, MODEL, set(held))
        if not wanted:
            raise CheckpointError(f"none of the weights in {str(path)!r} match a parameter "
                                  f"of {type(model).__name__}; is it the right checkpoint?")
        state = {MODEL: wanted}
        dcp_load(state, path, partial=True)
        self.access.set_state(model, None, state[MODEL], None, full=False, strict=False)
        saved = {k.removeprefix(MODEL + ".") for k in held if k.startswith(MODEL + ".")}
        return WeightsLoaded(missing=tuple(sorted(set(model_part) - set(wanted))),
                             unexpected=tuple(sorted(saved - set(model_part))))

    def is_complete(self, path: Path) -> bool:
        return self.incomplete(path) is None

    def incomplete(self, path: Path) -> str | None:
        try:
            read_manifest(path)
        except CheckpointError as exc:
            return str(exc)
        return dcp_problem(path) or file_problem(path / EXTRA_NAME, verify=False)
