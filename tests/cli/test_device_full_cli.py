"""``flexgraph run`` on a full device: exit 2, one line, and the previous checkpoint resumes.

The quickstart with a wider hidden layer saves about 186 KiB per epoch, so the
300 KiB tmpfs (``small_device``, a real filesystem) takes the first epoch's
checkpoint and runs out during the second's. Run through ``main(argv)`` in this
process: the CLI's whole error path, without another interpreter's imports.
"""

from __future__ import annotations

import shutil

from flexgraph.cli.main import main
from tests.cli.cli_helpers import QUICKSTART, ROOT

CONFIG = f"""
_base_ = {str(QUICKSTART)!r}
model = dict(hidden=200)
train_cfg = dict(max_epochs=2, val_interval=10)
default_hooks = dict(checkpoint=dict(interval=1, max_keep_ckpts=3))
visualizer = dict(_delete_=True, type="Visualizer", vis_backends=[dict(type="LocalVisBackend")])
"""


def test_a_full_device_exits_2_in_one_line_and_the_previous_checkpoint_resumes(
        small_device, tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "examples"))  # the quickstart's custom_imports
    config = tmp_path / "cfg.py"
    config.write_text(CONFIG)
    work = small_device / "work"

    status = main(["run", str(config), "--work-dir", str(work)])

    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert "Traceback" not in "\n".join(lines) and lines[-1].startswith("error: ")
    assert "inline_container" not in lines[-1]
    assert lines[-1].startswith(
        f"error: step 'train': the device is full: saving checkpoint "
        f"{str(work / 'epoch_2.pth')!r} needs about 185.7 KiB (the state's size)")
    assert f"the previous checkpoint {str(work / 'epoch_1.pth')!r} is intact" in lines[-1]
    assert not list(work.glob(".tmp-*")), "nothing half-written is left"

    # room for the resumed run's log, scalar files and watch folder: the first run's
    # record goes, as a user would clear it
    shutil.rmtree(next(work.glob("*/vis_data")).parent)
    (work / "metrics.jsonl").unlink()
    status = main(["run", str(config), "--work-dir", str(work), "--resume", "auto",
                   "--cfg-options", "train_cfg.max_epochs=1"])
    assert status == 0, capsys.readouterr().err
    assert f"Resumed from {work / 'epoch_1.pth'}" in capsys.readouterr().out + "".join(
        p.read_text() for p in work.glob("*/*.log"))
