"""FSDP's setup on 4 processes (gloo): the weights are a one-device run's, bit for bit.

A small MMEngine ``BaseModel`` whose weights come from its ``init_cfg``
(``TruncNormal`` on every ``Linear``, ``Constant`` on every ``LayerNorm``),
with dropout and a BatchNorm (a buffer), blocks as FSDP units, and
parameters whose rows do not split evenly over 4 ranks (the head's 3 rows
leave rank 3 an empty shard). Each run's ``Snapshot`` hook writes the whole
weights as they are when training starts, every rank's random-number states
and its first loss.

* Random init: rank 0 alone builds and initialises; the weights equal the
  one-device run's, every rank continues from the one-device run's random
  states, and the first losses (with dropout) equal DDP's on every rank.
* ``load_from`` a file holding every weight: the run prunes ``init_weights``
  and says why (its log, and ``plan --estimate``); no rank builds the model;
  the weights equal the file's.
* ``load_from`` a file without the head: ``init_weights`` stays, the log names
  the two entries the file leaves to it, and the weights still equal the
  one-device run's.
* ``Pretrained`` on the backbone (with a ``prefix``) and ``load_from`` the head:
  together they cover the model, so ``init_weights`` is pruned and the
  ``Pretrained`` file loads in ``load_checkpoint``, into the shards.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.cli.cli_helpers import ROOT, flexgraph_run

pytestmark = pytest.mark.slow  # every test here starts processes

PARTS = textwrap.dedent(
    '''
    """Test-only model, data and hook for the sharded-setup tests."""
    import hashlib
    import json
    import os
    import pickle
    import random

    import numpy as np
    import torch
    import torch.nn.functional as F
    from mmengine.hooks import Hook
    from mmengine.model import BaseModel, BaseModule
    from mmengine.registry import DATASETS, HOOKS, MODELS

    INIT_CFG = [dict(type="TruncNormal", layer="Linear", std=0.02, bias=0.0),
                dict(type="Constant", layer="LayerNorm", val=1.0, bias=0.0)]


    class Block(BaseModule):
        def __init__(self, width, drop):
            super().__init__()
            self.norm = torch.nn.LayerNorm(width)
            self.up = torch.nn.Linear(width, 2 * width)
            self.down = torch.nn.Linear(2 * width, width)
            self.drop = torch.nn.Dropout(drop)

        def forward(self, x):
            return x + self.drop(self.down(F.gelu(self.up(self.norm(x)))))


    class Backbone(BaseModule):
        def __init__(self, width, drop, init_cfg=None):
            super().__init__(init_cfg)
            self.stem = torch.nn.Linear(8, width)
            self.blocks = torch.nn.ModuleList(Block(width, drop) for _ in range(3))
            self.bn = torch.nn.BatchNorm1d(width)

        def forward(self, x):
            x = self.stem(x)
            for block in self.blocks:
                x = block(x)
            return self.bn(x)


    @MODELS.register_module(force=True)
    class ShardNet(BaseModel):
        def __init__(self, width=30, drop=0.1, backbone_init=None, data_preprocessor=None):
            super().__init__(data_preprocessor=data_preprocessor, init_cfg=INIT_CFG)
            self.backbone = Backbone(width, drop, backbone_init)
            self.head = torch.nn.Linear(width, 3)

        def forward(self, inputs, labels=None, mode="tensor"):
            logits = self.head(self.backbone(torch.stack(list(inputs))))
            if mode == "loss":
                return {"loss": F.cross_entropy(logits, torch.stack(list(labels)))}
            return logits


    @DATASETS.register_module(force=True)
    class ShardRows(torch.utils.data.Dataset):
        def __init__(self, n=64):
            g = torch.Generator().manual_seed(1)
            self.x, self.y = torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g)
            self.metainfo = {}

        def __len__(self):
            return len(self.y)

        def __getitem__(self, i):
            return {"inputs": self.x[i], "labels": self.y[i]}


    def _digest(value):
        return hashlib.sha256(pickle.dumps(value)).hexdigest()[:16]


    @HOOKS.register_module(force=True)
    class Snapshot(Hook):
        """Whole weights when training starts (rank 0), every rank's RNG states, first loss."""

        def before_train(self, runner):
            import torch.distributed as dist
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions, get_model_state_dict)

            model = runner.model
            if dist.is_initialized():
                options = StateDictOptions(full_state_dict=True, cpu_offload=True)
                weights = get_model_state_dict(model, options=options)
            else:
                weights = model.state_dict()
            if runner.rank == 0:
                torch.save(dict(weights), os.path.join(runner.work_dir, "start.pth"))
            self.rng = {"torch": _digest(torch.get_rng_state().tolist()),
                        "numpy": _digest(np.random.get_state()[1].tolist()),
                        "python": _digest(random.getstate())}

        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            path = os.path.join(runner.work_dir, f"snapshot-rank{runner.rank}.json")
            if not os.path.exists(path):
                with open(path, "w") as f:
                    json.dump({"rng": self.rng, "loss": float(outputs["loss"])}, f)
    '''
)

CONFIG = textwrap.dedent(
    """
    custom_imports = dict(imports=['shard_parts'], allow_failed_imports=False)
    model = dict(type='ShardNet')
    train_dataloader = dict(batch_size=4, num_workers=0, dataset=dict(type='ShardRows'),
                            sampler=dict(type='DefaultSampler', shuffle=True))
    optim_wrapper = dict(optimizer=dict(type='AdamW', lr=1e-3))
    train_cfg = dict(by_epoch=False, max_iters=1)
    default_hooks = dict(checkpoint=None, logger=dict(type='LoggerHook', interval=1))
    custom_hooks = [dict(type='Snapshot')]
    randomness = dict(seed=7)
    """
)
FSDP = ("strategy = dict(type='FSDPStrategy', model_wrapper=dict(auto_wrap_policy=dict("
        "type='torch.distributed.fsdp.wrap.transformer_auto_wrap_policy', "
        "transformer_layer_cls=['Block'])))\n")
WORLD = 4


def _run(root: Path, work: str, *flags: str, strategy: str = FSDP, nproc: int = WORLD,
         extra: str = "") -> subprocess.CompletedProcess:
    config = root / f"{work}.py"
    config.write_text(CONFIG + strategy + extra)
    launch = ["--nproc-per-node", str(nproc)] if nproc > 1 else []
    done = flexgraph_run(str(config), "--work-dir", work, *launch, *flags, cwd=root)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def _log(root: Path, work: str) -> str:
    return "\n".join(p.read_text() for p in (root / work).glob("*/*.log"))


def _snapshots(root: Path, work: str, ranks: int = WORLD) -> list[dict]:
    return [json.loads((root / work / f"snapshot-rank{r}.json").read_text())
            for r in range(ranks)]


def _weights(root: Path, work: str) -> dict[str, torch.Tensor]:
    return torch.load(root / work / "start.pth", weights_only=True)


def _assert_same(first: dict, second: dict) -> None:
    assert sorted(first) == sorted(second)
    for key in first:
        assert torch.equal(first[key], second[key]), key


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("sharded")
    (root / "shard_parts.py").write_text(PARTS)
    (root / "shard_parts.py").chmod(0o644)
    out = {"root": root}
    out["single"] = _run(root, "single", strategy="", nproc=1)
    whole = _weights(root, "single")
    torch.save({"state_dict": whole}, root / "whole.pth")
    torch.save({"state_dict": {k: v for k, v in whole.items() if not k.startswith("head.")}},
               root / "no_head.pth")
    torch.save({k: v for k, v in whole.items() if k.startswith("head.")}, root / "head.pth")
    out["ddp"] = _run(root, "ddp", strategy="strategy = dict(type='DDPStrategy')\n")
    out["fsdp"] = _run(root, "fsdp")
    out["loaded"] = _run(root, "loaded", "--load-from", str(root / "whole.pth"))
    out["partial"] = _run(root, "partial", "--load-from", str(root / "no_head.pth"))
    backbone = dict(type="Pretrained", checkpoint=str(root / "whole.pth"), prefix="backbone")
    out["pretrained"] = _run(root, "pretrained", "--load-from", str(root / "head.pth"),
                             extra=f"model = dict(type='ShardNet', backbone_init={backbone!r})\n")
    return out


def test_random_init_on_rank0_gives_every_rank_the_one_device_weights_and_rng(runs):
    root = runs["root"]
    _assert_same(_weights(root, "single"), _weights(root, "fsdp"))
    single = _snapshots(root, "single", ranks=1)[0]
    for snapshot in _snapshots(root, "fsdp"):
        assert snapshot["rng"] == single["rng"], "every rank goes on as one device would"
    # dropout (0.1) draws the same masks as under DDP, where every rank built the model
    ddp, fsdp = _snapshots(root, "ddp"), _snapshots(root, "fsdp")
    assert [s["loss"] for s in fsdp] == [s["loss"] for s in ddp]
    assert "init_weights" in runs["fsdp"].stdout and "pruned" not in runs["fsdp"].stdout


def test_a_covering_load_from_prunes_init_weights_and_says_why(runs):
    root = runs["root"]
    line = (f"pruned: init_weights (every state_dict entry comes from load_from "
            f"'{root / 'whole.pth'}')")
    assert line in runs["loaded"].stdout and line in _log(root, "loaded")
    summary = next(x for x in runs["loaded"].stdout.splitlines() if x.startswith("flexgraph:"))
    assert "build_model -> fully_shard -> materialize" in summary
    assert "init_weights" not in summary
    plan = json.loads(next((root / "loaded").glob("*/plan.json")).read_text())
    assert plan["rewrites"][0]["strategy"] == "derived"
    assert plan["rewrites"][0]["kind"] == "prune"
    _assert_same(_weights(root, "single"), _weights(root, "loaded"))


def test_plan_estimate_shows_the_pruned_init_weights(runs):
    root = runs["root"]
    done = subprocess.run(
        [sys.executable, "-m", "flexgraph", "plan", str(root / "loaded.py"), "--estimate",
         "--world-size", str(WORLD), "--cfg-options", f"load_from={root / 'whole.pth'}"],
        cwd=root, capture_output=True, text=True, timeout=300,
        env={"PYTHONPATH": f"{root}:{ROOT / 'examples'}", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    said = " ".join(done.stdout.split())  # the report wraps at its width, the path may too
    assert (f"pruned: init_weights (every state_dict entry comes from load_from "
            f"'{root / 'whole.pth'}')") in said


def test_a_file_without_the_head_keeps_init_weights_and_names_what_it_leaves(runs):
    root = runs["root"]
    note = (f"init_weights: kept: load_from '{root / 'no_head.pth'}' leaves 2 of 27 "
            f"state_dict entries to init_weights: head.weight, head.bias")
    assert note in runs["partial"].stdout and note in _log(root, "partial")
    _assert_same(_weights(root, "single"), _weights(root, "partial"))


def test_pretrained_with_a_prefix_and_load_from_together_prune_init_weights(runs):
    root = runs["root"]
    assert (f"pruned: init_weights (every state_dict entry comes from init_cfg Pretrained "
            f"'{root / 'whole.pth'}' of backbone (prefix 'backbone') and load_from "
            f"'{root / 'head.pth'}')") in runs["pretrained"].stdout
    _assert_same(_weights(root, "single"), _weights(root, "pretrained"))


def test_plain_plan_says_init_weights_is_pruned_at_run_time_without_importing_torch(tmp_path):
    """Whether the file covers the model needs the model's names: only a run (or
    ``--estimate``) can tell; ``flexgraph plan`` says so, and imports no torch."""
    config = tmp_path / "cfg.py"
    config.write_text("model = dict(type='AnyModel', backbone=dict(init_cfg=dict("
                      "type='Pretrained', checkpoint='b.pth')))\nload_from = 'w.pth'\n")
    check = (
        "import sys\n"
        "from flexgraph.cli.main import main\n"
        f"main(['plan', {str(config)!r}, '--strategy', 'fsdp', '--format', 'json'])\n"
        "loaded = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "assert not loaded, loaded\n")
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    notes = json.loads(done.stdout)["notes"]
    assert notes["init_weights"] == (
        "pruned at run time when load_from 'w.pth' and the init_cfg Pretrained files cover "
        "every state_dict entry (flexgraph plan --estimate says whether)")
    ddp = subprocess.run([sys.executable, "-m", "flexgraph", "plan", str(config), "--strategy",
                          "ddp", "--format", "json"], capture_output=True, text=True,
                         timeout=120)
    assert "init_weights" not in json.loads(ddp.stdout).get("notes", {}), \
        "DDP keeps init_weights: nothing to say"
