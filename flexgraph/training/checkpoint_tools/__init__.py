"""The offline checkpoint tools behind ``flexgraph ckpt``: describing and converting.

Both run on the CPU, without building the model, on a checkpoint of any
format (recognised by content, :mod:`flexgraph.training.formats`):

- :func:`describe_checkpoint` says what a checkpoint holds (``flexgraph ckpt
  inspect``), as a :class:`CheckpointSummary`, through the
  :class:`CheckpointInspector` of its format: flexgraph's own, and those
  strategies add through an entry-point group (DeepSpeed's directories);
- :func:`convert_checkpoint` rewrites it in another format (``flexgraph ckpt
  convert``), one tensor at a time.

A run never needs them: nothing in :mod:`flexgraph.training.checkpoint` or the
steps imports this package.
"""

from flexgraph.training.checkpoint_tools._convert import TARGETS, convert_checkpoint
from flexgraph.training.checkpoint_tools._inspect import (
    CheckpointInspector,
    CheckpointSummary,
    describe_checkpoint,
    state_parts,
)

__all__ = [
    "TARGETS",
    "CheckpointInspector",
    "CheckpointSummary",
    "convert_checkpoint",
    "describe_checkpoint",
    "state_parts",
]
