"""Planning never imports torch: not ``import flexgraph``, not any of the three front ends.

Checked in fresh interpreters, since the test process itself may have imported
torch for other tests.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

CHECK = """
import sys
{body}
loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
assert not loaded, loaded
print("ok")
"""


def run_clean(body: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", CHECK.format(body=body)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_import_flexgraph_does_not_import_torch() -> None:
    run_clean("import flexgraph, flexgraph.spec")


@pytest.mark.parametrize("name", ["textstats.yaml", "textstats_pipeline.py", "textstats_cfg.py"])
def test_planning_an_example_does_not_import_torch(name: str) -> None:
    run_clean(
        "from flexgraph.spec import load_spec\n"
        f"plan = load_spec({str(EXAMPLES / name)!r}).plan()\n"
        "assert plan.order[0] == 'load_text'"
    )


def test_checking_the_training_plans_functions_does_not_import_torch(tmp_path: Path) -> None:
    """``flexgraph plan`` checks every function of the DDP training plan, torch-free."""
    config = tmp_path / "cfg.py"
    config.write_text("model = dict(type='AnyModel')\n")
    run_clean(
        "from flexgraph.cli.plan_cmd import load_spec_and_plan\n"
        "from flexgraph.core.references import check_references\n"
        f"_, plan = load_spec_and_plan({str(config)!r}, 'ddp', [])\n"
        "assert 'flexgraph.strategies.ddp:wrap_ddp' in [s.fn for s in plan.steps]\n"
        "assert check_references(plan) == [], check_references(plan)"
    )


def test_the_plan_names_the_reader_of_load_from_and_resume_without_torch(tmp_path: Path) -> None:
    """An existing ``load_from`` / ``resume`` path is recognised by its content (a
    portable checkpoint's marker, a DCP ``.metadata``), torch-free; a missing one and
    ``resume='auto'`` get no note."""
    portable = tmp_path / "weights.pth"  # a portable directory, whatever its name says
    portable.mkdir()
    (portable / ".flexgraph-portable").write_text("flexgraph.portable/1\n")
    sharded = tmp_path / "iter_4.ckpt"
    sharded.mkdir()
    (sharded / ".metadata").write_bytes(b"")
    config = tmp_path / "cfg.py"
    config.write_text(f"model = dict(type='AnyModel')\nload_from = {str(portable)!r}\n"
                      f"resume = {str(sharded)!r}\n")
    run_clean(
        "from flexgraph.cli.plan_cmd import checkpoint_notes, load_spec_and_plan\n"
        f"spec, plan = load_spec_and_plan({str(config)!r}, 'ddp', [])\n"
        "notes = checkpoint_notes(spec.cfg, plan)\n"
        f"assert notes == {{'load_checkpoint': \"load_from {str(portable)!r} is read as a "
        "portable checkpoint directory (torch.distributed.checkpoint + manifest.json)\", "
        f"'resume': \"resume {str(sharded)!r} is read as a torch.distributed.checkpoint "
        "directory (.metadata)\"}, notes\n"
        "spec, plan = load_spec_and_plan("
        f"{str(config)!r}, 'ddp', ['resume=auto', 'load_from={tmp_path / 'absent'}'])\n"
        "assert checkpoint_notes(spec.cfg, plan) == {}"
    )


def test_the_formats_part_tells_every_format_apart_without_torch(tmp_path: Path) -> None:
    """``flexgraph.training.formats`` recognises each format by content, torch-free; its
    names that read tensors are listed on its face and load torch only when first used."""
    import json
    import zipfile

    with zipfile.ZipFile(tmp_path / "weights.bin", "w") as archive:  # torch.save's layout
        archive.writestr("weights/data.pkl", b"")
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    (tmp_path / "model.st").write_bytes(len(header).to_bytes(8, "little") + header + bytes(4))
    for name, marker in (("sharded", ".metadata"), ("tag", "mp_rank_00_model_states.pt"),
                         ("portable", ".flexgraph-portable")):
        (tmp_path / name).mkdir()
        (tmp_path / name / marker).write_bytes(b"")
    run_clean(
        "from pathlib import Path\n"
        "import flexgraph.training.formats as formats\n"
        f"root = Path({str(tmp_path)!r})\n"
        "found = {name: formats.format_of(root / name).key for name in\n"
        "         ('weights.bin', 'model.st', 'sharded', 'tag', 'portable')}\n"
        "assert found == {'weights.bin': 'torch', 'model.st': 'safetensors', 'sharded': 'dcp',\n"
        "                 'tag': 'deepspeed', 'portable': 'portable'}, found\n"
        "assert {'read_checkpoint_file', 'read_any_checkpoint'} <= set(formats.__all__)"
    )
