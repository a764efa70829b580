"""A checkpoint opened for reading one tensor at a time, whatever wrote it."""

from __future__ import annotations

import collections
import contextlib
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import torch

from flexgraph.training.errors import CheckpointError
from flexgraph.training.formats._dcp_storage import (
    EXTRA_NAME,
    SafeDCPStorage,
    _SafePlanner,
    dcp_problem,
)
from flexgraph.training.formats._recognise import DCP_DIRECTORY, TORCH_SAVE_FILE
from flexgraph.training.formats._torch_file import read_checkpoint_file

KeyPath = tuple[Any, ...]
"""Where a value sits in a nested checkpoint: its keys and indices, outermost first."""


def _on_meta(value: Any) -> Any:
    """``value`` with every tensor replaced by a meta tensor like it."""
    if isinstance(value, torch.Tensor):
        return torch.empty(value.shape, dtype=value.dtype, device="meta")
    if isinstance(value, Mapping):
        return _mapping_like(value, ((k, _on_meta(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return type(value)(_on_meta(v) for v in value)
    return value


def _mapping_like(original: Mapping[Any, Any], items: Iterator[tuple[Any, Any]]) -> dict[Any, Any]:
    """A dict of ``items``, an OrderedDict where ``original`` is one."""
    return collections.OrderedDict(items) if isinstance(original, collections.OrderedDict) \
        else dict(items)


def tensor_paths(value: Any, path: KeyPath = ()) -> Iterator[tuple[KeyPath, torch.Tensor]]:
    """Every tensor inside ``value`` with its path, in order.

    Parameters
    ----------
    value : Any
        A nest of mappings, lists and tuples.
    path : KeyPath, default ()

    Yields
    ------
    tuple of (KeyPath, torch.Tensor)
    """
    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from tensor_paths(item, (*path, key))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from tensor_paths(item, (*path, index))


def element_at(value: Any, path: KeyPath) -> Any:
    for key in path:
        value = value[key]
    return value


def replace_tensors(value: Any, make: Callable[[KeyPath, torch.Tensor], Any],
                    path: KeyPath = ()) -> Any:
    """A copy of ``value`` with ``make(path, tensor)`` in place of every tensor.

    Parameters
    ----------
    value : Any
    make : callable
    path : KeyPath, default ()

    Returns
    -------
    Any
    """
    if isinstance(value, torch.Tensor):
        return make(path, value)
    if isinstance(value, Mapping):
        return _mapping_like(value, ((k, replace_tensors(v, make, (*path, k)))
                                     for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return type(value)(replace_tensors(v, make, (*path, i)) for i, v in enumerate(value))
    return value


@attrs.frozen
class CheckpointSource:
    """A checkpoint opened for reading, one tensor at a time.

    Parameters
    ----------
    path
    format_name
    layout
        The checkpoint dict in flexgraph's layout, every tensor a meta tensor.
    fetch
        The whole tensor at a path of ``layout``, on the CPU.
    note
    """

    path: Path
    format_name: str
    layout: dict[str, Any] = attrs.field(repr=False)
    fetch: Callable[[KeyPath], torch.Tensor] = attrs.field(eq=False, repr=False)
    note: str | None = None

    def tensors(self) -> Iterator[tuple[KeyPath, torch.Tensor]]:
        return tensor_paths(self.layout, ())

    def largest_tensor_bytes(self) -> int:
        return max((t.numel() * t.element_size() for _, t in self.tensors()), default=0)

    def whole(self) -> dict[str, Any]:
        """The checkpoint with every tensor read, for ``load_from``."""
        return replace_tensors(self.layout, lambda path, _: self.fetch(path))


def weights_layout(weights: Mapping[str, Any]) -> dict[str, Any]:
    """``{'state_dict': weights}`` with ``module.`` prefixes stripped, as ``load_from`` does.

    Parameters
    ----------
    weights : Mapping

    Returns
    -------
    dict
    """
    return {"state_dict": {str(k).removeprefix("module."): v for k, v in weights.items()}}


def _is_tensor_dict(value: Any) -> bool:
    return isinstance(value, Mapping) and bool(value) and all(
        isinstance(v, torch.Tensor) for v in value.values())


def _flexgraph_layout(checkpoint: Any, path: Path) -> dict[str, Any]:
    if _is_tensor_dict(checkpoint):
        return weights_layout(checkpoint)
    if not isinstance(checkpoint, Mapping):
        raise CheckpointError(f"checkpoint {str(path)!r} holds a {type(checkpoint).__name__}, "
                              f"neither a checkpoint dict nor a state_dict")
    layout = dict(checkpoint)
    if not _is_tensor_dict(layout.get("state_dict")) and _is_tensor_dict(layout.get("model")):
        layout["state_dict"] = layout.pop("model")
    if _is_tensor_dict(layout.get("state_dict")):
        layout.update(weights_layout(layout["state_dict"]))
    return layout


def open_torch_file(path: Path) -> CheckpointSource:
    """A ``torch.save`` file, its tensors memory-mapped."""
    mapped = _flexgraph_layout(read_checkpoint_file(path, mmap=True), path)
    return CheckpointSource(path, TORCH_SAVE_FILE.name, _on_meta(mapped),
                            lambda key: element_at(mapped, key))


def _set_at(root: dict[str, Any], path: KeyPath, value: Any) -> None:
    """Put ``value`` at ``path``, making dicts (lists, for int keys) on the way."""
    node: Any = root
    for key, following in zip(path[:-1], path[1:], strict=True):
        empty: Any = [] if isinstance(following, int) else {}
        if isinstance(node, list):
            while len(node) <= key:
                node.append(None)
            node[key] = node[key] if node[key] is not None else empty
            node = node[key]
        else:
            node = node.setdefault(key, empty)
    if isinstance(node, list):
        while len(node) <= path[-1]:
            node.append(None)
    node[path[-1]] = value


def open_dcp_directory(path: Path) -> CheckpointSource:
    """A DCP directory: its layout from ``.metadata`` and ``extra.pth``."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    problem = dcp_problem(path, need_extra=False)
    if problem is not None:
        raise CheckpointError(problem)
    metadata = SafeDCPStorage(path).read_metadata()
    paths = dict(metadata.planner_data or {})
    layout: dict[str, Any] = {}
    flat_of: dict[KeyPath, str] = {}
    small: dict[str, Any] = {}
    for flat, meta in metadata.state_dict_metadata.items():
        where = tuple(paths.get(flat, (flat,)))
        if isinstance(meta, TensorStorageMetadata):
            _set_at(layout, where, torch.empty(meta.size, dtype=meta.properties.dtype,
                                               device="meta"))
            flat_of[where] = flat
        else:
            small[flat] = None
    if small:
        _load_flat(small, path)
        for flat, value in small.items():
            _set_at(layout, tuple(paths.get(flat, (flat,))), value)
    extra = path / EXTRA_NAME
    rest = read_checkpoint_file(extra) if extra.is_file() else {}
    rest = dict(rest) if isinstance(rest, Mapping) else {}
    layout = {**_on_meta(rest), **layout}
    if "state_dict" not in layout:  # another tool's: the model's tensors at the top level
        top = {k: v for k, v in layout.items() if isinstance(v, torch.Tensor)}
        layout = {**{k: v for k, v in layout.items() if k not in top}, **weights_layout(top)}
        flat_of = {(("state_dict", key[0].removeprefix("module.")) if key[0] in top else key):
                   flat for key, flat in flat_of.items()}

    def fetch(key: KeyPath) -> torch.Tensor:
        if key not in flat_of:  # extra.pth's (RNG states), read with it
            return element_at(rest, key)
        meta_tensor = element_at(layout, key)
        state = {flat_of[key]: torch.empty(meta_tensor.shape, dtype=meta_tensor.dtype)}
        _load_flat(state, path)
        return state[flat_of[key]]

    return CheckpointSource(path, DCP_DIRECTORY.name, layout, fetch)


@contextlib.contextmanager
def single_process_dcp() -> Iterator[None]:
    """DCP in this process alone (``no_dist=True``), without its warning about it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _load_flat(state: dict[str, Any], path: Path) -> None:
    """``dcp.load`` of the given flat keys only, in this process alone."""
    import torch.distributed.checkpoint as dcp

    try:
        with single_process_dcp():
            dcp.load(state, storage_reader=SafeDCPStorage(path),
                     planner=_SafePlanner(allow_partial_load=True), no_dist=True)
    except CheckpointError:
        raise
    except Exception as exc:  # DCP's reader fails in many ways on a damaged shard
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise CheckpointError(f"cannot read the sharded checkpoint {str(path)!r}: "
                              f"{type(exc).__name__}: {first}") from exc
