"""``flexgraph run`` imports none of the offline checkpoint tools (``flexgraph ckpt``).

Checked on real runs, each in a fresh interpreter that runs the command line
(:func:`flexgraph.cli.main.main`, what ``flexgraph run`` calls) and then writes
down every module it imported: one run trains and saves; the next loads its
``load_from`` weights from a safetensors file (through that format's opener)
and resumes from the first run's checkpoint. Describing and converting
checkpoints (``flexgraph.training.checkpoint_tools``) and the DeepSpeed
strategy's modules, its checkpoint opener and inspector among them, stay
unimported: a ``torch.save`` or safetensors path loads no checkpoint plugin.
A third run loads a DeepSpeed checkpoint directory: that imports the DeepSpeed
strategy's opener (its run-time checkpoint module), still no offline tool.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from flexgraph.training.formats import read_checkpoint_file

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.py"
OFFLINE = ("flexgraph.training.checkpoint_tools", "flexgraph.strategies.deepspeed")
TOOLS = ("flexgraph.training.checkpoint_tools", "flexgraph.strategies.deepspeed.inspect")

_RUN = """
import json, sys
from flexgraph.cli.main import main
status = main(sys.argv[2:])
with open(sys.argv[1], "w") as f:
    json.dump(sorted(sys.modules), f)
sys.exit(status)
"""


def _run(work: Path, *options: str) -> tuple[str, set[str]]:
    """``flexgraph run`` of the quickstart for one epoch: its output, and what it imported."""
    modules = work.with_name(work.name + "-modules.json")
    result = subprocess.run(
        [sys.executable, "-c", _RUN, str(modules), "run", str(QUICKSTART), "--work-dir",
         str(work), "--cfg-options", "train_cfg.max_epochs=1", "visualizer=None", *options],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    output = " ".join((result.stdout + result.stderr).split())  # lines as logged, unwrapped
    return output, set(json.loads(modules.read_text()))


def test_training_loading_and_resuming_import_no_offline_checkpoint_tool(tmp_path):
    _, first = _run(tmp_path / "first")
    saved = tmp_path / "first" / "epoch_1.pth"
    weights = tmp_path / "weights.safetensors"
    save_file(dict(read_checkpoint_file(saved)["state_dict"]), str(weights))

    log, second = _run(tmp_path / "second", f"load_from={weights}", f"resume={saved}",
                       "train_cfg.max_epochs=2")

    assert "flexgraph.training.checkpoint._checkpointer" in first
    assert "flexgraph.training.formats._open" in second  # load_from went through the openers
    assert "(read as a safetensors file)" in log and "Resumed from" in log
    # resumed after epoch 1, it trained (and saved) epoch 2 alone
    assert sorted(p.name for p in (tmp_path / "second").glob("epoch_*")) == ["epoch_2.pth"]
    for imported in (first, second):
        assert not sorted(m for m in imported if m.startswith(OFFLINE))


def test_loading_a_deepspeed_directory_imports_its_opener_and_no_offline_tool(tmp_path):
    _run(tmp_path / "first")
    weights = read_checkpoint_file(tmp_path / "first" / "epoch_1.pth")["state_dict"]
    tag = tmp_path / "iter_1.ds"  # a tag directory as DeepSpeed writes it without ZeRO
    tag.mkdir()
    torch.save({"module": dict(weights)}, tag / "mp_rank_00_model_states.pt")

    log, second = _run(tmp_path / "second", f"load_from={tag}")

    assert "(read as a DeepSpeed checkpoint directory" in log
    assert "flexgraph.strategies.deepspeed.checkpoint" in second  # the opener, at run time
    assert not sorted(m for m in second if m.startswith(TOOLS))
