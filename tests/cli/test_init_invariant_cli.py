"""One invariant: after setup, every layout holds a one-device run's weights, bit for bit.

Real processes over gloo, each layout run once on a small MMEngine model whose
weights come from every kind of initialisation a model has: ``init_cfg``
(``TruncNormal`` on every ``Linear``, ``Kaiming`` on the ``Conv1d``,
``Constant`` on every ``LayerNorm``, ``Pretrained`` with a ``prefix`` on a
submodule), modules' own ``reset_parameters`` (an ``Embedding``, a ``GRU``),
an initialiser that runs in a constructor (mmcv's ``ConvModule``), a 0-d
parameter (mmdet's ``Scale``), a module whose ``init_weights`` the record
cannot follow (initialised whole on rank 0 and sent) and a head whose rows do
not split evenly over four ranks. Each run's ``Fingerprint`` hook writes, when training starts, the
digest of every gathered full weight (rank 0) and every rank's torch
random-number state.

The digests are the same under a single device, DDP on 2, FSDP on 2 (no wrap
policy) and on 4 (one unit per block), HSDP 2x2 and ZeRO-3 on 2 and on 4, and
equal those of ``torch.manual_seed(seed)``, building ``cfg.model`` and calling
``init_weights()`` in plain PyTorch on the CPU; every rank of every layout
goes on from the one-device run's random-number state.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.cli.cli_helpers import flexgraph_run

pytestmark = pytest.mark.slow  # every test here starts processes

SEED = 11
PARTS = textwrap.dedent(
    '''
    """Test-only model, data and hook for the init invariant."""
    import hashlib
    import json
    import os

    import torch
    import torch.nn.functional as F
    from mmengine.hooks import Hook
    from mmengine.model import BaseModel, BaseModule
    from mmengine.registry import DATASETS, HOOKS, MODELS

    INIT_CFG = [dict(type="TruncNormal", layer="Linear", std=0.02, bias=0.0),
                dict(type="Kaiming", layer="Conv1d"),
                dict(type="Constant", layer="LayerNorm", val=1.0, bias=0.0)]


    class Scale(torch.nn.Module):
        """mmdet's Scale: one 0-d parameter."""

        def __init__(self, scale=1.5):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.tensor(scale, dtype=torch.float))

        def forward(self, x):
            return x * self.scale


    class ConvModule(torch.nn.Module):
        """mmcv's ConvModule: its constructor initialises its convolution and norm."""

        def __init__(self, cin, cout):
            super().__init__()
            self.conv = torch.nn.Conv2d(cin, cout, 3, padding=1, bias=False)
            self.bn = torch.nn.BatchNorm2d(cout)
            torch.nn.init.kaiming_normal_(self.conv.weight, mode="fan_out",
                                          nonlinearity="relu")
            torch.nn.init.constant_(self.bn.weight, 1)
            torch.nn.init.constant_(self.bn.bias, 0)

        def forward(self, x):
            return F.relu(self.bn(self.conv(x)))


    class Lookup(BaseModule):
        """An init_weights the record cannot follow (it writes through numpy): rank 0
        initialises this module alone whole and sends it."""

        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(16, 16)

        def init_weights(self):
            self.fc.weight.data.numpy()[:] = torch.randn(16, 16).numpy()

        def forward(self, x):
            return self.fc(x)


    class Stem(BaseModule):
        def __init__(self, init_cfg=None):
            super().__init__(init_cfg)
            self.norm = torch.nn.LayerNorm(12)
            self.proj = torch.nn.Linear(12, 16)

        def forward(self, x):
            return self.proj(self.norm(x))


    class Block(BaseModule):
        def __init__(self, width):
            super().__init__()
            self.norm = torch.nn.LayerNorm(width)
            self.up = torch.nn.Linear(width, 2 * width)
            self.down = torch.nn.Linear(2 * width, width)

        def forward(self, x):
            return x + self.down(F.gelu(self.up(self.norm(x))))


    @MODELS.register_module(force=True)
    class InvariantNet(BaseModel):
        def __init__(self, stem_init=None, data_preprocessor=None):
            super().__init__(data_preprocessor=data_preprocessor, init_cfg=INIT_CFG)
            self.conv = ConvModule(3, 4)
            self.stem = Stem(stem_init)
            self.embed = torch.nn.Embedding(7, 16)
            self.blocks = torch.nn.ModuleList(Block(16) for _ in range(2))
            self.gru = torch.nn.GRU(16, 16, batch_first=True)
            self.mix = torch.nn.Conv1d(16, 16, 1)
            self.lookup = Lookup()
            self.scale = Scale()
            self.head = torch.nn.Linear(16, 5)

        def forward(self, inputs, labels=None, mode="tensor"):
            x = torch.stack(list(inputs))
            image = self.conv(x[:, :12].reshape(-1, 3, 2, 2)).flatten(1)[:, :8]
            tokens = self.stem(torch.cat([image, x[:, 12:]], dim=1)) + self.embed.weight.mean(0)
            for block in self.blocks:
                tokens = block(tokens)
            tokens = self.gru(tokens[:, None])[0][:, 0]
            tokens = self.lookup(self.mix(tokens[:, :, None])[:, :, 0])
            logits = self.head(self.scale(tokens))
            if mode == "loss":
                return {"loss": F.cross_entropy(logits, torch.stack(list(labels)))}
            return logits


    @DATASETS.register_module(force=True)
    class Rows(torch.utils.data.Dataset):
        def __init__(self, n=32):
            g = torch.Generator().manual_seed(1)
            self.x, self.y = torch.randn(n, 16, generator=g), torch.randint(0, 5, (n,), generator=g)
            self.metainfo = {}

        def __len__(self):
            return len(self.y)

        def __getitem__(self, i):
            return {"inputs": self.x[i], "labels": self.y[i]}


    def digests(weights):
        """Each entry's dtype, shape and sha256 of its bytes."""
        return {name: f"{t.dtype} {tuple(t.shape)} "
                      f"{hashlib.sha256(t.detach().reshape(-1).contiguous().view(torch.uint8).numpy()).hexdigest()}"
                for name, t in weights.items()}


    def _whole(model):
        """The full weights on rank 0, gathered from every layout."""
        import torch.distributed as dist

        engine = getattr(model, "engine", None)
        if engine is not None:
            import deepspeed

            module = engine.module
            with deepspeed.zero.GatheredParameters(list(module.parameters())):
                return {k: v.detach().clone().reshape(getattr(v, "flexgraph_saved_shape",
                                                              v.shape))
                        for k, v in module.state_dict(keep_vars=True).items()}
        module = getattr(model, "module", model)
        if dist.is_initialized() and not hasattr(model, "module"):  # FSDP: shards
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions, get_model_state_dict)

            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            return dict(get_model_state_dict(model, options=options))
        return {k: v.detach().clone() for k, v in module.state_dict().items()}


    @HOOKS.register_module(force=True)
    class Fingerprint(Hook):
        def before_train(self, runner):
            weights = _whole(runner.model)
            if runner.rank == 0:
                with open(os.path.join(runner.work_dir, "weights.json"), "w") as f:
                    json.dump(digests(weights), f)
            state = hashlib.sha256(torch.get_rng_state().numpy()).hexdigest()
            with open(os.path.join(runner.work_dir, f"rng-rank{runner.rank}.json"), "w") as f:
                json.dump(state, f)
    '''
)

CONFIG = textwrap.dedent(
    f"""
    custom_imports = dict(imports=['invariant_parts'], allow_failed_imports=False)
    model = dict(type='InvariantNet', stem_init=dict(
        type='Pretrained', checkpoint='stem.pth', prefix='backbone.stem'))
    train_dataloader = dict(batch_size=2, num_workers=0, dataset=dict(type='Rows'),
                            sampler=dict(type='DefaultSampler', shuffle=False))
    optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.01))
    train_cfg = dict(by_epoch=False, max_iters=1)
    default_hooks = dict(checkpoint=None, logger=dict(type='LoggerHook', interval=1))
    custom_hooks = [dict(type='Fingerprint')]
    randomness = dict(seed={SEED})
    """
)
BLOCKS = ("auto_wrap_policy=dict(type='torch.distributed.fsdp.wrap.transformer_auto_wrap_policy',"
          " transformer_layer_cls=['Block'])")
LAYOUTS = {
    "single": ("", 1),
    "ddp-2": ("strategy = dict(type='DDPStrategy')\n", 2),
    "fsdp-2": ("strategy = dict(type='FSDPStrategy')\n", 2),
    "fsdp-4": (f"strategy = dict(type='FSDPStrategy', model_wrapper=dict({BLOCKS}))\n", 4),
    "hsdp-2x2": (f"strategy = dict(type='FSDPStrategy', model_wrapper=dict({BLOCKS}, "
                 f"sharding_strategy='HYBRID_SHARD', device_mesh=(2, 2)))\n", 4),
    "zero3-2": ("strategy = dict(type='DeepSpeedStrategy', zero_optimization=dict(stage=3))\n"
                "optim_wrapper = dict(type='DeepSpeedOptimWrapper', optimizer=dict(type='SGD', "
                "lr=0.01))\n", 2),
    "zero3-4": ("strategy = dict(type='DeepSpeedStrategy', zero_optimization=dict(stage=3))\n"
                "optim_wrapper = dict(type='DeepSpeedOptimWrapper', optimizer=dict(type='SGD', "
                "lr=0.01))\n", 4),
}


def _plain_pytorch(root: Path) -> tuple[dict[str, str], str]:
    """``torch.manual_seed(seed)``, build ``cfg.model``, ``init_weights()``, on the CPU."""
    from mmengine.registry import MODELS

    sys.path.insert(0, str(root))
    try:
        parts = importlib.import_module("invariant_parts")
        torch.manual_seed(SEED)
        model = MODELS.build(dict(type="InvariantNet", stem_init=dict(
            type="Pretrained", checkpoint=str(root / "stem.pth"), prefix="backbone.stem")))
        model.init_weights()
        state = hashlib.sha256(torch.get_rng_state().numpy()).hexdigest()
        return parts.digests(model.state_dict()), state
    finally:
        sys.path.remove(str(root))
        sys.modules.pop("invariant_parts", None)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("invariant")
    (root / "invariant_parts.py").write_text(PARTS)
    generator = torch.Generator().manual_seed(3)  # values no initialiser draws
    torch.save({"state_dict": {
        "backbone.stem.norm.weight": torch.randn(12, generator=generator),
        "backbone.stem.norm.bias": torch.randn(12, generator=generator),
        "backbone.stem.proj.weight": torch.randn(16, 12, generator=generator),
        "backbone.stem.proj.bias": torch.randn(16, generator=generator)}}, root / "stem.pth")
    found = {}
    for name, (strategy, nproc) in LAYOUTS.items():
        config = root / f"{name}.py"
        config.write_text(CONFIG + strategy)
        launch = ["--nproc-per-node", str(nproc)] if nproc > 1 else []
        done = flexgraph_run(str(config), "--work-dir", name, *launch, cwd=root)
        assert done.returncode == 0, f"{name}: {done.stderr[-4000:]}"
        found[name] = {
            "weights": json.loads((root / name / "weights.json").read_text()),
            "rng": [json.loads((root / name / f"rng-rank{r}.json").read_text())
                    for r in range(nproc)]}
    found["plain"] = _plain_pytorch(root)
    return found


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_layout_holds_the_one_device_weights_and_random_state(runs, layout):
    weights, state = runs["plain"]
    found = runs[layout]
    assert sorted(found["weights"]) == sorted(weights)
    differing = [name for name in weights if found["weights"][name] != weights[name]]
    assert not differing, f"{layout}: {differing}"
    assert found["rng"] == [state] * len(found["rng"]), layout


def test_the_model_has_what_the_invariant_is_about(runs):
    weights, _ = runs["plain"]
    assert "scale.scale" in weights and "torch.float32 () " in weights["scale.scale"]
    assert {"stem.proj.weight", "gru.weight_hh_l0", "conv.conv.weight", "mix.weight",
            "embed.weight", "conv.bn.running_mean", "lookup.fc.weight"} <= set(weights)
