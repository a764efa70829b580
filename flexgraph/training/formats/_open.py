"""Opening a checkpoint of any format, by the opener of the format it holds.

A strategy adds its openers through :data:`OPENER_ENTRY_POINTS`, imported only
when a path of its format is opened, so this layer never imports a strategy.
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

OPENER_ENTRY_POINTS = "flexgraph.checkpoint_openers"
"""The entry-point group of strategies' openers, each named by its format's ``key``."""

Opener = Callable[[Path], CheckpointSource]
"""Opens a checkpoint of one format for reading one tensor at a time."""

def open_portable_directory(path: Path) -> CheckpointSource:
    """A portable checkpoint opened as a DCP directory, its weights under ``state_dict``."""
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
    """Each format that opens, with its opener: flexgraph's, then the strategies'."""
    by_key = {f.key: f for f in known_formats()}
    return _BUILT_IN + tuple((by_key[ep.name], _added(ep))
                             for ep in entry_points(group=OPENER_ENTRY_POINTS)
                             if ep.name in by_key)


def unrecognised_by(path: Path, formats: Iterable[CheckpointFormat]) -> str:
    """One line: ``path`` is in none of ``formats``, and what is wrong with it if that shows.

    Parameters
    ----------
    path : Path
    formats : iterable of CheckpointFormat

    Returns
    -------
    str
    """
    found = file_problem(path, verify=False) if path.is_file() else None
    line = unrecognised(path, formats, what="checkpoint")
    return line + (f" ({found})" if found else "")


def open_checkpoint(path: str | Path, *, held: CheckpointFormat | None = None
                    ) -> CheckpointSource:
    """The checkpoint at ``path`` opened by the opener of its format.

    Parameters
    ----------
    path
    held
        What ``path`` holds (``None``: unknown).

    Returns
    -------
    CheckpointSource
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

    Parameters
    ----------
    path
    held

    Returns
    -------
    Any
    """
    path = Path(path)
    if held is None:
        held = next((f for f, _ in openers() if f.recognise(path)), None)
    if path.is_file() and held in (None, TORCH_SAVE_FILE):
        return read_checkpoint_file(path)
    return open_checkpoint(path, held=held).whole()
