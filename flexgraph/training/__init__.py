"""flexgraph's training runtime: the standard steps and what they run on.

This layer turns an MMEngine-style config into a trained model through plain
step functions (:mod:`flexgraph.training.steps`) that the engine wires into a
graph. It uses torch and MMEngine's components (registries, optimizer wrappers,
schedulers, evaluators, hooks) but not MMEngine's Runner, so that the order of
setup is the graph's to decide. It never imports strategies or the CLI.

Public names are re-exported here; the modules behind them are private.
"""

from flexgraph.training.checkpoint import Checkpointer, load_checkpoint_file
from flexgraph.training.config import CheckpointPolicy, TrainSchedule
from flexgraph.training.env import Env, make_env, seed_everything
from flexgraph.training.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    ConfigError,
    EmptyDatasetError,
    NoLossError,
    TrainingError,
    UnknownComponentError,
    UnsafeCheckpointError,
)
from flexgraph.training.hooks import Hooks, RunnerView
from flexgraph.training.state import LoopState
from flexgraph.training.steps import STANDARD_STEPS, StepDecl

__all__ = [
    "STANDARD_STEPS",
    "CheckpointError",
    "CheckpointNotFoundError",
    "CheckpointPolicy",
    "Checkpointer",
    "ConfigError",
    "EmptyDatasetError",
    "Env",
    "Hooks",
    "LoopState",
    "NoLossError",
    "RunnerView",
    "StepDecl",
    "TrainSchedule",
    "TrainingError",
    "UnknownComponentError",
    "UnsafeCheckpointError",
    "load_checkpoint_file",
    "make_env",
    "seed_everything",
]
