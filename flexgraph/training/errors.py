"""Training failures, one class per kind.

Each class derives from :class:`~flexgraph.core.errors.FlexgraphError` (so the CLI
can print it as one line and exit 2) and from the builtin that describes the
failure, so code written against plain Python exceptions keeps working:
``except ValueError`` still catches a bad config. Messages name the culprit and
say how to fix it; raise them *before* any parameter is updated wherever the
failure can be detected that early.
"""

from __future__ import annotations

from flexgraph.core.errors import FlexgraphError

__all__ = [
    "CheckpointError",
    "CheckpointNotFoundError",
    "ConfigError",
    "EmptyDatasetError",
    "InitWeightsError",
    "NoLossError",
    "TrainingError",
    "TrainingStopped",
    "UnknownComponentError",
    "UnsafeCheckpointError",
    "UnusedConfigWarning",
]


class TrainingError(FlexgraphError, RuntimeError):
    """A failure of the training runtime that is not one of the kinds below."""


class ConfigError(FlexgraphError, ValueError):
    """A section of the training config is missing, malformed or contradictory."""


class UnknownComponentError(ConfigError, LookupError):
    """A ``type=`` name matches no registered component and no importable object."""


class EmptyDatasetError(FlexgraphError, ValueError):
    """A dataloader would yield no batch, so training could not make progress."""


class InitWeightsError(FlexgraphError, RuntimeError):
    """An initialiser of ``init_weights`` (an ``init_cfg``) failed to set a parameter."""


class NoLossError(FlexgraphError, TypeError):
    """A model's training forward returned nothing that can be back-propagated."""


class CheckpointError(FlexgraphError, RuntimeError):
    """A checkpoint could not be written, read, or applied to the run."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """A checkpoint path named in the config does not exist."""


class UnsafeCheckpointError(CheckpointError):
    """``torch.load(weights_only=True)`` refused a file: it holds arbitrary objects.

    flexgraph never retries such a file with unsafe loading, because unpickling
    it could execute code that the file's author chose.
    """


class TrainingStopped(BaseException):
    """The run stopped early on a signal, after saving a checkpoint to resume from.

    Not a failure, and not an :class:`Exception`: like ``KeyboardInterrupt``, it
    must pass through code that handles errors with ``except Exception`` (the
    executor lets it through unwrapped). ``flexgraph run`` exits with its own
    status for it (75), so that a job script can tell "resumable, run me again"
    from done (0) and failed (1, 2).

    Attributes
    ----------
    signal_name:
        The signal that stopped the run (``'SIGTERM'``).
    iteration:
        Iterations completed, and saved.
    checkpoint:
        The checkpoint holding that state (``None`` when the run has no
        checkpointer).
    rank:
        The rank that raised it (every rank does).
    """

    def __init__(self, message: str, *, signal_name: str, iteration: int,
                 checkpoint: str | None, rank: int = 0) -> None:
        super().__init__(message)
        self.signal_name = signal_name
        self.iteration = iteration
        self.checkpoint = checkpoint
        self.rank = rank


class UnusedConfigWarning(UserWarning):
    """A config key that MMEngine's Runner acts on and flexgraph does not.

    Not an error: the run goes on as the rest of the config says. The message
    names the key and says what flexgraph does instead.
    """
