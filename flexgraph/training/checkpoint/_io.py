"""Checkpoint state IO: three small interfaces, one implementation per storage format.

The loop and the ``resume`` step never write or read model and optimizer state
themselves. They hand live objects to a :class:`CheckpointIO`, which decides
what the state *is* (a full ``state_dict``, one shard per rank, an engine's own
files) and how it reaches the disk and comes back. A strategy that shards the
model picks another IO (``Configure('build_checkpointer', io=...)``) instead of
branching in the loop: ``FileCheckpointIO`` (one file, written by rank 0),
``DistributedCheckpointIO`` (torch.distributed.checkpoint: every rank writes
its shards), ``PortableCheckpointIO`` and DeepSpeed's engine are the
implementations.

What the run asks of a format comes in three parts, each an abstract class of
its own, so that no class inherits a method it cannot do:
:class:`CheckpointWriter` (a save), :class:`CheckpointRestorer` (``resume``)
and :class:`WeightLoader` (``load_from``). A :class:`CheckpointIO` is all
three; a class that restores another strategy's format and never writes it
(``FileStateRestorer``) is a :class:`CheckpointRestorer` alone.

What a checkpoint is, under every IO: a dict with ``meta`` (loop position,
seed, versions), ``state_dict`` and ``optimizer`` (in the IO's own form, or
absent where an engine keeps them), ``param_schedulers``, ``rng_states`` (every
rank's) and whatever ``before_save_checkpoint`` hooks added. Hooks see and may
change that dict before it is written, and see it again after it is read,
before it is applied, as MMEngine's Runner does.

Every IO also *loads* weights (``load_from``) into the model it manages, from
each format it reads (:attr:`CheckpointIO.weight_formats`, recognised by
content once per load, see :mod:`flexgraph.training.formats`, and handed
down as ``held``): a whole model loads a full file with ``load_state_dict``,
a sharded one reads its own slices of the file, an engine loads through the
engine. The hooks see what was read (``on_read``) before it goes in,
wherever the format allows.

The vocabulary: a run *saves* and *restores* its checkpoints (the training
state); it *loads* weights from a path into a model.

The :class:`~flexgraph.training.checkpoint.Checkpointer` owns the rest, the
same for every IO: names, the atomic rename into place, the ``last_checkpoint``
pointer, finding the latest complete checkpoint and pruning old ones.
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

__all__ = [
    "NOTHING_READ",
    "CheckpointIO",
    "CheckpointRestorer",
    "CheckpointWriter",
    "OnRead",
    "WeightLoader",
    "refuse_unloadable",
]

OnRead = Callable[[dict[str, Any]], None]
"""Called with a checkpoint as read, before it goes in (``after_load_checkpoint``)."""

NOTHING_READ: dict[str, Any] = {"meta": {}, "state_dict": {}}
"""What the hooks see where a format loads straight into the model (DCP) or a rank
reads nothing (rank 0 reads for all)."""


class CheckpointWriter(abc.ABC):
    """What a save asks of a format: the training state in its form, written to disk.

    The :class:`~flexgraph.training.checkpoint.Checkpointer` calls every method
    on every rank; an implementation decides which ranks touch the disk, and
    :meth:`states` and :meth:`write` may be collectives.
    """

    suffix: ClassVar[str] = ".pth"
    """Appended to a checkpoint's stem (``iter_40``) to name it in the work_dir."""

    format: ClassVar[CheckpointFormat]
    """What :meth:`write` writes."""

    @abc.abstractmethod
    def states(self, model: Any, optim_wrapper: Any) -> dict[str, Any]:
        """The ``state_dict`` and ``optimizer`` entries of a checkpoint, in this format's form.

        Parameters
        ----------
        model
            The model as the run holds it (whole, wrapped, sharded, an engine).
        optim_wrapper
            MMEngine's optimizer wrapper, or ``None`` (a checkpoint of the weights alone).

        Returns
        -------
        dict
            ``state_dict`` and ``optimizer``; an entry that is ``None`` is left out,
            and one an engine writes itself is absent.
        """

    @abc.abstractmethod
    def write(self, checkpoint: dict[str, Any], path: Path, *, model: Any = None,
              optim_wrapper: Any = None) -> Any:
        """Write ``checkpoint`` at ``path``, a temporary name the checkpointer renames into place.

        Parameters
        ----------
        checkpoint
            The checkpoint dict: ``meta``, the :meth:`states` entries, the
            schedulers, every rank's RNG state, what hooks added.
        path
            A file or a directory to create (it does not exist yet).
        model, optim_wrapper
            The live objects, for a format whose engine writes its own state.

        Returns
        -------
        object or None
            ``None`` once everything is on disk. Or a background write, whose
            ``wait()`` returns once it is: the checkpointer puts the checkpoint
            in place only then.

        Raises
        ------
        Exception
            Whatever the storage raises. The checkpointer removes what was
            written under ``path`` and turns a full device into a
            :class:`~flexgraph.training.errors.DeviceFullError`.
        """

    def size_needed(self, checkpoint: dict[str, Any], *, model: Any = None,
                    optim_wrapper: Any = None) -> int:
        """About how many bytes :meth:`write` puts on disk for ``checkpoint`` (all ranks).

        What a full device's message says is needed: the tensors the checkpoint
        holds. An IO that keeps the states elsewhere (an engine) counts those.

        Parameters
        ----------
        checkpoint, model, optim_wrapper
            As :meth:`write` got them.

        Returns
        -------
        int
            Bytes, roughly.
        """
        return tensor_bytes(checkpoint)

    def remove(self, path: Path) -> None:
        """Delete the checkpoint at ``path`` (a file or a directory); absent is fine.

        Parameters
        ----------
        path
            A checkpoint of this format, or a partly written one.
        """
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


