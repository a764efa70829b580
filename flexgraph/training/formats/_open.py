"""Opening a checkpoint of any format, by the opener of the format it holds.

An *opener* is ``path -> CheckpointSource``: the checkpoint opened for reading
one tensor at a time (:class:`~flexgraph.training.formats.CheckpointSource`).
flexgraph has the openers of its own formats (a ``torch.save`` file, a DCP
directory) and of safetensors files; a strategy adds the opener of its format
through the :data:`OPENER_ENTRY_POINTS` group (DeepSpeed's directories), so
this layer never imports a strategy. An added opener is imported only when a
path of its format is opened: reading a ``torch.save`` file loads no plugin.

:func:`read_any_checkpoint` reads a checkpoint of any of these formats whole,
for ``load_from``; :func:`open_checkpoint` opens one for ``flexgraph ckpt
convert``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

from flexgraph.training.errors import CheckpointError, CheckpointNotFoundError
from flexgraph.training.formats._recognise import (
    DCP_DIRECTORY,
    PORTABLE_DIRECTORY,
    SAFETENSORS_FILE,
    TORCH_SAVE_FILE,
    CheckpointFormat,
    known_formats,
    unrecognised,
)
from flexgraph.training.formats._safetensors import open_safetensors_file
from flexgraph.training.formats._source import (
    CheckpointSource,
    open_dcp_directory,
    open_torch_file,
)
from flexgraph.training.formats._torch_file import file_problem, read_checkpoint_file

__all__ = ["OPENER_ENTRY_POINTS", "Opener", "open_checkpoint", "openers",
           "read_any_checkpoint", "unrecognised_by"]

OPENER_ENTRY_POINTS = "flexgraph.checkpoint_openers"
"""The entry-point group through which strategies add the openers of their formats: each
entry is named by its format's :attr:`~flexgraph.training.formats.CheckpointFormat.key`
and points at the opener (``path -> CheckpointSource``)."""

Opener = Callable[[Path], CheckpointSource]
"""Opens a checkpoint of one format for reading one tensor at a time."""

def open_portable_directory(path: Path) -> CheckpointSource:
    """A portable checkpoint directory, opened as the DCP directory it is.

    Its weights are saved under ``model``; they are offered under
    ``state_dict``, where MMEngine's files and its tools keep them, so that
    ``flexgraph ckpt convert`` writes a file MMEngine's ``load_checkpoint`` reads.
    """
    source = open_dcp_directory(path)
    layout = {k: v for k, v in source.layout.items() if k not in ("model", "state_dict")}
    layout["state_dict"] = source.layout.get("model", {})

    def fetch(key: Any) -> Any:
        return source.fetch(("model", *key[1:]) if key[:1] == ("state_dict",) else key)

    return CheckpointSource(path, PORTABLE_DIRECTORY.name, layout, fetch)


_BUILT_IN: tuple[tuple[CheckpointFormat, Opener], ...] = (
    (TORCH_SAVE_FILE, open_torch_file),
    (DCP_DIRECTORY, open_dcp_directory),
    (SAFETENSORS_FILE, open_safetensors_file),
    (PORTABLE_DIRECTORY, open_portable_directory),
)


def _added(entry: EntryPoint) -> Opener:
    """The opener an entry point names, imported when it first opens a path."""

    def open_path(path: Path) -> CheckpointSource:
        return entry.load()(path)

    return open_path


def openers() -> tuple[tuple[CheckpointFormat, Opener], ...]:
    """Each format that opens, with its opener: flexgraph's, then those strategies add.

    An added opener counts when its entry point is named by a known format's
    key; its module is imported only when it opens a path.
    """
    by_key = {f.key: f for f in known_formats()}
    return _BUILT_IN + tuple((by_key[ep.name], _added(ep))
                             for ep in entry_points(group=OPENER_ENTRY_POINTS)
                             if ep.name in by_key)


def unrecognised_by(path: Path, formats: Iterable[CheckpointFormat]) -> str:
    """One line: ``path`` is in none of ``formats``, and what is wrong with it if that shows.

    Parameters
    ----------
    path : Path
        The path.
    formats : iterable of CheckpointFormat
        The formats that were tried.

    Returns
    -------
    str
        One line.
    """
    found = file_problem(path, verify=False) if path.is_file() else None
    line = unrecognised(path, formats, what="checkpoint")
    return line + (f" ({found})" if found else "")


def open_checkpoint(path: str | Path, *, held: CheckpointFormat | None = None
                    ) -> CheckpointSource:
    """The checkpoint at ``path`` opened by the opener of its format (by content).

    Parameters
    ----------
    path
        A checkpoint of any format that opens (see :func:`openers`).
    held
        What ``path`` holds, when the caller asked :func:`format_of` already:
        its opener opens it, nothing is asked again. ``None``: asked here.

    Returns
    -------
    CheckpointSource
        Its layout (every tensor a meta tensor) and a fetch of one tensor at a time.

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
    opener = next((o for f, o in known if (f is held if held is not None
                                           else f.recognise(path))), None)
    if opener is None:
        raise CheckpointError(unrecognised_by(path, [f for f, _ in known]))
    return opener(path)


def read_any_checkpoint(path: str | Path, *, held: CheckpointFormat | None = None) -> Any:
    """The checkpoint at ``path`` read whole onto the CPU, whatever its format (``load_from``).

    A ``torch.save`` file, or a file of no known format, is
    :func:`~flexgraph.training.formats.read_checkpoint_file`'s (which says
    what is wrong with a damaged one); any other format is opened by its
    opener and read whole, in flexgraph's layout (the weights under
    ``state_dict``).

    Parameters
    ----------
    path
        A checkpoint file or directory of any format that opens.
    held
        What ``path`` holds, when the caller asked :func:`format_of` already
        (nothing is asked again); ``None``: asked here.

    Returns
    -------
    Any
        What a ``torch.save`` file holds; for another format, its checkpoint dict.

    Raises
    ------
    CheckpointNotFoundError
        ``path`` does not exist.
    UnsafeCheckpointError
        A ``torch.save`` file holds objects that are not safe to unpickle.
    CheckpointError
        ``path`` is in no format that opens, or is damaged (one line naming it).
    """
    path = Path(path)
    if held is None:
        held = next((f for f, _ in openers() if f.recognise(path)), None)
    if path.is_file() and held in (None, TORCH_SAVE_FILE):
        return read_checkpoint_file(path)
    return open_checkpoint(path, held=held).whole()
