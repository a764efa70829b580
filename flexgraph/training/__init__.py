"""flexgraph's training runtime: the standard steps and what they run on.

This layer turns an MMEngine-style config into a trained model through plain
step functions (:mod:`flexgraph.training.steps`) that the engine wires into a
graph. It uses torch and MMEngine's components (registries, optimizer wrappers,
schedulers, evaluators, hooks) but not MMEngine's Runner, so that the order of
setup is the graph's to decide. It never imports strategies or the CLI.

Public names are re-exported here (lazily: importing this package, or
planning the standard graph, does not import torch); the modules behind
them are private.
"""

from importlib import import_module
from typing import Any

from flexgraph.training.graph import standard_graph

_LAZY = {
    "Checkpointer": "checkpoint",
    "read_checkpoint_file": "checkpoint",
    "CheckpointPolicy": "config",
    "TrainSchedule": "config",
    "Env": "runtime",
    "make_env": "runtime",
    "seed_everything": "runtime",
    "CheckpointError": "errors",
    "CheckpointNotFoundError": "errors",
    "ConfigError": "errors",
    "EmptyDatasetError": "errors",
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
    "EmptyDatasetError",
    "Env",
    "Hooks",
    "InitWeightsError",
    "LoopState",
    "NoLossError",
    "RunnerView",
    "TrainSchedule",
    "TrainingError",
    "TrainingStopped",
    "UnknownComponentError",
    "UnsafeCheckpointError",
    "UnusedConfigWarning",
    "read_checkpoint_file",
    "make_env",
    "seed_everything",
    "standard_graph",
]
