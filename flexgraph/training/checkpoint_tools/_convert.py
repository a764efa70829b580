"""``flexgraph ckpt convert``: a checkpoint rewritten in another format, a tensor at a time."""

from __future__ import annotations

import json
import os
import re
import shutil
import zipfile
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import attrs
import torch

from flexgraph.training.checkpoint import SHARDED_KEYS, optimizer_keyed_by
from flexgraph.training.errors import CheckpointError, CheckpointExistsError
from flexgraph.training.formats import (
    EXTRA_NAME,
    SAFETENSORS_DTYPES,
    CheckpointSource,
    KeyPath,
    open_checkpoint,
    replace_tensors,
    single_process_dcp,
    tensor_paths,
)

TARGETS = ("dcp", "torch", "safetensors")

@attrs.frozen
class Conversion:
    """What :func:`convert_checkpoint` wrote, and what it left out."""

    source: str
    destination: str
    source_format: str
    target: str
    tensors: int
    largest_tensor_bytes: int
    left_out: tuple[str, ...] = ()


def _plan(source: CheckpointSource, target: str) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The part of the source's layout the target holds, and one line per part left out."""
    layout = source.layout
    left_out = [source.note] if source.note else []
    if target == "safetensors":
        others = sorted(k for k in layout if k != "state_dict")
        if others:
            left_out.append(f"{', '.join(others)}: a safetensors checkpoint holds the "
                            f"model's weights only")
        return {"state_dict": layout.get("state_dict") or {}}, tuple(left_out)
    if target == "dcp" and optimizer_keyed_by(layout.get("optimizer")) == "position":
        layout = {k: v for k, v in layout.items() if k != "optimizer"}
        left_out.append("optimizer: its state numbers the parameters (single device, DDP, "
                        "MMEngine), which only the model can name; resume the source "
                        "itself for it")
    return layout, tuple(left_out)


def convert_checkpoint(source: str | Path, destination: str | Path, *, to: str
                       ) -> Conversion:
    """Rewrite the checkpoint at ``source`` as ``to`` at ``destination``.

    Parameters
    ----------
    source
    destination
        Must not exist yet.
    to
        One of :data:`TARGETS`.

    Returns
    -------
    Conversion
    """
    if to not in TARGETS:
        raise CheckpointError(f"cannot convert to {to!r}: the formats are {', '.join(TARGETS)}")
    destination = Path(destination)
    if destination.exists() or destination.is_symlink():
        raise CheckpointExistsError(f"convert destination {str(destination)!r} exists; give "
                                    f"a new path (convert never overwrites)")
    if not destination.parent.is_dir():
        raise CheckpointError(f"the folder of convert destination {str(destination)!r} does "
                              f"not exist; create it first")
    opened = open_checkpoint(source)
    layout, left_out = _plan(opened, to)
    if not layout.get("state_dict") and to == "safetensors":
        raise CheckpointError(f"{str(opened.path)!r} holds no model weights to write as "
                              f"safetensors")
    temp = destination.with_name(f".{destination.name}.converting")
    _discard(temp)
    try:
        _WRITERS[to](temp, layout, opened.fetch)
        os.replace(temp, destination)
    finally:
        _discard(temp)
    tensors = [t for _, t in tensor_paths(layout)]
    return Conversion(str(opened.path), str(destination), opened.format_name, to,
                      len(tensors), max((t.numel() * t.element_size() for t in tensors),
                                        default=0), left_out)


