"""The training loop and what runs around it: hooks, saving, stopping, evaluation."""

from flexgraph.training.loop._evaluate import build_evaluator, run_evaluation
from flexgraph.training.loop._hooks import Hooks, build_hooks
from flexgraph.training.loop._preemption import StopRequest
from flexgraph.training.loop._train_loop import TrainLoop

__all__ = [
    "Hooks",
    "StopRequest",
    "TrainLoop",
    "build_evaluator",
    "build_hooks",
    "run_evaluation",
]
