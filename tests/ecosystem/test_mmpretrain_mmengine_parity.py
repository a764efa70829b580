"""MMPreTrain's ViT-large MAE fine-tuning config: flexgraph trains its first epoch as MMEngine does.

The installed config, unchanged, is the ``_base_`` of a wrapper that only adds
an observing hook (:mod:`mmengine_parity_parts`); ``--cfg-options`` make it
small (:mod:`mae_finetune`: a tiny ``arch``, 32 px images of 5 classes, batch 4,
two workers) and end it after one epoch, in the fp32 it ships with. It trains
once under MMEngine's ``Runner`` and once under ``flexgraph run``, on one
device with one thread each. Everything random in it must draw what MMEngine
draws for the two to agree bit for bit: drop-path in the backbone, Mixup /
CutMix in the data preprocessor, the shuffling sampler, RandomResizedCrop,
RandomFlip, RandAugment and RandomErasing in the two workers, and the head's
TruncNormal initialisation.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.ecosystem.mae_finetune import (
    ROOT,
    config_path,
    overrides,
    write_images,
    write_pretrained,
)

pytestmark = pytest.mark.slow

pytest.importorskip("mmpretrain", reason="make test-ecosystem installs mmpretrain")

HERE = Path(__file__).resolve().parent
ITERATIONS = 10  # 40 training images, batch 4


def _wrapper(root: Path) -> Path:
    config = root / "vit-large.py"
    config.write_text(
        f"_base_ = [{str(config_path('large', 'ddp'))!r}]\n"
        "custom_imports = dict(imports=['mmengine_parity_parts'], allow_failed_imports=False)\n"
        "custom_hooks = [dict(type='FirstEpochProbe')]\n")
    return config


def _run(command: list[str], cwd: Path, **env: str) -> None:
    paths = [str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")]
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "OMP_NUM_THREADS": "1",
                               "PYTHONPATH": os.pathsep.join(filter(None, paths)), **env})
    assert done.returncode == 0, f"{command[:3]}:\n{done.stderr[-4000:]}"


def _probe(work_dir: Path) -> dict[str, object]:
    probe = work_dir / "probe"
    return {"initial": torch.load(probe / "initial.pt", weights_only=True),
            "losses": json.loads((probe / "losses.json").read_text()),
            "epoch1": torch.load(probe / "epoch1.pt", weights_only=True)}


@pytest.fixture(scope="module")
def runs(module_folder) -> dict[str, dict[str, object]]:
    """The probes of both runs, by runner: ``mmengine`` and ``flexgraph``."""
    root = module_folder
    pretrained = write_pretrained(root / "pretrained.pth", patch_size=16)
    # MMEngine's Runner wants the test split's three keys all set or all None.
    options = [*overrides(write_images(root / "data"), pretrained, "ddp", fp32=True, epochs=1),
               "test_cfg=None"]
    config = _wrapper(root)
    _run([sys.executable, str(HERE / "mmengine_parity_parts.py"), str(config),
          str(root / "mmengine"), "--cfg-options", *options], root,
         TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1")
    _run([sys.executable, "-m", "flexgraph", "run", str(config), "--work-dir",
          str(root / "flexgraph"), "--cfg-options", *options], root)
    return {name: _probe(root / name) for name in ("mmengine", "flexgraph")}


def _assert_same_weights(theirs: dict[str, torch.Tensor], ours: dict[str, torch.Tensor]) -> None:
    assert ours.keys() == theirs.keys()
    different = [key for key, value in theirs.items() if not torch.equal(ours[key], value)]
    assert not different, f"{len(different)} of {len(theirs)} tensors differ: {different[:5]}"


def test_training_starts_from_mmengine_s_weights(runs):
    """The pretrained backbone, and the head as TruncNormal drew it."""
    _assert_same_weights(runs["mmengine"]["initial"], runs["flexgraph"]["initial"])


def test_every_loss_of_the_first_epoch_is_mmengine_s(runs):
    theirs, ours = runs["mmengine"]["losses"], runs["flexgraph"]["losses"]
    assert len(theirs) == len(ours) == ITERATIONS
    assert len({step["loss"] for step in theirs}) == ITERATIONS  # training moves
    for i, (a, b) in enumerate(zip(theirs, ours, strict=True)):
        assert b == a, f"iteration {i + 1}: MMEngine's losses {a}, flexgraph's {b}"


def test_the_weights_after_the_first_epoch_are_mmengine_s(runs):
    _assert_same_weights(runs["mmengine"]["epoch1"], runs["flexgraph"]["epoch1"])
    assert any(not torch.equal(runs["flexgraph"]["initial"][key], value)
               for key, value in runs["flexgraph"]["epoch1"].items())
