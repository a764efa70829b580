"""Checkpoint state IO: three small interfaces, one implementation per storage format.

A strategy picks its IO with ``Configure('build_checkpointer', io=...)``; the
parts are separate so that none inherits a method it cannot do. Under every IO
a checkpoint is a dict with ``meta``, ``state_dict``, ``optimizer`` (absent
where an engine keeps it), ``param_schedulers``, ``rng_states`` and hook extras.
"""

from __future__ import annotations

import abc
import contextlib
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from flexgraph.training.checkpoint._space import tensor_bytes
from flexgraph.training.checkpoint._weights import WeightsLoaded
from flexgraph.training.errors import CheckpointError, CheckpointNotFoundError
from flexgraph.training.formats import (
    DCP_DIRECTORY,
    DEEPSPEED_DIRECTORY,
    SAFETENSORS_FILE,
    TORCH_SAVE_FILE,
    CheckpointFormat,
    directory_problem,
    format_of,
    known_formats,
    unrecognised,
)

OnRead = Callable[[dict[str, Any]], None]
"""Called with a checkpoint as read, before it goes in (``after_load_checkpoint``)."""

NOTHING_READ: dict[str, Any] = {"meta": {}, "state_dict": {}}
"""What the hooks see where a format loads straight into the model or a rank reads nothing."""


class CheckpointWriter(abc.ABC):
    """What a save asks of a format (on every rank): the training state, written to disk."""

    suffix: ClassVar[str] = ".pth"
    """Appended to a checkpoint's stem (``iter_40``)."""

    format: ClassVar[CheckpointFormat]

    @abc.abstractmethod
    def states(self, model: Any, optim_wrapper: Any) -> dict[str, Any]:
        """The checkpoint's ``state_dict`` and ``optimizer`` entries (``None``: left out)."""

    @abc.abstractmethod
    def write(self, checkpoint: dict[str, Any], path: Path, *, model: Any = None,
              optim_wrapper: Any = None) -> Any:
        """Write ``checkpoint`` at ``path`` (a temporary name); ``None`` once on disk, or a
        background write whose ``wait()`` returns once it is."""

    def size_needed(self, checkpoint: dict[str, Any], *, model: Any = None,
                    optim_wrapper: Any = None) -> int:
        """About how many bytes :meth:`write` puts on disk (all ranks)."""
        return tensor_bytes(checkpoint)

    def remove(self, path: Path) -> None:
        """Delete the checkpoint at ``path``, whole or partly written; absent is fine."""
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


class CheckpointRestorer(abc.ABC):
    """What ``resume`` asks of a format (on every rank): is a checkpoint whole, and reading it."""

    format: ClassVar[CheckpointFormat]

    def foreign_format(self, path: Path) -> CheckpointFormat | None:
        """The other known format ``path`` holds, or ``None`` (this format, or none known)."""
        if self.format.recognise(path):
            return None
        return format_of(path, [f for f in known_formats() if f != self.format])

    @abc.abstractmethod
    def is_complete(self, path: Path) -> bool:
        """Whether ``path`` holds a whole checkpoint of this format."""

    def problem(self, path: Path) -> str | None:
        """What keeps ``path`` from being a whole checkpoint, or ``None``; cheap."""
        other = self.foreign_format(path)
        if other is not None:
            return (f"checkpoint {str(path)!r} is {other.name}; this strategy restores "
                    f"{self.format.name}")
        return self.incomplete(path)

    def incomplete(self, path: Path) -> str | None:
        """:meth:`problem` for a ``path`` already known to hold this format."""
        return None if self.is_complete(path) else (
            f"checkpoint {str(path)!r} is incomplete (its save was interrupted?)")

    @abc.abstractmethod
    def read(self, path: Path, *, model: Any = None, optim_wrapper: Any = None) -> dict[str, Any]:
        """The checkpoint at ``path`` in the form :meth:`apply` takes; hooks see it between."""

    @abc.abstractmethod
    def apply(self, checkpoint: dict[str, Any], path: Path, *, model: Any,
              optim_wrapper: Any, strict: bool = True) -> None:
        """Put the checkpoint's model (and optimizer, when given) state into place."""


class WeightLoader(abc.ABC):
    """What ``load_from`` asks of a format: weights from a path, into the model it manages."""

    weight_formats: ClassVar[tuple[CheckpointFormat, ...]]
    """What :meth:`load_weights` reads, in the order they are tried."""

    @abc.abstractmethod
    def load_weights(self, path: Path, model: Any, *, held: CheckpointFormat,
                     on_read: OnRead) -> WeightsLoaded:
        """Load the weights at ``path`` (of format ``held``) into ``model``, non-strictly;
        ``on_read`` sees the checkpoint as read before the weights go in."""


    def loader_of(self, held: CheckpointFormat) -> WeightLoader:
        """The loader that reads ``held`` itself: this one, or the one it hands ``held`` to."""
        return self


class CheckpointIO(CheckpointWriter, CheckpointRestorer, WeightLoader):
    """One checkpoint format a strategy writes: saved, restored, and loaded as weights.

    Examples
    --------
    An IO that keeps the weights in bfloat16 on disk and restores them into the
    float32 model:

    >>> import tempfile
    >>> import torch
    >>> from flexgraph.training.checkpoint import Checkpointer, FileCheckpointIO
    >>> class HalfWeightsIO(FileCheckpointIO):
    ...     def states(self, model, optim_wrapper):
    ...         states = super().states(model, optim_wrapper)
    ...         states["state_dict"] = {k: v.to(torch.bfloat16)
    ...                                 for k, v in states["state_dict"].items()}
    ...         return states
    >>> checkpointer = Checkpointer(tempfile.mkdtemp(), io=HalfWeightsIO())
    >>> model = torch.nn.Linear(4, 2)
    >>> saved = checkpointer.snapshot(model=model, optim_wrapper=None, param_schedulers=None,
    ...                               epoch=0, iteration=3, batch_idx=3, seed=0)
    >>> path = checkpointer.save(saved, "iter_3")
    >>> path.name, checkpointer.latest() == path
    ('iter_3.pth', True)
    >>> read = checkpointer.read(path)
    >>> read["state_dict"]["weight"].dtype
    torch.bfloat16
    >>> checkpointer.apply(read, path, model=model, optim_wrapper=None)
    >>> model.weight.dtype
    torch.float32
    """

    format: ClassVar[CheckpointFormat] = TORCH_SAVE_FILE

    weight_formats: ClassVar[tuple[CheckpointFormat, ...]] = (
        TORCH_SAVE_FILE, DCP_DIRECTORY, SAFETENSORS_FILE, DEEPSPEED_DIRECTORY)
    """Its own formats, then what other tools write, read whole by their openers."""


def refuse_unloadable(io: WeightLoader, path: Path, held: CheckpointFormat | None, *,
                      what: str) -> CheckpointFormat:
    """The format ``io`` reads ``path`` as, or a refusal naming it; a file of no known format
    goes on as a ``torch.save`` file, whose reader says what it is."""
    if not path.exists():
        raise CheckpointNotFoundError(f"{what} {str(path)!r} does not exist")
    formats = io.weight_formats
    if held is not None and held not in formats:
        raise CheckpointError(unrecognised(path, formats, what=what))
    if held is None and path.is_dir():
        raise CheckpointError(directory_problem(path))
    if held is None and TORCH_SAVE_FILE not in formats:
        raise CheckpointError(unrecognised(path, formats, what=what))
    return held or TORCH_SAVE_FILE
