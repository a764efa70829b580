"""Opening a checkpoint of any format for reading, by the opener of the format it holds.

Each format with an opener can be read one tensor at a time as a
:class:`~flexgraph.training.formats.CheckpointSource`: flexgraph's
own (a ``torch.save`` file, a DCP directory), safetensors files, and the
formats strategies add through the ``flexgraph.checkpoint_readers`` entry
point (a :class:`~flexgraph.training.checkpoint.CheckpointReader` whose
``open`` is set: DeepSpeed's directories), so this layer never imports a
strategy. :func:`read_checkpoint` is ``load_from``'s reader of them all;
:func:`open_checkpoint` is ``flexgraph ckpt convert``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from flexgraph.training.errors import CheckpointError, CheckpointNotFoundError
from flexgraph.training.formats._recognise import (
    DCP_DIRECTORY,
    SAFETENSORS_FILE,
    TORCH_SAVE_FILE,
    CheckpointFormat,
    unrecognised,
)
from flexgraph.training.formats._safetensors import open_safetensors_file
from flexgraph.training.formats._source import (
    CheckpointSource,
    open_dcp_directory,
    open_torch_file,
)
from flexgraph.training.formats._torch_file import file_problem, read_checkpoint_file

__all__ = ["READER_ENTRY_POINTS", "open_checkpoint", "openers", "read_checkpoint",
           "unrecognised_by"]

READER_ENTRY_POINTS = "flexgraph.checkpoint_readers"
"""The entry-point group through which strategies add the readers of their formats."""

Opener = Callable[[Path], CheckpointSource]

_BUILT_IN: tuple[tuple[CheckpointFormat, Opener], ...] = (
    (TORCH_SAVE_FILE, open_torch_file),
    (DCP_DIRECTORY, open_dcp_directory),
    (SAFETENSORS_FILE, open_safetensors_file),
)


def openers() -> tuple[tuple[CheckpointFormat, Opener], ...]:
    """flexgraph's openers, then those of the readers strategies add that can open."""
    added = (ep.load() for ep in entry_points(group=READER_ENTRY_POINTS))
    return _BUILT_IN + tuple((r.format, r.open) for r in added
                             if getattr(r, "open", None) is not None
                             and isinstance(getattr(r, "format", None), CheckpointFormat))


def unrecognised_by(path: Path, formats: Iterable[CheckpointFormat]) -> str:
    """One line: ``path`` is in none of ``formats``, and what is wrong with it if that shows."""
    found = file_problem(path, verify=False) if path.is_file() else None
    line = unrecognised(path, formats, what="checkpoint")
    return line + (f" ({found})" if found else "")


def open_checkpoint(path: str | Path) -> CheckpointSource:
    """The checkpoint at ``path`` opened by the opener of its format (by content).

    Raises
    ------
    CheckpointNotFoundError
        ``path`` does not exist.
    CheckpointError
        ``path`` is in no format that opens (one line naming the formats
        tried), or cannot be read.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointNotFoundError(f"checkpoint {str(path)!r} does not exist")
    known = openers()
    opener = next((o for f, o in known if f.recognise(path)), None)
    if opener is None:
        raise CheckpointError(unrecognised_by(path, [f for f, _ in known]))
    return opener(path)


def read_checkpoint(path: Path) -> Any:
    """The checkpoint at ``path`` read whole onto the CPU, whatever its format (``load_from``).

    A ``torch.save`` file, or a file of no known format, is
    :func:`~flexgraph.training.formats.read_checkpoint_file`'s (which says
    what is wrong with a damaged one); any other format is opened by its
    opener and read whole, in flexgraph's layout (the weights under
    ``state_dict``).
    """
    path = Path(path)
    if path.is_file() and not any(f.recognise(path) for f, _ in openers()
                                  if f is not TORCH_SAVE_FILE):
        return read_checkpoint_file(path)
    return open_checkpoint(path).whole()
