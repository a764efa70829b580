"""Checkpoints during a run: saving the training state, restoring it, loading weights.

The vocabulary: a :class:`Checkpointer` *saves* the training state and
*restores* it into the model, optimizer and schedulers; it finds the latest
complete checkpoint and removes old ones. How a state reaches disk is a
:class:`CheckpointIO`: one file written by rank 0 (:class:`FileCheckpointIO`),
the portable layout every strategy restores (:class:`PortableCheckpointIO`),
or a strategy's own (FSDP's sharded directories, DeepSpeed's engine). What
each strategy's live objects give and take is a :class:`StateAccess`. Every
IO also *loads* weights into the model it manages: :func:`load_weights` is
``load_from``'s one sequence (:func:`load_pretrained` does the same for
MMEngine's ``Pretrained`` initialiser), and :func:`load_into_slices` the one
load into a model whose weights are split over the ranks, each strategy
saying how (:class:`Slices`). :class:`LoopState` says where a restored run
continues. Whether the files a run loads cover its model, so that
``init_weights`` has nothing to do, is :func:`weights_coverage` (from each
file's index), and the plan's derived rewrites it leads to
:func:`derive_from_weights`.

An IO is three small parts, each an abstract class: a :class:`CheckpointWriter`
(saves), a :class:`CheckpointRestorer` (``resume``) and a :class:`WeightLoader`
(``load_from``). A checkpoint of another strategy's format that this run
restores but never writes has a restorer alone (:class:`FileStateRestorer`).

What a path holds, and reading it without unpickling arbitrary objects, is
:mod:`flexgraph.training.formats`: a load or a restore asks it once and hands
the answer down. Describing and converting checkpoints offline (``flexgraph
ckpt``) is :mod:`flexgraph.training.checkpoint_tools`, which nothing here imports.
"""

from flexgraph.training.checkpoint._access import (
    StateAccess,
    TorchStateAccess,
    optimizers_of,
    positions_to_names,
)
from flexgraph.training.checkpoint._checkpointer import (
    Checkpointer,
    flat_schedulers,
    restore_schedulers,
)
from flexgraph.training.checkpoint._coverage import (
    Coverage,
    WeightsDerivation,
    WeightSource,
    derive_from_weights,
    pretrained_sources,
    weights_coverage,
)
from flexgraph.training.checkpoint._dcp import SHARDED_KEYS, full_tensors, load_dcp_weights
from flexgraph.training.checkpoint._file import FileCheckpointIO, optimizer_keyed_by
from flexgraph.training.checkpoint._file_state import FileStateRestorer
from flexgraph.training.checkpoint._io import (
    CheckpointIO,
    CheckpointRestorer,
    CheckpointWriter,
    OnRead,
    WeightLoader,
)
from flexgraph.training.checkpoint._load import load_weights
from flexgraph.training.checkpoint._manifest import read_manifest
from flexgraph.training.checkpoint._mmengine import from_mmengine
from flexgraph.training.checkpoint._portable import (
    PortableCheckpointIO,
    portable_tensors,
    read_portable_tensor,
    write_portable,
)
from flexgraph.training.checkpoint._pretrained import load_pretrained
from flexgraph.training.checkpoint._sharded import Slices, load_into_slices
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
    "Coverage",
    "FileCheckpointIO",
    "FileStateRestorer",
    "LoopState",
    "OnRead",
    "PortableCheckpointIO",
    "Slices",
    "StateAccess",
    "TorchStateAccess",
    "WeightLoader",
    "WeightSource",
    "WeightsDerivation",
    "WeightsLoaded",
    "apply_weights",
    "derive_from_weights",
    "flat_schedulers",
    "from_mmengine",
    "from_plain",
    "full_tensors",
    "human_bytes",
    "load_dcp_weights",
    "load_into_slices",
    "load_pretrained",
    "load_weights",
    "matching_weights",
    "optimizer_keyed_by",
    "optimizers_of",
    "portable_tensors",
    "positions_to_names",
    "pretrained_sources",
    "read_manifest",
    "read_portable_tensor",
    "restore_schedulers",
    "tensor_bytes",
    "to_plain",
    "weights_coverage",
    "write_portable",
]
