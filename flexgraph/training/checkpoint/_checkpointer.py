"""Checkpoints: atomic saves, safe restores, and what a checkpoint holds.

What is the same for every :class:`CheckpointIO`: a crash never damages the last
good checkpoint (a save is written under a temporary name and renamed once every
rank is done; the pointer follows, pruning comes last).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from io import BytesIO
from pathlib import Path
from typing import IO, Any

import attrs
import torch

from flexgraph.training.checkpoint._file import FileCheckpointIO
from flexgraph.training.checkpoint._io import (
    CheckpointIO,
    CheckpointRestorer,
    OnRead,
    WeightLoader,
    refuse_unloadable,
)
from flexgraph.training.checkpoint._space import device_full_error
from flexgraph.training.checkpoint._state import from_plain, to_plain
from flexgraph.training.checkpoint._weights import WeightsLoaded, local_checksums
from flexgraph.training.components import unwrap_model
from flexgraph.training.config import CheckpointPolicy
from flexgraph.training.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    DeviceFullError,
    ForeignCheckpointError,
)
from flexgraph.training.formats import CheckpointFormat, format_of, read_checkpoint_file
from flexgraph.training.runtime import (
    barrier,
    first_error_of_all_ranks,
    gather_rng_states,
    world_size,
)

POINTER_NAME = "last_checkpoint"
_CHECKPOINT_NAME = re.compile(r"^(epoch|iter)_\d+(\.[A-Za-z0-9]+)?$")
_TEMP_PREFIX = ".tmp-"


def _flexgraph_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("flexgraph")
    except Exception:  # not installed as a distribution (e.g. a source checkout)
        import flexgraph

        return getattr(flexgraph, "__version__", None)


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


def checkpoint_meta(*, epoch: int, iteration: int, batch_idx: int, seed: int | None,
                    data_pass: int | None = None) -> dict[str, Any]:
    """The ``meta`` entry: where the loop stands (``data_pass`` defaults to ``epoch``), and
    what wrote the checkpoint."""
    return {
        "flexgraph_version": _flexgraph_version(),
        "torch_version": str(torch.__version__),
        "time": datetime.datetime.now().isoformat(timespec="seconds"),
        "world_size": world_size(),
        "epoch": int(epoch),
        "iter": int(iteration),
        "batch_idx": int(batch_idx),
        "data_pass": int(epoch if data_pass is None else data_pass),
        "seed": seed,
    }


def _scheduler_states(param_schedulers: Any) -> Any:
    """Plain scheduler states, laid out as MMEngine saves them."""
    if isinstance(param_schedulers, Mapping):
        return {name: [to_plain(s.state_dict()) for s in group]
                for name, group in param_schedulers.items()}
    return [to_plain(s.state_dict()) for s in param_schedulers]


def restore_schedulers(param_schedulers: Any, states: Any) -> None:
    """Load plain scheduler states saved by :meth:`Checkpointer.snapshot`.

    Parameters
    ----------
    param_schedulers : list or Mapping
    states : list or Mapping
        In the same shape.
    """
    if isinstance(param_schedulers, Mapping) or isinstance(states, Mapping):
        mine = dict(param_schedulers) if isinstance(param_schedulers, Mapping) else {}
        saved = dict(states) if isinstance(states, Mapping) else {}
        if set(mine) != set(saved):
            raise CheckpointError(
                f"the checkpoint has parameter schedulers for optimizers {sorted(saved)} but "
                f"the config builds them for {sorted(mine)}; resume with the config it was "
                f"saved with")
        for name, group in mine.items():
            restore_schedulers(group, saved[name])
        return
    if len(states) != len(param_schedulers):
        raise CheckpointError(
            f"the checkpoint has {len(states)} parameter schedulers but the config "
            f"builds {len(param_schedulers)}; resume with the config it was saved with"
        )
    for scheduler, state in zip(param_schedulers, states, strict=True):
        scheduler.load_state_dict(from_plain(state))


@attrs.frozen
class _PendingSave:
    """A save written (or being written) under ``temp``, not yet in place."""

    write: Any  # the IO's background write (``wait()``), or None
    temp: Path
    path: Path
    keep: bool
    saved: list[str]
    doomed: list[str]


class Checkpointer:
    """Saves, finds and restores the run's checkpoints in ``work_dir``; loads weights.

    Parameters
    ----------
    work_dir : str or os.PathLike
    policy : CheckpointPolicy, optional
    rank : int
        Only rank 0 renames, points and prunes.
    io : CheckpointIO, optional
        The format this run writes (default :class:`FileCheckpointIO`).
    restorers : sequence of CheckpointRestorer, optional
        Other formats ``--resume`` restores from.
    """

    def __init__(self, work_dir: str | os.PathLike[str], policy: CheckpointPolicy | None = None,
                 *, rank: int = 0, io: CheckpointIO | None = None,
                 restorers: Sequence[CheckpointRestorer] = ()) -> None:
        self.work_dir = Path(work_dir)
        self.policy = policy or CheckpointPolicy()
        self.rank = rank
        self.io = io or FileCheckpointIO()
        self.restorers = tuple(r for r in restorers if r.format != self.io.format)
        self.saved: list[str] = []  # names this run (and the runs it resumed) wrote
        self._pending: _PendingSave | None = None  # written, not yet in place
        self.loaded: WeightsLoaded | None = None  # the last load_weights, with its checksums

    def snapshot(self, *, model: torch.nn.Module, optim_wrapper: Any,
                 param_schedulers: Any, epoch: int, iteration: int,
                 batch_idx: int, seed: int | None, data_pass: int | None = None,
                 rng_state: dict[str, Any] | None = None,
                 runtime_info: Mapping[str, Any] | None = None,
                 global_batch: int | None = None) -> dict[str, Any]:
        """Everything needed to continue training exactly from this point; a collective.

        ``optim_wrapper=None`` and ``param_schedulers=None`` leave those out (a best checkpoint);
        ``global_batch`` lets a resume at another world size keep it.
        """
        meta = checkpoint_meta(epoch=epoch, iteration=iteration, batch_idx=batch_idx,
                               seed=seed, data_pass=data_pass)
        if runtime_info:
            meta["runtime_info"] = to_plain(dict(runtime_info))
        if global_batch:
            meta["global_batch"] = int(global_batch)
        states = {k: v for k, v in self.io.states(model, optim_wrapper).items()
                  if v is not None}
        checkpoint = {"meta": meta, **states}
        if param_schedulers is not None:
            checkpoint["param_schedulers"] = _scheduler_states(param_schedulers)
            checkpoint["rng_states"] = gather_rng_states(rng_state)
        return checkpoint

    def save(self, checkpoint: dict[str, Any], stem: str, *, model: Any = None,
             optim_wrapper: Any = None, keep: bool = True) -> Path:
        """Write ``checkpoint`` as ``work_dir/<stem><io.suffix>`` atomically, then prune.

        ``meta['saved_checkpoints']`` records it, so a resumed run prunes only what
        runs wrote; ``keep=False`` (a best checkpoint) is neither counted nor pointed to.
        A collective.
        """
        self.finish_pending()  # the previous save's background write, before any sweep
        name = stem + self.io.suffix
        path = self.work_dir / name
        if keep:
            saved = [n for n in self.saved if n != name] + [name]
            limit = self.policy.keep_last
            doomed = saved[:-limit] if 0 < limit < len(saved) else []
            saved = saved[len(doomed):]
            checkpoint.setdefault("meta", {})["saved_checkpoints"] = list(saved)
        else:
            saved, doomed = self.saved, []
        temp = path.with_name(_TEMP_PREFIX + name)
        if self.rank == 0:
            self.work_dir.mkdir(parents=True, exist_ok=True)
            for stale in self.work_dir.glob(_TEMP_PREFIX + "*"):  # left by a killed save
                self.io.remove(stale)
        barrier()  # nobody writes into a temporary name rank 0 is still sweeping
        pending = self._write(checkpoint, temp, path, model=model, optim_wrapper=optim_wrapper)
        self._pending = _PendingSave(pending, temp, path, keep, saved, doomed)
        if pending is None:
            self.finish_pending()
        return path

    def finish_pending(self) -> None:
        """Complete the last save: wait for a background write, put it in place; a collective."""
        save, self._pending = self._pending, None
        if save is None:
            return
        if save.write is not None:
            error: CheckpointError | None = None
            try:
                save.write.wait()
            except Exception as exc:  # the background write failed: this one does not count
                error = CheckpointError(
                    f"the background save of {str(save.path)!r} failed: "
                    f"{type(exc).__name__}: {str(exc).strip()[:200]}; the previous "
                    f"checkpoint {str(self.latest())!r} is intact")
            error = first_error_of_all_ranks(error, kind=CheckpointError)
            if error is not None:
                if self.rank == 0:
                    self.io.remove(save.temp)
                raise error
        barrier()  # every rank's part is on disk
        if self.rank == 0:
            if save.path.is_dir():  # a re-save under the same name; files are replaced atomically
                self._discard(save.path)
            os.replace(save.temp, save.path)
            _fsync_dir(self.work_dir)
            if save.keep:
                pointer = str(save.path.resolve()).encode()
                atomic_write(self.work_dir / POINTER_NAME, lambda f: f.write(pointer))
            for old in save.doomed:  # only now that the new checkpoint is safely in place
                self._discard(self.work_dir / old)
        self.saved = save.saved
        barrier()  # no rank looks for the checkpoint before it has its final name

    def _write(self, checkpoint: dict[str, Any], temp: Path, path: Path, *, model: Any,
               optim_wrapper: Any) -> Any:
        """``io.write`` into ``temp``; a full device is a ``DeviceFullError`` on every rank."""
        failure: DeviceFullError | None = None
        pending = None
        try:
            pending = self.io.write(checkpoint, temp, model=model, optim_wrapper=optim_wrapper)
        except BaseException as exc:
            needed = self.io.size_needed(checkpoint, model=model, optim_wrapper=optim_wrapper)
            failure = device_full_error(exc, path, needed=needed, intact=self.latest())
            self.io.remove(temp)
            if failure is None:
                raise
            failure.__cause__ = exc
        failure = first_error_of_all_ranks(failure, kind=DeviceFullError)
        if failure is not None:
            self.io.remove(temp)
            raise failure
        return pending

    def _discard(self, path: Path) -> None:
        """Remove a checkpoint, renaming it first so that no damaged one keeps its name."""
        trash = path.with_name(_TEMP_PREFIX + "old-" + path.name)
        try:
            os.replace(path, trash)
        except FileNotFoundError:
            return
        except OSError:  # e.g. a directory cannot replace a non-empty one: remove in place
            trash = path
        self.io.remove(trash)

    def remove(self, path: Path) -> None:
        """Delete a checkpoint this run wrote (rank 0; the others have nothing to do)."""
        if self.rank == 0:
            self._discard(path)

    def publish(self, path: Path, keys: Sequence[str], *, logger: Any) -> Path | None:
        """MMEngine's ``published_keys``: ``{stem}-{sha256[:8]}.pth`` beside ``path`` (rank 0)."""
        if self.rank != 0:
            return None
        if not path.is_file():
            logger.warning(f"published_keys: {path.name} is not a single-file "
                           f"checkpoint, so it is not published")
            return None
        checkpoint = read_checkpoint_file(path)
        removed = sorted(k for k in checkpoint if k not in keys)
        if removed:
            logger.info(f"published_keys: {removed} are left out of the published "
                        f"{path.name}")
        buffer = BytesIO()
        torch.save({k: v for k, v in checkpoint.items() if k in keys}, buffer)
        data = buffer.getvalue()
        final = path.with_name(f"{path.stem}-{hashlib.sha256(data).hexdigest()[:8]}.pth")
        atomic_write(final, lambda f: f.write(data))
        logger.info(f"The checkpoint {path.name} is published to {final.name}.")
        return final

    def load_weights(self, path: str | os.PathLike[str], model: Any, *, on_read: OnRead,
                     held: CheckpointFormat | None = None) -> WeightsLoaded:
        """Load the weights at ``path`` (of format ``held``) into ``model`` by its format's IO."""
        path = Path(path)
        held = held or format_of(path)
        loader = self.weight_loader_for(held)
        read_as = refuse_unloadable(loader, path, held, what="load_from")
        loaded = loader.loader_of(read_as).load_weights(path, model, held=read_as,
                                                        on_read=on_read)
        target = unwrap_model(model)
        self.loaded = attrs.evolve(loaded, checksums=local_checksums(
            target, loaded.went_in(target.state_dict(keep_vars=True))))
        return self.loaded

    def weight_loader_for(self, held: CheckpointFormat | None) -> WeightLoader:
        """The IO that loads weights of format ``held``: the run's own, a restorer, else ``io``."""
        return next((r for r in (self.io, *self.restorers)
                     if isinstance(r, WeightLoader) and held in r.weight_formats), self.io)

    def restorer_for(self, held: CheckpointFormat | None) -> CheckpointRestorer | None:
        """The IO that restores format ``held``: the run's own, else a restorer, else ``None``."""
        return next((r for r in (self.io, *self.restorers) if r.format == held), None)

    def problem(self, path: Path, held: CheckpointFormat | None) -> str | None:
        """What keeps ``path`` (of format ``held``) from being restored by this run, or ``None``."""
        restorer = self.restorer_for(held)
        return restorer.incomplete(path) if restorer is not None else self.io.problem(path)

    def read(self, path: str | os.PathLike[str], *, held: CheckpointFormat | None = None,
             model: Any = None, optim_wrapper: Any = None) -> dict[str, Any]:
        """The checkpoint at ``path`` as the IO of its format (``held``) reads it."""
        path = Path(path)
        if not path.exists():
            raise CheckpointNotFoundError(f"checkpoint {str(path)!r} does not exist")
        held = held or format_of(path)
        restorer = self.restorer_for(held)
        if restorer is None and held is not None:
            raise ForeignCheckpointError(
                f"checkpoint {str(path)!r} is {held.name}, which this strategy cannot "
                f"restore; resume it with the strategy that wrote it (with "
                f"checkpoint_format='portable' it writes checkpoints every strategy resumes)")
        return (restorer or self.io).read(path, model=model, optim_wrapper=optim_wrapper)

    def apply(self, checkpoint: dict[str, Any], path: str | os.PathLike[str], *,
              model: torch.nn.Module, optim_wrapper: Any, strict: bool = True,
              held: CheckpointFormat | None = None) -> None:
        """Put a read checkpoint's model and optimizer state into place, by the IO of its format."""
        held = held or format_of(Path(path))
        (self.restorer_for(held) or self.io).apply(checkpoint, Path(path), model=model,
                                                   optim_wrapper=optim_wrapper, strict=strict)

    def checkpoint_paths(self) -> list[Path]:
        """The checkpoints in ``work_dir`` of every format (so that a work_dir another strategy
        wrote is not taken for empty): the pointer's first, then newest first."""
        ordered: list[Path] = []
        pointer = self.work_dir / POINTER_NAME
        if pointer.is_file():
            named = Path(pointer.read_text().strip())
            for candidate in (named, self.work_dir / named.name):
                if _CHECKPOINT_NAME.match(candidate.name) and candidate.exists():
                    ordered.append(candidate)
                    break
        if self.work_dir.is_dir():
            found = [p for p in self.work_dir.iterdir() if _CHECKPOINT_NAME.match(p.name)]
            seen = {p.resolve() for p in ordered}
            ordered += [p for p in sorted(found, key=lambda p: p.stat().st_mtime_ns,
                                          reverse=True) if p.resolve() not in seen]
        return ordered

    def candidates(self) -> list[tuple[Path, str | None]]:
        return [(p, self.problem(p, format_of(p))) for p in self.checkpoint_paths()]

    def latest(self) -> Path | None:
        """The newest complete checkpoint in ``work_dir`` (the pointer's first), or ``None``."""
        return next((path for path, problem in self.candidates() if problem is None), None)

    def restore_saved(self, checkpoint: Mapping[str, Any]) -> None:
        """Continue ``keep_last`` pruning with the checkpoints the resumed run wrote."""
        names = checkpoint.get("meta", {}).get("saved_checkpoints", [])
        self.saved = [n for n in names if (self.work_dir / n).exists()]
