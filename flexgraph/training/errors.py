"""Training failures, one class per kind, and the warning for config keys not acted on.

Each error is a :class:`~flexgraph.core.errors.FlexgraphError` (one line, exit 2) and the
builtin that describes it (``except ValueError`` still catches a bad config).
"""

from __future__ import annotations

from flexgraph.core.errors import FlexgraphError

__all__ = [
    "CheckpointError",
    "CheckpointExistsError",
    "CheckpointNotFoundError",
    "ConfigError",
    "DeviceFullError",
    "EmptyDatasetError",
    "ForeignCheckpointError",
    "InitWeightsError",
    "NoLossError",
    "TrainingError",
    "TrainingStopped",
    "UnknownComponentError",
    "UnsafeCheckpointError",
    "UnusedConfigWarning",
    "WorkDirBusyError",
]


class TrainingError(FlexgraphError, RuntimeError):
    """A training failure of no kind below (a user's or a strategy's own step, say)."""


class ConfigError(FlexgraphError, ValueError):
    """A section of the training config is missing, malformed or contradictory."""


class UnknownComponentError(ConfigError, LookupError):
    """A ``type=`` name matches no registered component and no importable object."""


class EmptyDatasetError(FlexgraphError, ValueError):
    """A dataloader or an evaluation pass would yield no batch."""


class InitWeightsError(FlexgraphError, RuntimeError):
    """An ``init_cfg`` failed to set a parameter (MMEngine would log it and train on)."""


class NoLossError(FlexgraphError, TypeError):
    """A model's training forward returned nothing that can be back-propagated."""


class CheckpointError(FlexgraphError, RuntimeError):
    """A checkpoint could not be saved, restored, or loaded into the model."""


class CheckpointExistsError(CheckpointError, FileExistsError):
    """A conversion's destination exists: ``flexgraph ckpt convert`` never overwrites."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """A checkpoint path named in the config (``load_from``, ``resume``) does not exist."""


class ForeignCheckpointError(CheckpointError):
    """A checkpoint another strategy wrote, in a form this run's strategy cannot restore."""


class DeviceFullError(CheckpointError):
    """A checkpoint could not be written: its device or quota is full (the partial one removed)."""


class UnsafeCheckpointError(CheckpointError):
    """``torch.load(weights_only=True)`` refused a file: it holds arbitrary objects, which
    could run code of the file's author's choosing."""


class WorkDirBusyError(FlexgraphError, RuntimeError):
    """Another run owns the work_dir: two runs would overwrite each other's checkpoints."""


class TrainingStopped(BaseException):
    """The run stopped on a signal, after saving a checkpoint to resume from.

    A :class:`BaseException`, so ``except Exception`` lets it through; ``flexgraph run``
    exits 75 ("resumable, run me again").
    """

    def __init__(self, message: str, *, signal_name: str, iteration: int,
                 checkpoint: str | None, rank: int = 0) -> None:
        super().__init__(message)
        self.signal_name = signal_name
        self.iteration = iteration
        self.checkpoint = checkpoint
        self.rank = rank


class UnusedConfigWarning(UserWarning):
    """A config key that MMEngine's Runner acts on and flexgraph does not (the run goes on)."""