class CheckpointRestorer(abc.ABC):
    """What ``resume`` asks of a format: whether a path holds a whole checkpoint, and
    the checkpoint read back and put into the live objects.

    Every method is called on every rank; :meth:`read` and :meth:`apply` may be
    collectives.
    """

    format: ClassVar[CheckpointFormat]
    """What :meth:`read` restores from."""

    def recognises(self, path: Path) -> bool:
        """Whether ``path`` holds this format (by content, never by name).

        Parameters
        ----------
        path
            Where to look; a path that does not exist holds no format.

        Returns
        -------
        bool
        """
        return self.format.recognise(path)

    def foreign_format(self, path: Path) -> CheckpointFormat | None:
        """The other known format ``path`` holds: a checkpoint this restorer cannot restore.

        Parameters
        ----------
        path
            A would-be checkpoint, a file or a directory.

        Returns
        -------
        CheckpointFormat or None
            ``None`` when ``path`` is in this format, or in none that is known
            (damaged: :meth:`problem` says how).
        """
        if self.recognises(path):
            return None
        return format_of(path, [f for f in known_formats() if f != self.format])

    @abc.abstractmethod
    def is_complete(self, path: Path) -> bool:
        """Whether ``path`` holds a whole checkpoint of this format.

        Parameters
        ----------
        path
            A checkpoint of this format.

        Returns
        -------
        bool
        """

    def problem(self, path: Path) -> str | None:
        """What keeps ``path`` from being a whole checkpoint of this format, or ``None``.

        Cheap (no full read), since ``--resume auto`` asks it of every
        checkpoint in the work_dir to skip the damaged ones.

        Parameters
        ----------
        path
            A candidate checkpoint (``--resume``'s, or one found in the work_dir).

        Returns
        -------
        str or None
            One line that names ``path``; ``None`` when it can be restored.
        """
        other = self.foreign_format(path)
        if other is not None:
            return (f"checkpoint {str(path)!r} is {other.name}; this strategy restores "
                    f"{self.format.name}")
        return self.incomplete(path)

    def incomplete(self, path: Path) -> str | None:
        """What keeps ``path``, known to hold this format, from being whole, or ``None``.

        :meth:`problem` without asking what ``path`` holds: for a caller that
        recognised it already.

        Parameters
        ----------
        path
            A checkpoint of this format.

        Returns
        -------
        str or None
            One line that names ``path``; ``None`` when it can be restored.
        """
        return None if self.is_complete(path) else (
            f"checkpoint {str(path)!r} is incomplete (its save was interrupted?)")

    @abc.abstractmethod
    def read(self, path: Path, *, model: Any = None, optim_wrapper: Any = None) -> dict[str, Any]:
        """The checkpoint at ``path``, with its states in the form :meth:`apply` takes.

        The hooks see it (``after_load_checkpoint``) between the two calls.

        Parameters
        ----------
        path
            A whole checkpoint of this format (:meth:`problem` is ``None``).
        model, optim_wrapper
            The live objects, for a format that reads into them (shards, an engine).

        Returns
        -------
        dict
            The checkpoint dict, as :meth:`CheckpointWriter.write` got it.

        Raises
        ------
        CheckpointError
            ``path`` cannot be read, or does not fit ``model`` (one line naming it).
        """

    @abc.abstractmethod
    def apply(self, checkpoint: dict[str, Any], path: Path, *, model: Any,
              optim_wrapper: Any, strict: bool = True) -> None:
        """Put the checkpoint's model (and optimizer, when given) state into place.

        Parameters
        ----------
        checkpoint
            What :meth:`read` returned, as the hooks left it.
        path
            Where it was read from, for messages.
        model, optim_wrapper
            The live objects; ``optim_wrapper=None`` restores the weights alone.
        strict
            Whether every key must match, as ``load_state_dict``'s ``strict``.

        Raises
        ------
        CheckpointError
            The checkpoint's names or shapes do not fit the model or optimizer.
        """