def _discard(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _as_fake(value: Any, mode: Any) -> Any:
    if isinstance(value, torch.Tensor):
        with mode:
            return torch.empty(value.shape, dtype=value.dtype)
    if isinstance(value, dict):
        return type(value)((k, _as_fake(v, mode)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return type(value)(_as_fake(v, mode) for v in value)
    return value


def write_torch_file(path: Path, layout: dict[str, Any],
                     fetch: Callable[[KeyPath], torch.Tensor]) -> None:
    """A ``torch.save`` file of ``layout``: the pickle and empty records first, then each
    record's bytes and CRC-32, each tensor fetched only to be written."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with open(path, "wb") as f, torch.serialization.skip_data(materialize_fake_tensors=True):
        torch.save(_as_fake(layout, FakeTensorMode()), f)
    tensors = list(tensor_paths(layout))
    with zipfile.ZipFile(path) as archive:
        records = sorted((m for m in archive.infolist() if _RECORD.fullmatch(m.filename)),
                         key=lambda m: int(m.filename.rsplit("/", 1)[1]))
        directory = archive.start_dir
    sizes = [t.numel() * t.element_size() for _, t in tensors]
    if [m.file_size for m in records] != sizes:
        raise CheckpointError(f"torch.save wrote {len(records)} tensor records where the "
                              f"checkpoint has {len(tensors)} tensors; cannot fill {path}")
    crcs: dict[str, int] = {}
    with open(path, "r+b") as f:
        for (key, expected), record in zip(tensors, records, strict=True):
            value = fetch(key)
            if tuple(value.shape) != tuple(expected.shape) or value.dtype != expected.dtype:
                raise CheckpointError(f"{'.'.join(map(str, key))}: read as "
                                      f"{tuple(value.shape)} {value.dtype}, expected "
                                      f"{tuple(expected.shape)} {expected.dtype}")
            if record.file_size:
                crcs[record.filename] = _write_record(f, record, value)
            del value
        _fill_directory_crcs(f, directory, crcs)
        f.flush()
        os.fsync(f.fileno())


_RECORD = re.compile(r".*/data/\d+")


def _write_record(f: BinaryIO, record: zipfile.ZipInfo, value: torch.Tensor) -> int:
    """Write ``value``'s bytes into its (stored, uncompressed) record; return their CRC-32."""
    f.seek(record.header_offset + 26)
    name_length, extra_length = (int.from_bytes(f.read(2), "little") for _ in (0, 1))
    start = record.header_offset + 30 + name_length + extra_length
    data = memoryview(value.detach().contiguous().reshape(-1).view(torch.uint8).numpy())
    f.seek(start)
    f.write(data)
    crc = zlib.crc32(data)
    if record.flag_bits & 0x08:  # a data descriptor follows the data, with the CRC-32
        f.seek(start + record.compress_size)
        at = start + record.compress_size + (4 if f.read(4) == b"PK\x07\x08" else 0)
    else:
        at = record.header_offset + 14
    f.seek(at)
    f.write(crc.to_bytes(4, "little"))
    return crc


def _fill_directory_crcs(f: Any, offset: int, crcs: dict[str, int]) -> None:
    """Write ``crcs`` (by member name) into the central directory that starts at ``offset``."""
    while crcs:
        f.seek(offset)
        entry = f.read(46)
        if entry[:4] != b"PK\x01\x02":
            raise CheckpointError("the written torch.save file has no central directory entry "
                                  "where expected")
        lengths = [int.from_bytes(entry[i:i + 2], "little") for i in (28, 30, 32)]
        name = f.read(lengths[0]).decode("utf-8")
        if name in crcs:
            f.seek(offset + 16)
            f.write(crcs.pop(name).to_bytes(4, "little"))
        offset += 46 + sum(lengths)


def write_safetensors(path: Path, weights: Mapping[str, torch.Tensor],
                      fetch: Callable[[str], torch.Tensor]) -> None:
    """Write a safetensors file of ``weights`` (meta tensors), fetching each tensor to write it."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, tensor in weights.items():
        if tensor.dtype not in SAFETENSORS_DTYPES:
            raise CheckpointError(f"tensor {name!r} is {tensor.dtype}, which safetensors "
                                  f"cannot hold")
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": SAFETENSORS_DTYPES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the library aligns the data to 8 bytes
    with open(path, "wb") as f:
        f.write(len(encoded).to_bytes(8, "little"))
        f.write(encoded)
        for name, tensor in weights.items():
            _write_bytes(f, fetch(name), tensor)
        f.flush()
        os.fsync(f.fileno())


def _write_bytes(f: BinaryIO, value: torch.Tensor, expected: torch.Tensor) -> None:
    if tuple(value.shape) != tuple(expected.shape) or value.dtype != expected.dtype:
        raise CheckpointError(f"a tensor read as {tuple(value.shape)} {value.dtype}, its "
                              f"header says {tuple(expected.shape)} {expected.dtype}")
    flat = value.detach().contiguous().reshape(-1)
    if flat.numel():
        f.write(memoryview(flat.view(torch.uint8).numpy()))


def _write_safetensors(path: Path, layout: dict[str, Any],
                       fetch: Callable[[KeyPath], torch.Tensor]) -> None:
    weights = layout["state_dict"]
    write_safetensors(path, weights, lambda name: fetch(("state_dict", name)))


def _write_dcp(path: Path, layout: dict[str, Any],
               fetch: Callable[[KeyPath], torch.Tensor]) -> None:
    """Model and optimizer through DCP, the rest in extra.pth."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    class FetchingPlanner(DefaultSavePlanner):

        def resolve_data(self, write_item: Any) -> Any:
            found = self.lookup_object(write_item.index)
            if isinstance(found, torch.Tensor) and found.is_meta:
                return fetch(tuple(self.mappings[write_item.index.fqn]))
            return self.transform_object(write_item, found)

    sharded = {k: layout[k] for k in SHARDED_KEYS if layout.get(k)}
    rest = {k: v for k, v in layout.items() if k not in sharded}
    path.mkdir()
    writer = FileSystemWriter(path, single_file_per_rank=False)
    with single_process_dcp():
        dcp.save(sharded, storage_writer=writer, planner=FetchingPlanner(), no_dist=True)
    if rest:  # small: loop state, schedulers, RNG states
        rest = replace_tensors(rest, lambda key, _: fetch(key))
        with open(path / EXTRA_NAME, "wb") as f:
            torch.save(rest, f)
            f.flush()
            os.fsync(f.fileno())


_WRITERS: dict[str, Callable[[Path, dict[str, Any], Callable[[KeyPath], torch.Tensor]], None]] = {
    "torch": write_torch_file,
    "safetensors": _write_safetensors,
    "dcp": _write_dcp,
}
