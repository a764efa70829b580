"""Checkpoint files: atomic saves, safe loads, and what a checkpoint holds.

Guarantees, and how they are kept:

* **A crash never damages the last good checkpoint.** A save writes a temporary
  file in the same directory, flushes and fsyncs it, then ``os.replace``-s it
  onto its final name (atomic on POSIX) and fsyncs the directory. The
  ``last_checkpoint`` pointer is written the same way, after the checkpoint it
  names. Older checkpoints are pruned (``keep_last``) only after both succeed.
* **Loading never executes code from the file.** Every load is
  ``torch.load(path, weights_only=True, map_location='cpu')``, admitting besides
  tensors only the few types MMEngine's checkpoints hold
  (:mod:`flexgraph.training.mmengine_ckpt`); a file that needs more is refused
  with :class:`UnsafeCheckpointError`, with no unsafe retry.
* **Resume is exact.** A checkpoint holds the model (unwrapped), the optimizer
  wrapper, the parameter schedulers (as plain data, see
  :mod:`flexgraph.training.state`), the loop position (epoch, global iteration,
  batch index inside the epoch) and the RNG states of *every* rank.
* **One writer.** Rank 0 writes, every rank reads; with a process group, a
  barrier follows each save so no rank reads a file that is not there yet.

The file layout is MMEngine's where MMEngine has one (``meta``, ``state_dict``,
``optimizer``, ``param_schedulers``), so MMEngine tools can read the weights.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import pickle
import re
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import torch

from flexgraph.training.config import CheckpointPolicy
from flexgraph.training.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    UnsafeCheckpointError,
)
from flexgraph.training.mmengine_ckpt import allow_mmengine_types
from flexgraph.training.model_api import unwrap_model
from flexgraph.training.state import from_plain, gather_rng_states, to_plain

__all__ = [
    "POINTER_NAME",
    "Checkpointer",
    "apply_weights",
    "atomic_write",
    "build_checkpoint",
    "load_checkpoint_file",
    "model_weights",
    "restore_schedulers",
]

POINTER_NAME = "last_checkpoint"
_CHECKPOINT_NAME = re.compile(r"^(epoch|iter)_\d+\.pth$")
_TEMP_PREFIX = ".tmp-"


def _flexgraph_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("flexgraph")
    except Exception:  # not installed as a distribution (e.g. a source checkout)
        import flexgraph

        return getattr(flexgraph, "__version__", None)


def _dist_ready() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def load_checkpoint_file(path: str | os.PathLike[str]) -> Any:
    """Read a checkpoint with ``weights_only=True`` onto the CPU.

    Raises
    ------
    CheckpointNotFoundError
        ``path`` does not exist.
    UnsafeCheckpointError
        The file holds objects other than tensors and plain containers (such a
        file could run code when unpickled); it is refused, never retried unsafely.
    CheckpointError
        The file is truncated or not a checkpoint at all.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointNotFoundError(f"checkpoint {str(path)!r} does not exist")
    try:
        with allow_mmengine_types():
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        detail = next((line.strip() for line in str(exc).splitlines()
                       if "GLOBAL" in line or "Unsupported" in line), "")
        raise UnsafeCheckpointError(
            f"refused to load {str(path)!r}: it contains objects other than tensors and "
            f"plain containers, and flexgraph only loads checkpoints with "
            f"torch.load(weights_only=True). {detail} If you trust the file, re-save "
            f"just its tensors (e.g. torch.save(obj.state_dict(), ...)) and load that."
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        raise CheckpointError(
            f"cannot read checkpoint {str(path)!r} (truncated or not a torch.save "
            f"file?): {str(exc).splitlines()[0]}"
        ) from exc


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not every filesystem lets a dir be fsynced
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Write ``path`` via a same-directory temp file, fsync, and ``os.replace``."""
    tmp = path.with_name(_TEMP_PREFIX + path.name)
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)


def model_weights(model: torch.nn.Module) -> dict[str, Any]:
    """The state dict of the user's module (never DDP's ``module.``-prefixed one)."""
    return unwrap_model(model).state_dict()


def build_checkpoint(*, model: torch.nn.Module, optim_wrapper: Any,
                     param_schedulers: Sequence[Any], epoch: int, iteration: int,
                     batch_idx: int, seed: int | None) -> dict[str, Any]:
    """Everything needed to continue training exactly from this point.

    A collective when a process group exists (RNG states are gathered from all
    ranks), so every rank calls it; only rank 0 then writes the result.

    ``epoch`` counts completed epochs, ``iteration`` completed iterations, and
    ``batch_idx`` the batches of epoch ``epoch`` already trained on.
    """
    dist = _dist_ready()
    return {
        "meta": {
            "flexgraph_version": _flexgraph_version(),
            "torch_version": str(torch.__version__),
            "time": datetime.datetime.now().isoformat(timespec="seconds"),
            "world_size": torch.distributed.get_world_size() if dist else 1,
            "epoch": int(epoch),
            "iter": int(iteration),
            "batch_idx": int(batch_idx),
            "seed": seed,
        },
        "state_dict": model_weights(model),
        "optimizer": optim_wrapper.state_dict() if optim_wrapper is not None else None,
        "param_schedulers": [to_plain(s.state_dict()) for s in param_schedulers],
        "rng_states": gather_rng_states(),
    }


def restore_schedulers(param_schedulers: Sequence[Any], states: Sequence[Any]) -> None:
    """Load plain scheduler states saved by :func:`build_checkpoint`."""
    if len(states) != len(param_schedulers):
        raise CheckpointError(
            f"the checkpoint has {len(states)} parameter schedulers but the config "
            f"builds {len(param_schedulers)}; resume with the config it was saved with"
        )
    for scheduler, state in zip(param_schedulers, states, strict=True):
        scheduler.load_state_dict(from_plain(state))


def _weights_in(checkpoint: Any, path: str) -> Mapping[str, Any]:
    if isinstance(checkpoint, Mapping):
        for key in ("state_dict", "model"):
            inner = checkpoint.get(key)
            if isinstance(inner, Mapping) and inner and all(
                isinstance(v, torch.Tensor) for v in inner.values()
            ):
                return inner
        if checkpoint and all(isinstance(v, torch.Tensor) for v in checkpoint.values()):
            return checkpoint  # a raw state_dict
    keys = sorted(checkpoint)[:8] if isinstance(checkpoint, Mapping) else type(checkpoint)
    raise CheckpointError(
        f"{path!r} holds no model weights (found {keys}); load_from takes a flexgraph / "
        f"MMEngine checkpoint (weights under 'state_dict') or a raw state_dict file"
    )


def apply_weights(model: torch.nn.Module, checkpoint: Any, path: str, *,
                  strict: bool, logger: Any = None) -> None:
    """Load the weights in ``checkpoint`` into ``model`` (unwrapped).

    A ``module.`` prefix (from a DDP-wrapped save) is stripped. Non-strict loading
    (``load_from``, as in MMEngine) logs missing and unexpected keys but refuses a
    file none of whose keys match, which is a wrong file, not a fine-tuning start.
    """
    weights = {k.removeprefix("module."): v for k, v in _weights_in(checkpoint, path).items()}
    target = unwrap_model(model)
    if not strict and not set(weights) & set(target.state_dict()):
        raise CheckpointError(
            f"none of the {len(weights)} weights in {path!r} match a parameter of "
            f"{type(target).__name__} (e.g. {next(iter(weights))!r}); is it the right file?"
        )
    try:
        result = target.load_state_dict(weights, strict=strict)
    except RuntimeError as exc:
        raise CheckpointError(f"cannot load {path!r} into {type(target).__name__}: "
                              f"{exc}") from exc
    if logger is not None and (result.missing_keys or result.unexpected_keys):
        logger.warning(f"load_from {path}: missing keys {result.missing_keys}, "
                       f"unexpected keys {result.unexpected_keys}")


class Checkpointer:
    """Saves and finds the run's checkpoints in ``work_dir``.

    Parameters
    ----------
    work_dir:
        Where checkpoints and the ``last_checkpoint`` pointer live (created on
        the first save, not before).
    policy:
        When to save and how many to keep (:class:`CheckpointPolicy`).
    rank:
        Only rank 0 touches the filesystem.
    """

    def __init__(self, work_dir: str | os.PathLike[str], policy: CheckpointPolicy | None = None,
                 *, rank: int = 0) -> None:
        self.work_dir = Path(work_dir)
        self.policy = policy or CheckpointPolicy()
        self.rank = rank
        self.saved: list[str] = []  # names this run (and the runs it resumed) wrote

    # -- when ---------------------------------------------------------------------
    def due_after_iter(self, iters_done: int) -> bool:
        """An iteration-interval save is due after ``iters_done`` iterations."""
        p = self.policy
        return p.enabled and not p.by_epoch and p.interval > 0 and iters_done % p.interval == 0

    def due_after_epoch(self, epochs_done: int) -> bool:
        """An epoch-interval save is due after ``epochs_done`` epochs (epoch loops)."""
        p = self.policy
        return p.enabled and p.by_epoch and p.interval > 0 and epochs_done % p.interval == 0

    @property
    def save_last(self) -> bool:
        return self.policy.enabled and self.policy.save_last

    # -- write --------------------------------------------------------------------
    def save(self, checkpoint: dict[str, Any], filename: str) -> Path:
        """Write ``checkpoint`` as ``work_dir/filename`` atomically, then prune.

        ``checkpoint['meta']['saved_checkpoints']`` is updated to include this
        file, so a resumed run continues pruning the files this run wrote (and
        never files it did not write).
        """
        path = self.work_dir / filename
        saved = [name for name in self.saved if name != filename] + [filename]
        limit = self.policy.keep_last
        doomed = saved[:-limit] if 0 < limit < len(saved) else []
        saved = saved[len(doomed):]
        checkpoint.setdefault("meta", {})["saved_checkpoints"] = list(saved)
        if self.rank == 0:
            self.work_dir.mkdir(parents=True, exist_ok=True)
            for stale in self.work_dir.glob(_TEMP_PREFIX + "*"):  # left by a killed save
                with contextlib.suppress(OSError):
                    stale.unlink()
            atomic_write(path, lambda f: torch.save(checkpoint, f))
            pointer = str(path.resolve()).encode()
            atomic_write(self.work_dir / POINTER_NAME, lambda f: f.write(pointer))
            for old in doomed:  # only now that the new checkpoint is safely in place
                with contextlib.suppress(FileNotFoundError):
                    (self.work_dir / old).unlink()
        self.saved = saved
        if _dist_ready():
            torch.distributed.barrier()
        return path

    # -- read ---------------------------------------------------------------------
    def load(self, path: str | os.PathLike[str]) -> Any:
        """:func:`load_checkpoint_file` (kept as a method so strategies can override)."""
        return load_checkpoint_file(path)

    def latest(self) -> Path | None:
        """The newest complete checkpoint in ``work_dir``, or ``None``.

        The ``last_checkpoint`` pointer wins when it names a complete file;
        otherwise (pointer missing, or the file it names was removed) the newest
        ``epoch_*.pth`` / ``iter_*.pth`` that is a complete zip archive is used.
        """
        pointer = self.work_dir / POINTER_NAME
        if pointer.is_file():
            named = Path(pointer.read_text().strip())
            for candidate in (named, self.work_dir / named.name):
                if _is_complete(candidate):
                    return candidate
        if not self.work_dir.is_dir():
            return None
        found = [p for p in self.work_dir.iterdir() if _CHECKPOINT_NAME.match(p.name)]
        for candidate in sorted(found, key=lambda p: p.stat().st_mtime_ns, reverse=True):
            if _is_complete(candidate):
                return candidate
        return None

    def restore_saved(self, checkpoint: Mapping[str, Any]) -> None:
        """Continue ``keep_last`` pruning with the files the resumed run wrote."""
        names = checkpoint.get("meta", {}).get("saved_checkpoints", [])
        self.saved = [n for n in names if (self.work_dir / n).is_file()]


def _is_complete(path: Path) -> bool:
    """A torch.save file is a zip archive: a truncated one has no central directory."""
    return path.is_file() and zipfile.is_zipfile(path)
