"""The offline checkpoint tools behind ``flexgraph ckpt``: describing and converting.

Both run on the CPU, without building the model, on a checkpoint of any format
(recognised by content): :func:`describe_checkpoint` (``ckpt inspect``) and
:func:`convert_checkpoint` (``ckpt convert``). Nothing on the run path imports them.
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
