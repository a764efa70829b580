"""The MMEngine mechanisms real OpenMMLab code relies on, under every strategy.

Our own example models never used them, so they passed where MMPreTrain's
configs failed. ``standins/minipre`` reproduces each one in miniature (see its
README): names resolved in ``default_scope``'s registries, which import their
modules on first use; ``init_cfg`` with ``Pretrained`` (prefix ``backbone.``)
and ``TruncNormal``; a parameter only ``init_weights`` sets; one param group per
parameter (layer-wise LR decay); a module that refuses to be imported under
``deepspeed.zero.Init``; the ``importlib_metadata`` backport imported.

One config, six runs through ``flexgraph run`` (one process, then two over
gloo): single device, DDP, FSDP, DeepSpeed ZeRO-1, 2 and 3, fp32, one epoch.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.cli.cli_helpers import flexgraph_run

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
STANDINS = HERE / "standins"
STRATEGIES = {
    "single": [],
    "ddp": ["strategy.type=DDPStrategy"],
    "fsdp": ["strategy.type=FSDPStrategy"],
    **{f"zero{stage}": ["strategy.type=DeepSpeedStrategy",
                        f"strategy.zero_optimization.stage={stage}",
                        "optim_wrapper.type=DeepSpeedOptimWrapper"] for stage in (1, 2, 3)},
}

pytest.importorskip("deepspeed")
pytest.importorskip("importlib_metadata")


def _write_pretrained(root: Path) -> Path:
    """A backbone checkpoint, keys prefixed ``backbone.`` as MAE's are, from seed 123."""
    path = root / "pretrained.pth"
    script = textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {str(root)!r})
        from minipre.models import TinyBackbone
        torch.manual_seed(123)
        weights = {{"backbone." + k: v for k, v in TinyBackbone().state_dict().items()}}
        torch.save({{"state_dict": weights, "meta": {{}}}}, {str(path)!r})
    """)
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True)
    return path


def _run(root: Path, name: str, *options: str) -> subprocess.CompletedProcess:
    launch = [] if name == "single" else ["--nproc-per-node", "2"]
    return flexgraph_run(
        str(root / "minipre_cfg.py"), "--work-dir", name, *launch, "--cfg-options",
        f"model.backbone.init_cfg.checkpoint={root / 'pretrained.pth'}",
        "train_cfg.max_epochs=1", *STRATEGIES[name], *options, cwd=root)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("mechanisms")
    shutil.copytree(STANDINS / "minipre", root / "minipre")
    shutil.copy(STANDINS / "minipre_cfg.py", root / "minipre_cfg.py")
    _write_pretrained(root)
    for name in STRATEGIES:
        done = _run(root, name)
        assert done.returncode == 0, f"{name}:\n{done.stderr[-3000:]}"
    return root


def _load(root: Path, name: str, what: str):
    return torch.load(root / name / what, weights_only=True)


def test_components_resolve_in_the_default_scope_and_import_on_first_use(runs):
    # Every type= of the config is minipre's, and the config imports nothing itself.
    text = (runs / "minipre_cfg.py").read_text()
    assert "custom_imports" not in text
    assert (runs / "single" / "initial.pt").is_file(), "the scope's Snapshot hook ran"


def test_an_unknown_name_in_the_scope_suggests_the_scopes_names(runs):
    done = _run(runs, "single", "model.type=TinyClasifier")
    assert done.returncode == 2, done.stderr
    assert "'minipre' scope's 'model' registry" in done.stderr
    assert "did you mean 'TinyClassifier'" in done.stderr


@pytest.mark.parametrize("name", [n for n in STRATEGIES if n != "single"])
def test_initial_weights_are_bit_identical_to_single_device(runs, name):
    single, other = _load(runs, "single", "initial.pt"), _load(runs, name, "initial.pt")
    assert sorted(other) == sorted(single)
    for key, value in single.items():
        assert torch.equal(other[key], value), f"{name}: {key}"


def test_the_backbone_starts_from_the_pretrained_checkpoint(runs):
    pretrained = torch.load(runs / "pretrained.pth", weights_only=True)["state_dict"]
    initial = _load(runs, "single", "initial.pt")
    for key, value in pretrained.items():
        assert torch.equal(initial[key], value), key
    head = initial["head.fc.weight"]
    assert 0 < head.std() < 0.03, "TruncNormal(std=0.02) initialised the head"


def test_layer_decay_param_groups_are_the_same_under_every_strategy(runs):
    """Learning rate and weight decay per parameter; ZeRO-3's placeholders are 1-D."""
    ddp = _load(runs, "ddp", "lrs.pt")
    assert len(ddp) == 4 and len({lr for lr, _ in ddp[0].values()}) == 5, "one lr per depth"
    assert ddp[0]["backbone.layers.0.1.weight"][1] == 0.05, "matrices decay"
    assert ddp[0]["backbone.layers.0.1.bias"][1] == 0.0, "1-D parameters do not"
    for name in ("fsdp", "zero1", "zero2", "zero3"):
        assert _load(runs, name, "lrs.pt") == ddp, name


@pytest.mark.parametrize("name", ["fsdp", "zero1", "zero2", "zero3"])
def test_weights_after_an_epoch_agree_with_ddp(runs, name):
    """fp32, same data and random streams: only the reductions' order differs."""
    ddp, other = _load(runs, "ddp", "epoch1.pt"), _load(runs, name, "epoch1.pt")
    initial = _load(runs, "ddp", "initial.pt")
    scale = max(v.abs().max() for v in ddp.values())
    moved = max((ddp[k] - initial[k]).abs().max() for k in ddp)
    assert moved > 100 * 1e-5 * scale, "training moved the weights far beyond the tolerance"
    worst = max((other[k] - ddp[k]).abs().max() for k in ddp)
    assert worst <= 1e-5 * scale, f"{name}: {worst / scale:.2e} relative"


def test_a_failed_initialiser_copy_stops_the_run_naming_the_module(tmp_path):
    """MMEngine only logs a copy that raised; flexgraph stops (a real one-rank DTensor)."""
    shutil.copytree(STANDINS / "minipre", tmp_path / "minipre")
    pretrained = _write_pretrained(tmp_path)
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        import torch
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard
        from mmengine.registry import DefaultScope
        from flexgraph.training.errors import InitWeightsError
        from flexgraph.training.components import initialise
        from minipre.models import TinyBackbone

        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
        DefaultScope.get_instance("test", scope_name="minipre")
        model = TinyBackbone(init_cfg=dict(type="Pretrained", checkpoint={str(pretrained)!r},
                                           prefix="backbone."))
        fully_shard(model)  # every parameter becomes a DTensor: whole-tensor copies fail
        try:
            initialise(model)
        except InitWeightsError as exc:
            print(exc)
        dist.destroy_process_group()
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "init_weights: the init_cfg of 'model' could not set 17 parameters" in done.stdout
    assert "mixed torch.Tensor and DTensor" in done.stdout
