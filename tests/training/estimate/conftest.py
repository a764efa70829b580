"""A ViT-tiny config on synthetic 32 px images: small enough to run for real in a test."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TINY_VIT = f'''
import sys
sys.path.insert(0, {str(ROOT / "examples" / "estimate")!r})
custom_imports = dict(imports=["vit_sized"], allow_failed_imports=False)
model = dict(type="SizedViT", arch="tiny", img_size=32, patch_size=8, num_classes=10,
             data_preprocessor=dict(type="ImgDataPreprocessor", mean=[127.5] * 3,
                                    std=[57.0] * 3))
train_dataloader = dict(batch_size=16, num_workers=0,
                        dataset=dict(type="SyntheticImages", length=64, size=32,
                                     num_classes=10),
                        sampler=dict(type="DefaultSampler", shuffle=False))
optim_wrapper = dict(optimizer=dict(type="AdamW", lr=1e-3))
train_cfg = dict(by_epoch=True, max_epochs=1)
'''


@pytest.fixture(scope="module")
def tiny_vit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("estimate") / "tiny_vit.py"
    path.write_text(TINY_VIT)
    return path
