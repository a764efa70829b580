"""flexgraph's training runtime: the standard graph, its steps, and what they run on.

This layer turns an MMEngine-style config into a trained model through plain
step functions (:mod:`flexgraph.training.steps`) that the standard graph
(:func:`standard_graph`, :mod:`flexgraph.training.graph`) wires together. It
uses torch and MMEngine's components (registries, optimizer wrappers,
schedulers, evaluators, hooks) but not MMEngine's Runner, so that the order of
setup is the graph's to decide. It never imports strategies or the CLI.

Below the steps and :mod:`~flexgraph.training.resume` (bringing a checkpoint
into the run), each concern is a subpackage with a short face and private
modules behind it (``flexgraph/training/<part>/_<name>.py``), listed here in
the only direction they import each other (an import-linter contract in
pyproject.toml keeps it):

- :mod:`~flexgraph.training.loop`: the training loop, the hooks and the
  ``runner`` they see, evaluation passes, stopping on a signal;
- :mod:`~flexgraph.training.checkpoint`: checkpoints during a run: the
  checkpointer, its IOs (writer, restorer and weight loader), the state each
  strategy gives and takes, weights loaded into a model;
- :mod:`~flexgraph.training.components`: dataloaders, optimizer wrapper and
  schedulers, the model's training and evaluation steps, ``init_weights``;
- :mod:`~flexgraph.training.output`: log lines, progress, metrics, the run's
  record in its work_dir;
- :mod:`~flexgraph.training.runtime`: the process's place in the run, its
  process group, its random streams, models on the meta device;
- :mod:`~flexgraph.training.config`: the config's sections read into small
  values, components built through MMEngine's registries;
- :mod:`~flexgraph.training.formats`: checkpoint formats told by content, and
  reading them without unpickling arbitrary objects (``torch.save`` files,
  MMEngine's allow-list, DCP's metadata, safetensors headers, the openers);
  its face imports no torch, so that ``flexgraph plan`` can say which format
  a ``load_from`` or ``resume`` path holds;
- :mod:`~flexgraph.training.errors`: the training failures.

One part sits above the steps themselves, so that a run imports none of it:
:mod:`~flexgraph.training.checkpoint_tools`, the offline tools behind
``flexgraph ckpt`` (describing and converting a checkpoint of any format).
:mod:`~flexgraph.training.graph` (the standard graph) stands beside the parts,
importing no torch, for planning.

The words for checkpoints: a run *saves* its checkpoints (the training state)
and *restores* one to continue (``resume``); it *loads* weights from a path
into a model (``load_from``). What reads one has one name per job: a
*restorer* restores a run from a format (the checkpoint part), an *opener*
opens a checkpoint of any format for reading one tensor at a time (the
formats part), and an *inspector* describes one offline (``flexgraph ckpt
inspect``).

The names users and strategies need most are re-exported here, lazily:
importing this package, or planning the standard graph, does not import torch.
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
