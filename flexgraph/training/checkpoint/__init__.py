"""Checkpoints during a run: saving the training state, restoring it, loading weights."""

from flexgraph.training.checkpoint._access import (
    StateAccess,
    TorchStateAccess,
    as_on_rank0,
    optimizers_of,
)
from flexgraph.training.checkpoint._checkpointer import Checkpointer, restore_schedulers
from flexgraph.training.checkpoint._coverage import derive_from_weights
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
from flexgraph.training.checkpoint._state import LoopState
from flexgraph.training.checkpoint._weights import WeightsLoaded, apply_weights, local_checksums

CHECKPOINT_FORMATS = ("native", "portable")
"""What a strategy's ``checkpoint_format`` option takes: its own format, or the portable one."""

__all__ = [
    "CHECKPOINT_FORMATS",
    "SHARDED_KEYS",
    "CheckpointIO",
    "CheckpointRestorer",
    "CheckpointWriter",
    "Checkpointer",
    "FileCheckpointIO",
    "FileStateRestorer",
    "LoopState",
    "OnRead",
    "PortableCheckpointIO",
    "Slices",
    "StateAccess",
    "TorchStateAccess",
    "WeightLoader",
    "WeightsLoaded",
    "apply_weights",
    "as_on_rank0",
    "derive_from_weights",
    "from_mmengine",
    "full_tensors",
    "human_bytes",
    "load_dcp_weights",
    "load_into_slices",
    "load_pretrained",
    "load_weights",
    "local_checksums",
    "optimizer_keyed_by",
    "optimizers_of",
    "portable_tensors",
    "read_manifest",
    "read_portable_tensor",
    "restore_schedulers",
    "tensor_bytes",
    "write_portable",
]
