"""Other tools' checkpoints: ``load_from`` reads them, ``convert_checkpoint`` rewrites them.

Every format is recognised by content (the files here are misnamed on
purpose). Round trips: convert, describe (``ckpt inspect``), load into a model:
the same tensors. flexgraph's own checkpoints are written by its Checkpointer
(DCP in its single-process mode); DeepSpeed's tags are converted and loaded in
tests/cli/test_deepspeed_cli.py, beside the runs that write them.
"""

from __future__ import annotations

import zipfile

import pytest
import safetensors.torch
import torch
import torch.distributed.checkpoint as dcp
from flexgraph.strategies.fsdp.checkpoint import DistributedCheckpointIO, FullStateFileIO
from mmengine.optim import OptimWrapper

from flexgraph.training.checkpoint import (
    Checkpointer,
    FileCheckpointIO,
)
from flexgraph.training.checkpoint_tools import TARGETS, convert_checkpoint, describe_checkpoint
from flexgraph.training.errors import CheckpointError, CheckpointExistsError
from flexgraph.training.formats import (
    DCP_DIRECTORY,
    SAFETENSORS_FILE,
    TORCH_SAVE_FILE,
    format_of,
    read_checkpoint_file,
)
from tests.training.training_helpers import run_steps

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)
        self.head = torch.nn.Linear(4, 2, bias=False)
        self.register_buffer("steps", torch.full((), 7, dtype=torch.int64))


def _trained() -> tuple[_Net, OptimWrapper]:
    torch.manual_seed(0)
    model = _Net()
    optim_wrapper = OptimWrapper(torch.optim.AdamW(model.parameters()))
    model.head(model.fc(torch.ones(2, 8))).sum().backward()
    optim_wrapper.step()
    return model, optim_wrapper


def _save(io, work):
    model, optim_wrapper = _trained()
    checkpointer = Checkpointer(work, io=io)
    checkpoint = checkpointer.snapshot(model=model, optim_wrapper=optim_wrapper,
                                       param_schedulers=[], epoch=2, iteration=7, batch_idx=0,
                                       seed=0)
    return checkpointer.save(checkpoint, "iter_7", model=model, optim_wrapper=optim_wrapper)


def _loaded(path) -> dict[str, torch.Tensor]:
    """``path`` loaded as ``load_from`` loads it into a whole model."""
    model = _Net()
    for value in model.state_dict().values():
        torch.nn.init.zeros_(value)
    left_out = Checkpointer(path.parent / "work", io=FileCheckpointIO()).load_weights(
        path, model, on_read=lambda checkpoint: None)
    assert not left_out, left_out.describe()
    return model.state_dict()


def _assert_same(loaded, expected):
    assert sorted(loaded) == sorted(expected)
    for key, value in expected.items():
        assert torch.equal(loaded[key], value), key


# -- load_from ------------------------------------------------------------------------------

OTHER_TOOLS = {  # what another tool wrote -> the format it is recognised as
    "torch.save(state_dict)": (lambda sd, p: torch.save(sd, p), TORCH_SAVE_FILE),
    "{'model': state_dict}": (lambda sd, p: torch.save({"model": sd}, p), TORCH_SAVE_FILE),
    "DDP's module. prefix": (lambda sd, p: torch.save(
        {"state_dict": {f"module.{k}": v for k, v in sd.items()}}, p), TORCH_SAVE_FILE),
    "safetensors": (lambda sd, p: safetensors.torch.save_file(sd, p), SAFETENSORS_FILE),
    "safetensors, module. prefix": (lambda sd, p: safetensors.torch.save_file(
        {f"module.{k}": v for k, v in sd.items()}, p), SAFETENSORS_FILE),
    "DCP of a bare state_dict": (lambda sd, p: dcp.save(dict(sd), checkpoint_id=str(p)),
                                 DCP_DIRECTORY),
}


@pytest.mark.parametrize("kind", sorted(OTHER_TOOLS))
def test_load_from_reads_what_other_tools_wrote_by_content(tmp_path, kind):
    write, expected_format = OTHER_TOOLS[kind]
    weights = _trained()[0].state_dict()
    path = tmp_path / "weights.bin"  # the name says nothing
    write(weights, path)
    assert format_of(path) is expected_format
    _assert_same(_loaded(path), weights)


def test_load_from_a_safetensors_file_through_the_run(tmp_path, make_cfg):
    trained = run_steps(make_cfg())["model"]
    path = tmp_path / "model.pth"
    safetensors.torch.save_file(trained.state_dict(), path)
    fresh = run_steps(make_cfg(load_from=str(path)), last="wrap_model")["model"]
    _assert_same(fresh.state_dict(), trained.state_dict())


def test_a_damaged_safetensors_file_is_one_line_naming_it(tmp_path):
    path = tmp_path / "cut.safetensors"
    safetensors.torch.save_file(_trained()[0].state_dict(), path)
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(CheckpointError) as caught:
        _loaded(path)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


