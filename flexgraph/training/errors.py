"""Training failures, one class per kind, and the warning for config keys not acted on.

Each exception class derives from :class:`~flexgraph.core.errors.FlexgraphError` (so the CLI
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
    """A failure of the training runtime that is not one of the kinds below.

    The runtime raises the specific classes; this one is for a failure that
    fits none of them (a step of a user's or a strategy's own, say), so that
    the CLI still reports it in one line.
    """


class ConfigError(FlexgraphError, ValueError):
    """A section of the training config is missing, malformed or contradictory.

    Raised while the config is read, before anything is built from the section
    at fault; the message names the key (``train_cfg.val_interval must be >= 1,
    got 0``).
    """


class UnknownComponentError(ConfigError, LookupError):
    """A ``type=`` name matches no registered component and no importable object.

    Raised when a component is built from the config; the message names the
    config entry and suggests close registered names.
    """


class EmptyDatasetError(FlexgraphError, ValueError):
    """A dataloader would yield no batch, so training could not make progress.

    Raised when a dataloader is built (a dataset with no samples, or too few
    for one batch with ``drop_last=True``), or when an iterable dataset or an
    evaluation pass yields no batch.
    """


class InitWeightsError(FlexgraphError, RuntimeError):
    """An initialiser of ``init_weights`` (an ``init_cfg``) failed to set a parameter.

    Raised by the ``init_weights`` step where MMEngine would only log the
    failed copy and train on the previous values; the message names the
    parameters, the module whose ``init_cfg`` loads them and the first error.
    """


class NoLossError(FlexgraphError, TypeError):
    """A model's training forward returned nothing that can be back-propagated.

    Raised on the first batch, before the optimizer has touched a parameter:
    the forward returned a tensor that is not a scalar or does not require
    grad, a dict with no key containing ``'loss'`` that requires grad, or
    something that is neither.
    """


class CheckpointError(FlexgraphError, RuntimeError):
    """A checkpoint could not be written, read, or applied to the run.

    Covers saving and restoring a run's checkpoints and loading ``load_from``
    weights into a model; the message names the file and what is wrong with
    it (empty, truncated, corrupt, a format the run's IO does not read, keys
    that match no weight of the model).
    """


class CheckpointExistsError(CheckpointError, FileExistsError):
    """A conversion's destination exists: ``flexgraph ckpt convert`` never overwrites."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """A checkpoint path named in the config (``load_from``, ``resume``) does not exist."""


class ForeignCheckpointError(CheckpointError):
    """A checkpoint another strategy wrote, in a form this run's strategy cannot restore.

    Never skipped by ``--resume auto`` as if it were damaged: resuming an older
    checkpoint instead would silently lose its progress. The message names the
    checkpoint, what wrote it and how to resume it (the strategy that wrote
    it, or its weights alone with ``load_from``).
    """


class DeviceFullError(CheckpointError):
    """A checkpoint could not be written: its device (or the user's quota) is full.

    Raised on every rank by the save that hit it, after the partly written
    checkpoint was removed; the message names the checkpoint, about how much
    room it needs and which earlier checkpoint is intact.
    """


class UnsafeCheckpointError(CheckpointError):
    """``torch.load(weights_only=True)`` refused a file: it holds arbitrary objects.

    flexgraph never retries such a file with unsafe loading, because unpickling
    it could execute code that the file's author chose. The message names the
    file and, where the unpickler says, what it refused, with how to re-save
    the file in a safe form.
    """


class WorkDirBusyError(FlexgraphError, RuntimeError):
    """Another run owns the work_dir: two runs would overwrite each other's checkpoints.

    Raised before the run writes anything there; the message names the owner's
    host and process id (see :mod:`flexgraph.training.output._lock`).
    """


class TrainingStopped(BaseException):
    """The run stopped early on a signal, after saving a checkpoint to resume from.

    Not a failure, and not an :class:`Exception`: like ``KeyboardInterrupt``, it
    must pass through code that handles errors with ``except Exception`` (the
    executor lets it through unwrapped). ``flexgraph run`` exits with its own
    status for it (75), so that a job script can tell "resumable, run me again"
    from done (0) and failed (1, 2).

    Parameters
    ----------
    message : str
    signal_name : str
        The signal that stopped the run (``'SIGTERM'``).
    iteration : int
        Iterations completed, and saved.
    checkpoint : str or None
        The checkpoint holding that state (``None`` when the run has no
        checkpointer).
    rank : int, optional
        The rank that raised it (every rank does).

    Each keyword is kept as the attribute of the same name.
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
    names the key and says what flexgraph does instead. Warned once per run,
    on rank 0, when the run's hooks are built; a near-miss of a known key
    (``param_schedular``) gets a did-you-mean.
    """
