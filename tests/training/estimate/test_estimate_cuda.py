"""On a CUDA machine: the single-device estimate against ``torch.cuda.max_memory_allocated``.

ViT-base/16 at 224 px, batch 32, AdamW under AMP fp16 (autocast, flash
attention): the estimate (traced on the meta device) must be within 10% of the
peak the caching allocator reports for a real step (the second, when AdamW's
states exist), measured from a reset just before it.
"""

from __future__ import annotations

import pytest
import torch

from flexgraph.core.strategy import get_strategy
from flexgraph.spec import load_spec
from flexgraph.training import standard_graph
from flexgraph.training.estimate import Candidate, estimate

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

VIT_BASE_AMP = '''
custom_imports = dict(imports=["vit_sized"], allow_failed_imports=False)
model = dict(type="SizedViT", arch="base", img_size=224, patch_size=16, num_classes=1000,
             data_preprocessor=dict(type="ImgDataPreprocessor", mean=[127.5] * 3,
                                    std=[57.0] * 3))
train_dataloader = dict(batch_size=32, num_workers=0,
                        dataset=dict(type="SyntheticImages", length=64, size=224),
                        sampler=dict(type="DefaultSampler", shuffle=False))
optim_wrapper = dict(type="AmpOptimWrapper", optimizer=dict(type="AdamW", lr=1e-4))
train_cfg = dict(by_epoch=True, max_epochs=1)
'''


def _cuda_peak_of_second_step(cfg) -> int:
    from flexgraph.training.estimate._config import first_batch
    from flexgraph.training.steps import build_model, setup_env

    model = build_model(cfg, setup_env(cfg, device="cuda")).cuda().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cuda")
    batch = first_batch(cfg)

    def step() -> None:
        data = model.data_preprocessor(batch, True)
        with torch.autocast("cuda", dtype=torch.float16):
            loss, _ = model.parse_losses(model._run_forward(data, mode="loss"))
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

    step()
    del batch
    batch = first_batch(cfg)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated()


def test_amp_estimate_within_10_percent_of_cuda_peak(tmp_path, monkeypatch) -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    monkeypatch.syspath_prepend(str(root / "examples" / "estimate"))
    path = tmp_path / "vit_base_amp.py"
    path.write_text(VIT_BASE_AMP)
    cfg = load_spec(path, default_graph=standard_graph).cfg
    single = Candidate(label="single", strategy=get_strategy("single"), amp="fp16",
                       name="single")
    estimated = estimate(cfg, [single], world_size=1).candidates[0].peak
    measured = _cuda_peak_of_second_step(cfg)
    assert abs(estimated / measured - 1) < 0.10, (estimated, measured)
