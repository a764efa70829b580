"""Checkpoints: what is saved, how it is written and read back, and from which formats.

The vocabulary: a :class:`Checkpointer` *saves* the training state and
*restores* it into the model, optimizer and schedulers; it finds the latest
complete checkpoint and removes old ones. How a state reaches disk is a
:class:`CheckpointIO`: one file written by rank 0 (:class:`FileCheckpointIO`,
:class:`FullStateFileIO`) or a sharded directory every rank writes
(:class:`DistributedCheckpointIO`). Reading never unpickles arbitrary objects;
MMEngine's own files are read with an allow-list of the types they hold.
:class:`LoopState` says where a restored run continues.
"""

from flexgraph.training.checkpoint._checkpointer import (
    POINTER_NAME,
    Checkpointer,
    atomic_write,
    checkpoint_meta,
    flat_schedulers,
    restore_schedulers,
)
from flexgraph.training.checkpoint._dcp import (
    DistributedCheckpointIO,
    FullStateFileIO,
    dcp_problem,
    load_sharded_model_state,
)
from flexgraph.training.checkpoint._files import (
    directory_problem,
    file_problem,
    read_checkpoint_file,
)
from flexgraph.training.checkpoint._io import (
    CheckpointIO,
    FileCheckpointIO,
    load_optimizer_state,
    rank_of,
)
from flexgraph.training.checkpoint._mmengine import (
    allow_mmengine_types,
    from_mmengine,
    is_mmengine_checkpoint,
    mmengine_globals,
)
from flexgraph.training.checkpoint._state import LoopState, from_plain, to_plain
from flexgraph.training.checkpoint._weights import apply_weights, model_weights, weights_in

__all__ = [
    "CheckpointIO",
    "Checkpointer",
    "DistributedCheckpointIO",
    "FileCheckpointIO",
    "FullStateFileIO",
    "LoopState",
    "POINTER_NAME",
    "allow_mmengine_types",
    "apply_weights",
    "atomic_write",
    "checkpoint_meta",
    "dcp_problem",
    "directory_problem",
    "file_problem",
    "flat_schedulers",
    "from_mmengine",
    "from_plain",
    "is_mmengine_checkpoint",
    "load_optimizer_state",
    "load_sharded_model_state",
    "mmengine_globals",
    "model_weights",
    "rank_of",
    "read_checkpoint_file",
    "restore_schedulers",
    "to_plain",
    "weights_in",
]
