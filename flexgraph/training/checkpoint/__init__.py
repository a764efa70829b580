"""Checkpoints during a run: saving the training state, restoring it, loading weights.

The vocabulary: a :class:`Checkpointer` *saves* the training state and
*restores* it into the model, optimizer and schedulers; it finds the latest
complete checkpoint and removes old ones. How a state reaches disk is a
:class:`CheckpointIO`: one file written by rank 0 (:class:`FileCheckpointIO`,
:class:`FullStateFileIO`), a sharded directory every rank writes
(:class:`DistributedCheckpointIO`), or the portable layout every strategy
restores (:class:`PortableCheckpointIO`). What each strategy's live objects
give and take is a :class:`StateAccess`. Every IO also *loads* ``load_from``
weights into the model it manages (:func:`load_pretrained` does the same for
MMEngine's ``Pretrained`` initialiser). :class:`LoopState` says where a
restored run continues.

An IO is three small parts, each an abstract class: a :class:`CheckpointWriter`
(saves), a :class:`CheckpointRestorer` (``resume``) and a :class:`WeightLoader`
(``load_from``). A checkpoint of another strategy's format that this run
restores but never writes has a restorer alone (:class:`FileStateRestorer`).

What a path holds, and reading it without unpickling arbitrary objects, is
:mod:`flexgraph.training.formats`; describing and converting checkpoints
offline (``flexgraph ckpt``) is :mod:`flexgraph.training.checkpoint_tools`,
which nothing here imports.
"""

from flexgraph.training.checkpoint._access import (
    StateAccess,
    TorchStateAccess,
    positions_to_names,
)
from flexgraph.training.checkpoint._checkpointer import (
    Checkpointer,
    flat_schedulers,
    restore_schedulers,
)
from flexgraph.training.checkpoint._dcp import (
    SHARDED_KEYS,
    DistributedCheckpointIO,
    FullStateFileIO,
)
from flexgraph.training.checkpoint._file import FileCheckpointIO, optimizer_keyed_by
from flexgraph.training.checkpoint._file_state import FileStateRestorer
from flexgraph.training.checkpoint._io import (
    CheckpointIO,
    CheckpointRestorer,
    CheckpointWriter,
    OnRead,
    WeightLoader,
)
from flexgraph.training.checkpoint._manifest import read_manifest
from flexgraph.training.checkpoint._mmengine import from_mmengine
from flexgraph.training.checkpoint._portable import (
    PortableCheckpointIO,
    portable_tensors,
    read_portable_tensor,
    write_portable,
)
from flexgraph.training.checkpoint._pretrained import load_pretrained
from flexgraph.training.checkpoint._space import human_bytes, tensor_bytes
from flexgraph.training.checkpoint._state import LoopState, from_plain, to_plain
from flexgraph.training.checkpoint._weights import (
    WeightsLoaded,
    apply_weights,
    matching_weights,
)

CHECKPOINT_FORMATS = ("native", "portable")
"""What a strategy's ``checkpoint_format`` option takes: its own format, or the portable one."""

__all__ = [
    "CHECKPOINT_FORMATS",
    "SHARDED_KEYS",
    "CheckpointIO",
    "CheckpointRestorer",
    "CheckpointWriter",
    "Checkpointer",
    "DistributedCheckpointIO",
    "FileCheckpointIO",
    "FileStateRestorer",
    "FullStateFileIO",
    "LoopState",
    "OnRead",
    "PortableCheckpointIO",
    "StateAccess",
    "TorchStateAccess",
    "WeightLoader",
    "WeightsLoaded",
    "apply_weights",
    "flat_schedulers",
    "from_mmengine",
    "from_plain",
    "human_bytes",
    "load_pretrained",
    "matching_weights",
    "optimizer_keyed_by",
    "portable_tensors",
    "positions_to_names",
    "read_manifest",
    "read_portable_tensor",
    "restore_schedulers",
    "tensor_bytes",
    "to_plain",
    "write_portable",
]
