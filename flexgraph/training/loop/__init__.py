"""The training loop and what runs around it: hooks, saving, stopping, evaluation.

:class:`TrainLoop` runs the epochs and iterations; :class:`Hooks` dispatches
MMEngine's hook points to the run's hooks, which see a :class:`RunnerView` as
``runner``; the built-in checkpoint hook decides when a save is due; a stop
request (a signal) ends training at an iteration every rank agrees on; an
evaluation pass runs the val or test loader through the model and the metrics.
"""

from flexgraph.training.loop._checkpoint_hook import (
    BuiltinCheckpointHook,
)
from flexgraph.training.loop._evaluate import build_evaluator, run_evaluation
from flexgraph.training.loop._hooks import (
    HOOK_POINTS,
    PRIORITIES,
    Hooks,
    build_hooks,
)
from flexgraph.training.loop._preemption import StopRequest
from flexgraph.training.loop._train_loop import TrainLoop

__all__ = [
    "BuiltinCheckpointHook",
    "HOOK_POINTS",
    "Hooks",
    "PRIORITIES",
    "StopRequest",
    "TrainLoop",
    "build_evaluator",
    "build_hooks",
    "run_evaluation",
]
