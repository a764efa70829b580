"""The offline checkpoint tools behind ``flexgraph ckpt``: describing and converting."""

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