class WeightLoader(abc.ABC):
    """What ``load_from`` asks of a format: weights from a path, into the model it manages."""

    weight_formats: ClassVar[tuple[CheckpointFormat, ...]]
    """What :meth:`load_weights` reads, in the order they are tried."""

    @abc.abstractmethod
    def load_weights(self, path: Path, model: Any, *, held: CheckpointFormat,
                     on_read: OnRead) -> WeightsLoaded:
        """Load the weights at ``path`` (one of :attr:`weight_formats`) into ``model``.

        Non-strictly, as ``load_from`` does: the keys left out are returned.
        May be a collective.

        Parameters
        ----------
        path
            A checkpoint in one of :attr:`weight_formats`.
        model
            The model as the run holds it at ``load_checkpoint`` (whole,
            sharded, an engine).
        held
            The format ``path`` holds, as the load recognised it
            (:func:`refuse_unloadable`'s answer): never asked again.
        on_read
            Called with the checkpoint as read, before the weights go in
            (:data:`NOTHING_READ` where a format loads straight into the model).

        Returns
        -------
        WeightsLoaded
            The model's keys the checkpoint lacks, its keys the model has no
            place for, and the tensors of another shape, left as they were.

        Raises
        ------
        CheckpointError
            ``path`` is damaged, or none of its weights fits ``model``.
        """


    def loader_of(self, held: CheckpointFormat) -> WeightLoader:
        """The loader that reads ``held`` itself: this one, or the one it hands ``held`` to.

        Parameters
        ----------
        held
            One of :attr:`weight_formats`.

        Returns
        -------
        WeightLoader
            This loader, unless it passes ``held`` on (the portable IO passes
            every other format to the strategy's own IO).
        """
        return self


class CheckpointIO(CheckpointWriter, CheckpointRestorer, WeightLoader):
    """One checkpoint format a strategy writes: saved, restored, and loaded as weights.

    The extension point a strategy configures
    (``Configure('build_checkpointer', io='module:Class')``): the three parts
    the run asks of a format, :class:`CheckpointWriter` (saves),
    :class:`CheckpointRestorer` (``resume``) and :class:`WeightLoader`
    (``load_from``), in one object. An implementation gives :meth:`states`,
    :meth:`write`, :meth:`read`, :meth:`apply`, :meth:`load_weights` and
    :meth:`is_complete`; the rest have defaults. A class that only restores
    (another strategy's format) is a :class:`CheckpointRestorer` alone.

    Every method is called on every rank; an implementation decides which
    ranks touch the disk.

    Examples
    --------
    An IO that keeps the weights in bfloat16 on disk (half the bytes), and
    restores them into the float32 model:

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
    """What :meth:`write` writes and :meth:`read` restores from."""

    weight_formats: ClassVar[tuple[CheckpointFormat, ...]] = (
        TORCH_SAVE_FILE, DCP_DIRECTORY, SAFETENSORS_FILE, DEEPSPEED_DIRECTORY)
    """What :meth:`load_weights` reads, in the order they are tried: besides its own
    formats, what other tools write, read whole by their openers
    (:func:`~flexgraph.training.formats.read_any_checkpoint`)."""


def refuse_unloadable(io: WeightLoader, path: Path, held: CheckpointFormat | None, *,
                      what: str) -> CheckpointFormat:
    """Raise unless ``io`` can try to load weights from ``path``, which holds ``held``.

    A path of a known format the IO does not read, a directory of no known
    format and a missing path are refused here, in one line naming the path (and
    the formats tried). A file of no known format goes on to the IO's loader as
    a ``torch.save`` file, whose reader says what it is (empty, truncated,
    safetensors, a plain pickle, ...) or refuses it as unsafe.

    Returns
    -------
    CheckpointFormat
        The format the IO reads ``path`` as: ``held``, or a ``torch.save`` file.

    Raises
    ------
    CheckpointNotFoundError
        ``path`` does not exist.
    CheckpointError
        ``path`` is in no format ``io`` loads.
    """
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
