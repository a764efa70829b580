"""flexgraph's training runtime: the standard graph, its steps, and what they run on.

An MMEngine-style config becomes a trained model through plain step functions
(:mod:`flexgraph.training.steps`) wired by :func:`standard_graph`. It uses MMEngine's
components but not its Runner, so that the order of setup is the graph's; it never imports
strategies or the CLI. Each concern below the steps is a subpackage with a short face and
private modules; they import each other only downward (:ref:`layers`).

Checkpoint words: a run *saves* its checkpoints and *restores* one to continue
(``resume``); it *loads* weights into a model (``load_from``). A *restorer* restores a run
from a format, an *opener* reads any format one tensor at a time, and an *inspector*
describes one offline (``flexgraph ckpt inspect``).

The names below are re-exported lazily: importing this package does not import torch.
"""

from importlib import import_module
from typing import Any

from flexgraph.training.graph import standard_graph, standard_inputs

_LAZY = {
    "Checkpointer": "checkpoint",
    "read_checkpoint_file": "formats",
    "CheckpointPolicy": "config",
    "RunSettings": "config",
    "TrainSchedule": "config",
    "read_settings": "config",
    "Env": "runtime",
    "make_env": "runtime",
    "seed_everything": "runtime",
    "CheckpointError": "errors",
    "CheckpointNotFoundError": "errors",
    "ConfigError": "errors",
    "DeviceFullError": "errors",
    "EmptyDatasetError": "errors",
    "ForeignCheckpointError": "errors",
    "InitWeightsError": "errors",
    "NoLossError": "errors",
    "TrainingError": "errors",
    "TrainingStopped": "errors",
    "UnknownComponentError": "errors",
    "UnsafeCheckpointError": "errors",
    "UnusedConfigWarning": "errors",
    "Hooks": "loop",
    "RunnerView": "loop",
    "LoopState": "checkpoint",
}


def __getattr__(name: str) -> Any:
    """Import torch-backed names on first use: planning the graph needs none of them."""
    if name not in _LAZY:
        raise AttributeError(f"module 'flexgraph.training' has no attribute {name!r}")
    return getattr(import_module(f"flexgraph.training.{_LAZY[name]}"), name)


__all__ = [
    "CheckpointError",
    "CheckpointNotFoundError",
    "CheckpointPolicy",
    "Checkpointer",
    "ConfigError",
    "DeviceFullError",
    "EmptyDatasetError",
    "Env",
    "ForeignCheckpointError",
    "Hooks",
    "InitWeightsError",
    "LoopState",
    "NoLossError",
    "RunSettings",
    "RunnerView",
    "TrainSchedule",
    "TrainingError",
    "TrainingStopped",
    "UnknownComponentError",
    "UnsafeCheckpointError",
    "UnusedConfigWarning",
    "make_env",
    "read_checkpoint_file",
    "read_settings",
    "seed_everything",
    "standard_graph",
    "standard_inputs",
]
