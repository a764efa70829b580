"""``describe_checkpoint``: what a checkpoint holds, read offline, without building the model.

Checkpoints are written in this process by flexgraph's own savers (the
:class:`Checkpointer` with each IO), so each test describes the real layout.
MMEngine's files are described in test_mmengine_checkpoints.py and DeepSpeed's
directories in tests/cli/test_deepspeed_cli.py, beside the runs that write them.
"""

from __future__ import annotations

import pytest
import torch
from flexgraph.strategies.fsdp.checkpoint import DistributedCheckpointIO
from mmengine.optim import OptimWrapper

from flexgraph.training.checkpoint import Checkpointer, FileCheckpointIO
from flexgraph.training.checkpoint_tools import CheckpointSummary, describe_checkpoint
from flexgraph.training.errors import CheckpointError, CheckpointNotFoundError

TRAINING_STATE = ("model", "optimizer", "param_schedulers", "loop state", "rng states")


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))


def _save(io, work, *, extras=None):
    """A checkpoint after one AdamW step, epoch 2 / iteration 7, as the loop saves it."""
    model = _Net()
    optim_wrapper = OptimWrapper(torch.optim.AdamW(model.parameters()))
    model.fc(torch.ones(2, 8)).sum().backward()
    optim_wrapper.step()
    checkpointer = Checkpointer(work, io=io)
    checkpoint = checkpointer.snapshot(model=model, optim_wrapper=optim_wrapper,
                                       param_schedulers=[], epoch=2, iteration=7, batch_idx=0,
                                       seed=0)
    checkpoint.update(extras or {})
    return checkpointer.save(checkpoint, "iter_7", model=model, optim_wrapper=optim_wrapper)


@pytest.mark.parametrize("io, writer", [(FileCheckpointIO(), "flexgraph, single device or DDP"),
                                        (DistributedCheckpointIO(), "flexgraph, FSDP (sharded)")],
                         ids=["file", "dcp"])
def test_flexgraphs_checkpoints_say_step_size_dtypes_and_state_inside(tmp_path, io, writer):
    path = _save(io, tmp_path, extras={"ema": {"loss": 0.5}})

    summary = describe_checkpoint(path)

    assert summary.format == io.format.name and summary.writer == writer
    assert summary.complete and summary.problem is None
    assert (summary.world_size, summary.epoch, summary.iteration) == (1, 2, 7)
    assert summary.parameters == 8 * 4 + 4 + 1  # weight, bias, and the int64 buffer
    assert summary.dtypes == {"float32": 36, "int64": 1}
    assert summary.contents == TRAINING_STATE
    assert summary.extras == ("ema",)
    assert summary.versions["torch_version"] == torch.__version__


def test_a_plain_state_dict_file_is_a_model_without_training_state(tmp_path):
    path = tmp_path / "weights.pt"
    torch.save(torch.nn.Linear(3, 2).to(torch.bfloat16).state_dict(), path)
    summary = describe_checkpoint(path)
    assert summary.writer == "a plain state_dict" and summary.complete
    assert (summary.parameters, summary.dtypes, summary.contents) == (8, {"bfloat16": 8},
                                                                      ("model",))
    assert summary.epoch is summary.iteration is summary.world_size is None


def test_a_dcp_directory_missing_a_shard_is_described_as_incomplete(tmp_path):
    path = _save(DistributedCheckpointIO(), tmp_path)
    next(path.glob("*.distcp")).unlink()
    summary = describe_checkpoint(path)
    assert not summary.complete
    assert "incomplete: its shard" in summary.problem and "is missing" in summary.problem
    assert summary.parameters == 37, "what it should hold still comes from .metadata"


def test_the_summary_round_trips_through_json(tmp_path):
    import json

    summary = describe_checkpoint(_save(FileCheckpointIO(), tmp_path))
    assert CheckpointSummary(**json.loads(json.dumps(summary.to_json()))) == summary


@pytest.mark.parametrize("content", [b"", b"just some text\n", b"PK\x03\x04 half a zip"],
                         ids=["empty", "text", "truncated-zip"])
def test_a_path_in_no_known_format_is_one_line_naming_the_formats_tried(tmp_path, content):
    path = tmp_path / "model.pth"
    path.write_bytes(content)
    with pytest.raises(CheckpointError) as refused:
        describe_checkpoint(path)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"checkpoint {str(path)!r} is not a checkpoint: it is not a "
                              f"torch.save file (MMEngine's .pth) or a torch.distributed."
                              f"checkpoint directory (.metadata) or a safetensors file or a "
                              f"DeepSpeed checkpoint directory (*model_states.pt)")


def test_a_missing_path_and_an_empty_directory_are_refused(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="'.*nowhere' does not exist"):
        describe_checkpoint(tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match="is not a checkpoint: it is not a torch.save"):
        describe_checkpoint(tmp_path)