# -- convert --------------------------------------------------------------------------------

SOURCES = {  # name -> write one in tmp_path, return its path
    "flexgraph .pth": lambda tmp: _save(FileCheckpointIO(), tmp / "a"),
    "flexgraph DCP": lambda tmp: _save(DistributedCheckpointIO(), tmp / "b"),
    "safetensors": lambda tmp: (safetensors.torch.save_file(_trained()[0].state_dict(),
                                                            tmp / "w.st"), tmp / "w.st")[1],
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("source", sorted(SOURCES))
def test_convert_then_inspect_then_load_gives_the_same_weights(tmp_path, source, target):
    path = SOURCES[source](tmp_path)
    destination = tmp_path / "converted"
    done = convert_checkpoint(path, destination, to=target)
    summary = describe_checkpoint(destination)
    assert summary.complete and summary.parameters == describe_checkpoint(path).parameters
    assert summary.format == {"torch": TORCH_SAVE_FILE, "dcp": DCP_DIRECTORY,
                              "safetensors": SAFETENSORS_FILE}[target].name
    assert summary.dtypes == {"float32": 44, "int64": 1}
    assert done.tensors >= 3 and done.largest_tensor_bytes >= 32 * 4  # fc.weight, RNG states
    _assert_same(_loaded(destination), _trained()[0].state_dict())
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_dcp_checkpoint_converts_to_one_file_keyed_by_name_that_fsdp_full_resumes(tmp_path):
    """Weights, optimizer state by parameter name, loop state: FullStateFileIO's layout."""
    source = _save(DistributedCheckpointIO(), tmp_path / "work")
    done = convert_checkpoint(source, tmp_path / "full.pth", to="torch")
    assert done.left_out == ()
    with zipfile.ZipFile(tmp_path / "full.pth") as archive:
        assert archive.testzip() is None, "every record's CRC-32 is right"
    full = read_checkpoint_file(tmp_path / "full.pth")
    model, optim_wrapper = _trained()
    expected = FullStateFileIO().states(model, optim_wrapper)["optimizer"]
    assert full["optimizer"]["param_groups"] == expected["param_groups"]
    for name, state in expected["state"].items():
        for key, value in state.items():
            assert torch.equal(full["optimizer"]["state"][name][key], value), (name, key)
    assert full["meta"]["iter"] == 7 and full["meta"]["epoch"] == 2
    assert describe_checkpoint(tmp_path / "full.pth").writer == \
        "flexgraph, FSDP (state_dict_cfg='full')"


def test_a_name_keyed_file_converts_to_dcp_in_the_sharded_ios_layout(tmp_path):
    full = tmp_path / "full.pth"
    convert_checkpoint(_save(DistributedCheckpointIO(), tmp_path / "work"), full, to="torch")
    done = convert_checkpoint(full, tmp_path / "back.dcp", to="dcp")
    assert done.left_out == ()
    model, optim_wrapper = _trained()
    fresh = _Net()
    restored = DistributedCheckpointIO().read(
        tmp_path / "back.dcp", model=fresh,
        optim_wrapper=OptimWrapper(torch.optim.AdamW(fresh.parameters())))
    _assert_same(restored["state_dict"], model.state_dict())
    expected = DistributedCheckpointIO().states(model, optim_wrapper)["optimizer"]
    for name, state in expected["state"].items():
        for key, value in state.items():
            assert torch.equal(restored["optimizer"]["state"][name][key], value), (name, key)
    assert restored["meta"]["iter"] == 7


def test_a_position_keyed_optimizer_is_left_out_of_dcp_and_said_so(tmp_path):
    done = convert_checkpoint(_save(FileCheckpointIO(), tmp_path / "work"),
                              tmp_path / "x.dcp", to="dcp")
    assert len(done.left_out) == 1 and done.left_out[0].startswith("optimizer: its state "
                                                                  "numbers the parameters")
    assert "optimizer" not in describe_checkpoint(tmp_path / "x.dcp").contents


def test_convert_never_overwrites_and_names_what_it_cannot_read(tmp_path):
    source = _save(FileCheckpointIO(), tmp_path / "work")
    (tmp_path / "taken").write_text("mine")
    with pytest.raises(CheckpointExistsError, match="convert destination .*taken' exists"):
        convert_checkpoint(source, tmp_path / "taken", to="torch")
    assert (tmp_path / "taken").read_text() == "mine"
    with pytest.raises(CheckpointError, match="is not a checkpoint: it is not a torch.save "
                                              "file .* or a safetensors file"):
        convert_checkpoint(tmp_path / "taken", tmp_path / "out", to="torch")
    assert not (tmp_path / "out").exists()
    with pytest.raises(CheckpointError, match="the folder of convert destination .* does not "
                                              "exist"):
        convert_checkpoint(source, tmp_path / "no" / "out.pth", to="torch")
