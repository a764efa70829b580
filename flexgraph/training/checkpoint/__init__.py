"""Checkpoints: what is saved, how it is written and read back, and from which formats.

The vocabulary: a :class:`Checkpointer` *saves* the training state and
*restores* it into the model, optimizer and schedulers; it finds the latest
complete checkpoint and removes old ones. How a state reaches disk is a
:class:`CheckpointIO`: one file written by rank 0 (:class:`FileCheckpointIO`,
:class:`FullStateFileIO`) or a sharded directory every rank writes
(:class:`DistributedCheckpointIO`). Reading never unpickles arbitrary objects;
MMEngine's own files are read with an allow-list of the types they hold.
Every IO also *loads* ``load_from`` weights into the model it manages, from
each :class:`CheckpointFormat` it reads, recognised by content.
:func:`describe_checkpoint` says what a checkpoint of any format holds, offline,
through each format's :class:`CheckpointReader`, which also opens it as a
:class:`CheckpointSource` (one tensor at a time): :func:`read_checkpoint`
reads another tool's checkpoint for ``load_from`` and :func:`convert_checkpoint`
rewrites it in another format (``flexgraph ckpt convert``).
:class:`LoopState` says where a restored run continues.
"""

from flexgraph.training.checkpoint._access import (
    StateAccess,
    TorchStateAccess,
    optimizers_of,
    positions_to_names,
)
from flexgraph.training.checkpoint._checkpointer import (
    POINTER_NAME,
    Checkpointer,
    atomic_write,
    checkpoint_meta,
    flat_schedulers,
    restore_schedulers,
)
from flexgraph.training.checkpoint._convert import TARGETS, Conversion, convert_checkpoint
from flexgraph.training.checkpoint._dcp import (
    DistributedCheckpointIO,
    FullStateFileIO,
    load_weights_into_shards,
)
from flexgraph.training.checkpoint._dcp_read import dcp_problem, load_dcp_weights
from flexgraph.training.checkpoint._file_state import FileStateReader
from flexgraph.training.checkpoint._files import (
    directory_problem,
    file_problem,
    read_checkpoint_file,
)
from flexgraph.training.checkpoint._inspect import (
    CheckpointReader,
    CheckpointSummary,
    checkpoint_readers,
    describe_checkpoint,
    state_parts,
)
from flexgraph.training.checkpoint._io import (
    NOTHING_READ,
    CheckpointIO,
    FileCheckpointIO,
    OnRead,
    load_optimizer_state,
)
from flexgraph.training.checkpoint._manifest import read_manifest
from flexgraph.training.checkpoint._mmengine import (
    allow_mmengine_types,
    from_mmengine,
    is_mmengine_checkpoint,
    mmengine_globals,
)
from flexgraph.training.checkpoint._open import (
    READER_ENTRY_POINTS,
    open_checkpoint,
    read_checkpoint,
)
from flexgraph.training.checkpoint._portable import (
    PortableCheckpointIO,
    portable_tensors,
    read_portable_tensor,
    write_portable,
)
from flexgraph.training.checkpoint._pretrained import load_pretrained
from flexgraph.training.checkpoint._source import CheckpointSource, weights_layout
from flexgraph.training.checkpoint._space import human_bytes, tensor_bytes
from flexgraph.training.checkpoint._state import LoopState, from_plain, to_plain
from flexgraph.training.checkpoint._weights import (
    WeightsLoaded,
    apply_weights,
    matching_weights,
    model_weights,
    weights_in,
)
from flexgraph.training.formats import (
    DCP_DIRECTORY,
    DEEPSPEED_DIRECTORY,
    MANIFEST_NAME,
    PORTABLE_DIRECTORY,
    SAFETENSORS_FILE,
    TORCH_SAVE_FILE,
    CheckpointFormat,
    format_of,
    known_formats,
)

CHECKPOINT_FORMATS = ("native", "portable")
"""What a strategy's ``checkpoint_format`` option takes: its own format, or the portable one."""

__all__ = [
    "CHECKPOINT_FORMATS",
    "FileStateReader",
    "MANIFEST_NAME",
    "PORTABLE_DIRECTORY",
    "PortableCheckpointIO",
    "StateAccess",
    "TorchStateAccess",
    "optimizers_of",
    "portable_tensors",
    "positions_to_names",
    "read_manifest",
    "read_portable_tensor",
    "write_portable",
    "DCP_DIRECTORY",
    "DEEPSPEED_DIRECTORY",
    "NOTHING_READ",
    "READER_ENTRY_POINTS",
    "SAFETENSORS_FILE",
    "TARGETS",
    "TORCH_SAVE_FILE",
    "CheckpointFormat",
    "CheckpointIO",
    "CheckpointReader",
    "CheckpointSource",
    "CheckpointSummary",
    "Conversion",
    "Checkpointer",
    "DistributedCheckpointIO",
    "FileCheckpointIO",
    "FullStateFileIO",
    "LoopState",
    "OnRead",
    "POINTER_NAME",
    "allow_mmengine_types",
    "apply_weights",
    "atomic_write",
    "checkpoint_readers",
    "checkpoint_meta",
    "convert_checkpoint",
    "dcp_problem",
    "describe_checkpoint",
    "directory_problem",
    "file_problem",
    "flat_schedulers",
    "from_mmengine",
    "from_plain",
    "is_mmengine_checkpoint",
    "WeightsLoaded",
    "format_of",
    "known_formats",
    "load_dcp_weights",
    "load_optimizer_state",
    "load_pretrained",
    "load_weights_into_shards",
    "matching_weights",
    "mmengine_globals",
    "model_weights",
    "open_checkpoint",
    "read_checkpoint",
    "read_checkpoint_file",
    "restore_schedulers",
    "state_parts",
    "human_bytes",
    "tensor_bytes",
    "to_plain",
    "weights_in",
    "weights_layout",
]
