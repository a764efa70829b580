"""``flexgraph ckpt inspect``: a table or JSON on stdout, exit 2 in one line for a non-checkpoint.

Run through ``main(argv)`` in this process; what is read is specified in
tests/training/checkpoint_tools/test_checkpoint_inspect.py, this is how it is shown.
"""

from __future__ import annotations

import json

import torch

from flexgraph.cli.main import main
from flexgraph.training.checkpoint import Checkpointer
from flexgraph.training.checkpoint_tools import CheckpointSummary, describe_checkpoint


def _checkpoint(work):
    model = torch.nn.Linear(8, 4)
    checkpointer = Checkpointer(work)
    checkpoint = checkpointer.snapshot(model=model, optim_wrapper=None, param_schedulers=[],
                                       epoch=3, iteration=30, batch_idx=0, seed=0)
    return checkpointer.save(checkpoint, "epoch_3", model=model)


def test_inspect_prints_a_table_of_what_the_checkpoint_holds(tmp_path, capsys):
    path = _checkpoint(tmp_path)
    assert main(["ckpt", "inspect", str(path)]) == 0
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip()
            for line in capsys.readouterr().out.splitlines() if line.count("│") == 3}
    assert rows["format"] == "a torch.save file (MMEngine's .pth)"
    assert rows["written by"] == "flexgraph, single device or DDP"
    assert rows["complete"] == "yes"
    assert rows["world size"] == "1" and rows["step"] == "epoch 3, iteration 30"
    assert rows["parameters"] == "36" and rows["dtypes"] == "float32 (36)"
    assert rows["state inside"] == "model, param_schedulers, loop state, rng states"


def test_inspect_json_is_the_summary_and_reads_back(tmp_path, capsys):
    path = _checkpoint(tmp_path)
    assert main(["ckpt", "inspect", str(path), "--format", "json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert CheckpointSummary(**printed) == describe_checkpoint(path)
    assert printed["iteration"] == 30 and printed["contents"][0] == "model"


def test_inspect_of_something_else_exits_2_naming_the_formats_tried(tmp_path, capsys):
    path = tmp_path / "notes.txt"
    path.write_text("not a checkpoint\n")
    assert main(["ckpt", "inspect", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        f"error: checkpoint {str(path)!r} is not a checkpoint: it is not a torch.save file "
        f"(MMEngine's .pth) or a torch.distributed.checkpoint directory (.metadata) or a "
        f"safetensors file or a DeepSpeed checkpoint directory (*model_states.pt) or a portable "
        f"checkpoint directory (torch.distributed.checkpoint + manifest.json)"]


def test_convert_says_what_it_wrote_and_left_out_and_inspect_reads_the_result(tmp_path, capsys):
    from flexgraph.cli.ckpt_cmd import TARGETS as CLI_TARGETS
    from flexgraph.training.checkpoint_tools import TARGETS

    assert sorted(CLI_TARGETS) == sorted(TARGETS)
    path = _checkpoint(tmp_path / "work")
    out = tmp_path / "model.weights"
    assert main(["ckpt", "convert", str(path), str(out), "--to", "safetensors"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (f"converted {path} (a torch.save file (MMEngine's .pth)) to {out} "
                        f"(safetensors): 2 tensors, the largest 128 B")
    assert lines[1:] == ["left out: meta, param_schedulers, rng_states: a safetensors "
                         "checkpoint holds the model's weights only"]
    assert main(["ckpt", "inspect", str(out), "--format", "json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["format"] == "a safetensors file" and printed["parameters"] == 36


def test_convert_onto_an_existing_path_exits_2_in_one_line_and_leaves_it(tmp_path, capsys):
    path = _checkpoint(tmp_path / "work")
    taken = tmp_path / "taken.pth"
    taken.write_text("mine")
    assert main(["ckpt", "convert", str(path), str(taken)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: convert destination {str(taken)!r} exists; give a new path (convert never "
        f"overwrites)"]
    assert taken.read_text() == "mine"
