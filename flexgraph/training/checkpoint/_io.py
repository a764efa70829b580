"""Checkpoint state IO: one interface, one implementation per storage format.

The loop and the ``resume`` step never write or read model and optimizer state
themselves. They hand live objects to a :class:`CheckpointIO`, which decides
what the state *is* (a full ``state_dict``, one shard per rank, an engine's own
files) and how it reaches the disk and comes back. A strategy that shards the
model picks another IO (``Configure('build_checkpointer', io=...)``) instead of
branching in the loop: :class:`FileCheckpointIO` (here: one file, written by
rank 0), ``DistributedCheckpointIO`` (torch.distributed.checkpoint: every rank
writes its shards) and DeepSpeed's engine are the implementations.

What a checkpoint is, under every IO: a dict with ``meta`` (loop position,
seed, versions), ``state_dict`` and ``optimizer`` (in the IO's own form, or
absent where an engine keeps them), ``param_schedulers``, ``rng_states`` (every
rank's) and whatever ``before_save_checkpoint`` hooks added. Hooks see and may
change that dict before it is written, and see it again after it is read,
before it is applied, as MMEngine's Runner does.

The :class:`~flexgraph.training.checkpoint.Checkpointer` owns the rest, the
same for every IO: names, the atomic rename into place, the ``last_checkpoint``
pointer, finding the latest complete checkpoint and pruning old ones.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import zipfile
from pathlib import Path
from typing import Any

import torch

__all__ = ["CheckpointIO", "FileCheckpointIO", "load_optimizer_state", "rank_of"]


def rank_of() -> int:
    """This process's global rank (0 without a process group)."""
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


class CheckpointIO:
    """How one checkpoint format is written, recognised and read back.

    Every method is called on every rank; an implementation decides which ranks
    touch the disk. ``write`` and ``read`` may be collectives.
    """

    suffix = ".pth"
    """Appended to a checkpoint's stem (``iter_40``) to name it in the work_dir."""

    def states(self, model: torch.nn.Module, optim_wrapper: Any) -> dict[str, Any]:
        """``state_dict`` and ``optimizer`` entries of a checkpoint, in this IO's form."""
        raise NotImplementedError

    def write(self, checkpoint: dict[str, Any], path: Path, *, model: Any = None,
              optim_wrapper: Any = None) -> None:
        """Write ``checkpoint`` at ``path`` (a temporary name; the caller renames it)."""
        raise NotImplementedError

    def read(self, path: Path, *, model: Any = None, optim_wrapper: Any = None) -> dict[str, Any]:
        """The checkpoint at ``path``, with its states in the form :meth:`apply` takes."""
        raise NotImplementedError

    def apply(self, checkpoint: dict[str, Any], path: Path, *, model: torch.nn.Module,
              optim_wrapper: Any, strict: bool = True) -> None:
        """Put the checkpoint's model (and optimizer, when given) state into place."""
        raise NotImplementedError

    def is_complete(self, path: Path) -> bool:
        """Whether ``path`` holds a whole checkpoint of this format."""
        raise NotImplementedError

    def problem(self, path: Path) -> str | None:
        """What keeps ``path`` from being a whole checkpoint of this format, or ``None``.

        One line that names ``path``; cheap (no full read), since ``--resume auto``
        asks it of every checkpoint in the work_dir to skip the damaged ones.
        """
        return None if self.is_complete(path) else (
            f"checkpoint {str(path)!r} is incomplete (its save was interrupted?)")

    def remove(self, path: Path) -> None:
        """Delete the checkpoint at ``path`` (a file or a directory); absent is fine."""
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


class FileCheckpointIO(CheckpointIO):
    """One ``torch.save`` file holding everything, written by rank 0.

    For models every rank holds in full (single device, DDP): the state is the
    unwrapped module's ``state_dict`` (no ``module.`` prefixes) and the optimizer
    wrapper's own ``state_dict``, MMEngine's layout, so MMEngine tools read it.
    Reading is :func:`~flexgraph.training.checkpoint.read_checkpoint_file`
    (``weights_only=True``) on every rank.
    """

    def states(self, model: torch.nn.Module, optim_wrapper: Any) -> dict[str, Any]:
        from flexgraph.training.checkpoint._weights import model_weights

        return {"state_dict": model_weights(model),
                "optimizer": optim_wrapper.state_dict() if optim_wrapper is not None else None}

    def write(self, checkpoint: dict[str, Any], path: Path, *, model: Any = None,
              optim_wrapper: Any = None) -> None:
        if rank_of() != 0:
            return
        with open(path, "wb") as f:
            torch.save(checkpoint, f)
            f.flush()
            os.fsync(f.fileno())

    def read(self, path: Path, *, model: Any = None, optim_wrapper: Any = None) -> dict[str, Any]:
        from flexgraph.training.checkpoint._files import read_checkpoint_file

        return read_checkpoint_file(path)

    def apply(self, checkpoint: dict[str, Any], path: Path, *, model: torch.nn.Module,
              optim_wrapper: Any, strict: bool = True) -> None:
        from flexgraph.training.checkpoint._weights import apply_weights

        apply_weights(model, checkpoint, str(path), strict=strict)
        if optim_wrapper is not None and checkpoint.get("optimizer") is not None:
            load_optimizer_state(optim_wrapper, checkpoint["optimizer"], path)

    def is_complete(self, path: Path) -> bool:
        """A torch.save file is a zip archive: a truncated one has no central directory."""
        return path.is_file() and zipfile.is_zipfile(path)

    def problem(self, path: Path) -> str | None:
        from flexgraph.training.checkpoint._files import file_problem

        found = file_problem(path, verify=False)  # CRCs are checked when it is read
        if found is None and not self.is_complete(path):
            found = f"checkpoint {str(path)!r} is not a zip archive (torch.save's format)"
        return found


def load_optimizer_state(optim_wrapper: Any, state: Any, path: Path) -> None:
    """``optim_wrapper.load_state_dict(state)``; a mismatch names the checkpoint."""
    from flexgraph.training.errors import CheckpointError

    try:
        optim_wrapper.load_state_dict(state)
    except (ValueError, KeyError, TypeError, IndexError, RuntimeError) as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f"cannot load the optimizer state of {str(path)!r}: {detail}; resume with the "
            f"model and optimizer config it was saved with") from exc
