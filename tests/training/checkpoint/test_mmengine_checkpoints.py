"""Checkpoints written by MMEngine's own Runner: loaded safely, resumed, continued.

The MMEngine checkpoints here are real: MMEngine's ``Runner`` (on CPU, gloo,
``launcher='none'``) trains a config for 2 of its 5 epochs and stops, as an
interrupted run would; then, as the reference, MMEngine itself resumes that
checkpoint and finishes. Both run once per module in child processes (MMEngine
needs ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` to read its own checkpoints; that
setting must never reach flexgraph's loads).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest
import torch
from mmengine.config import Config
from mmengine.logging import HistoryBuffer

from flexgraph.training.checkpoint import from_mmengine
from flexgraph.training.checkpoint_tools import describe_checkpoint
from flexgraph.training.errors import CheckpointError, UnsafeCheckpointError
from flexgraph.training.formats import read_checkpoint_file
from flexgraph.training.formats._mmengine_types import mmengine_globals
from tests.training.training_helpers import REPO, run_steps

HERE = Path(__file__).resolve().parents[1]  # tests/training: mmengine_parts.py
EPOCHS, STOP_AFTER, EPOCH_LENGTH = 5, 2, 6  # 24 samples, batch 4

CONFIG = textwrap.dedent(f"""
    custom_imports = dict(imports=['tests.training.mmengine_parts'], allow_failed_imports=False)
    model = dict(type='MigrationNet')
    train_dataloader = dict(batch_size=4, num_workers=0, dataset=dict(type='PairsDataset'),
                            sampler=dict(type='DefaultSampler', shuffle=True))
    optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.1, momentum=0.9, weight_decay=1e-4))
    # The warm-up runs past the interruption (iteration 12), the steps come after it.
    param_scheduler = [
        dict(type='LinearLR', start_factor=0.25, by_epoch=False, begin=0, end=15),
        dict(type='MultiStepLR', milestones=[3, 4], gamma=0.5, by_epoch=True),
    ]
    train_cfg = dict(by_epoch=True, max_epochs={EPOCHS})
    default_hooks = dict(checkpoint=dict(type='CheckpointHook', interval=1),
                         logger=dict(type='LoggerHook', interval=3))
    custom_hooks = [dict(type='LrRecorder')]
    randomness = dict(seed=2024)
    env_cfg = dict(dist_cfg=dict(backend='gloo'))
""")


def _env(**extra: str) -> dict[str, str]:
    # One thread everywhere: the same kernels in every process, so equal inputs
    # give bit-equal outputs.
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **extra}


def _run(argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, cwd=cwd, env=_env(**env), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return done


@pytest.fixture(scope="module")
def mmengine_run(tmp_path_factory) -> dict[str, Path]:
    """MMEngine trains 2 of 5 epochs (``half``), then resumes that and finishes (``mm``)."""
    root = tmp_path_factory.mktemp("mmengine")
    config = root / "cfg.py"
    config.write_text(CONFIG)
    _run([sys.executable, str(HERE / "mmengine_parts.py"), str(config), str(root),
          "--stop-after", str(STOP_AFTER)], cwd=root, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1")
    checkpoint = root / "half" / f"epoch_{STOP_AFTER}.pth"
    return {"root": root, "config": config, "checkpoint": checkpoint, "mm": root / "mm"}


def _lrs(work_dir: Path) -> list[tuple[int, int, float]]:
    records = [json.loads(line) for line in (work_dir / "lrs.jsonl").read_text().splitlines()]
    return [(r["iter"], r["epoch"], r["lr"]) for r in records]


@pytest.mark.slow
def test_migration_flexgraph_continues_an_mmengine_run_as_mmengine_does(mmengine_run):
    """MMEngine stopped after epoch 2 of 5; flexgraph and MMEngine each finish it.

    Compared: the iterations trained after the checkpoint and the epoch of each
    (recorded by the same hook in both), the learning rate of every one of them
    (warm-up running across the resume point, then epoch steps), and the final
    weights and optimizer state, bit for bit. Bit equality is expected: the model
    has no dropout and the data order comes from the sampler's seed, so no
    random draw differs even though MMEngine's checkpoint has no RNG state for
    flexgraph to restore; both run the model's own ``train_step`` through the
    same ``OptimWrapper``, on one thread.
    """
    root = mmengine_run["root"]
    done = _run([sys.executable, "-m", "flexgraph", "run", str(mmengine_run["config"]),
                 "--resume", str(mmengine_run["checkpoint"]), "--work-dir", "fg"], cwd=root)
    assert "no RNG state" in done.stdout + done.stderr  # the reseeding is said, not silent

    ours, theirs = _lrs(root / "fg"), _lrs(mmengine_run["mm"])
    assert [i for i, _, _ in theirs] == list(range(STOP_AFTER * EPOCH_LENGTH,
                                                   EPOCHS * EPOCH_LENGTH))
    assert ours == theirs
    final = f"epoch_{EPOCHS}.pth"
    mine = read_checkpoint_file(root / "fg" / final)
    reference = read_checkpoint_file(mmengine_run["mm"] / final)  # MMEngine's, loaded safely
    assert mine["meta"]["iter"] == reference["meta"]["iter"] == EPOCHS * EPOCH_LENGTH
    assert mine["state_dict"].keys() == reference["state_dict"].keys()
    for key, value in reference["state_dict"].items():
        assert torch.equal(mine["state_dict"][key], value), key
    for index, state in reference["optimizer"]["state"].items():
        for key, value in state.items():
            assert torch.equal(mine["optimizer"]["state"][index][key], value), (index, key)


@pytest.mark.slow
def test_an_mmengine_checkpoint_needs_exactly_the_allowed_globals(mmengine_run):
    path = mmengine_run["checkpoint"]
    needed = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    allowed = {entry[1] if isinstance(entry, tuple) else f"{entry.__module__}.{entry.__qualname__}"
               for entry in mmengine_globals()}
    assert "mmengine.logging.history_buffer.HistoryBuffer" in needed
    assert set(needed) <= allowed, set(needed) - allowed
    before = set(torch.serialization.get_safe_globals())  # torch keeps them in a set

    safe = read_checkpoint_file(path)
    after = set(torch.serialization.get_safe_globals())
    assert after == before, "the allow-list is scoped to a load"
    trusted = torch.load(path, weights_only=False)  # our own file: the ground truth
    for key, buffer in trusted["message_hub"]["log_scalars"].items():
        loaded = safe["message_hub"]["log_scalars"][key]
        assert isinstance(loaded, HistoryBuffer)
        assert loaded.mean() == buffer.mean() and loaded.current() == buffer.current(), key
    assert safe["message_hub"]["runtime_info"] == trusted["message_hub"]["runtime_info"]


class _Payload:
    """Unpickling this runs ``os.mkdir(marker)``: proof that code executed."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


class _BufferMethod:
    """Pickles as ``getattr(HistoryBuffer, name)``: the getattr MMEngine's files use."""

    def __init__(self, name):
        self.name = name

    def __reduce__(self):
        return (getattr, (HistoryBuffer, self.name))


@pytest.mark.slow
def test_inspect_describes_an_mmengine_checkpoint(mmengine_run):
    path = mmengine_run["checkpoint"]
    summary = describe_checkpoint(path)
    weights = read_checkpoint_file(path)["state_dict"]
    assert summary.writer == "MMEngine" and summary.complete
    assert (summary.epoch, summary.iteration) == (STOP_AFTER, STOP_AFTER * EPOCH_LENGTH)
    assert summary.parameters == sum(t.numel() for t in weights.values())
    assert summary.contents == ("model", "optimizer", "param_schedulers", "loop state",
                                "message hub (MMEngine)")
    assert "mmengine_version" in summary.versions


@pytest.mark.slow
@pytest.mark.parametrize("intruder", ["payload", "getattr"])
def test_a_file_mixing_mmengine_types_with_a_forbidden_one_is_refused(mmengine_run, tmp_path,
                                                                      intruder):
    marker = tmp_path / "pwned"
    checkpoint = torch.load(mmengine_run["checkpoint"], weights_only=False)
    # Beside real HistoryBuffers and numpy values: a payload, or a getattr that
    # reaches past HistoryBuffer's statistics methods.
    extra = _Payload(marker) if intruder == "payload" else _BufferMethod("__init__")
    checkpoint["message_hub"]["runtime_info"]["extra"] = extra
    mixed = tmp_path / "mixed.pth"
    torch.save(checkpoint, mixed)

    with pytest.raises(UnsafeCheckpointError, match="refused"):
        read_checkpoint_file(mixed)
    assert not marker.exists()
    assert set(HistoryBuffer._statistics_methods) == {"mean", "min", "max", "current"}
    with pytest.raises(UnsafeCheckpointError):
        run_steps(_cfg(mmengine_run, tmp_path, resume=str(mixed)), last="resume")
    assert not marker.exists()


def _cfg(mmengine_run, tmp_path, **overrides) -> Config:
    cfg = Config.fromfile(str(mmengine_run["config"]))
    cfg.merge_from_dict({"work_dir": str(tmp_path / "work"), **overrides})
    return cfg


@pytest.mark.slow
def test_load_from_an_mmengine_checkpoint(mmengine_run, tmp_path):
    path = mmengine_run["checkpoint"]
    model = run_steps(_cfg(mmengine_run, tmp_path, load_from=str(path)),
                      last="load_checkpoint")["model"]
    weights = read_checkpoint_file(path)["state_dict"]
    for key, value in weights.items():
        assert torch.equal(model.state_dict()[key], value), key


@pytest.mark.slow
def test_resume_maps_mmengine_meta_schedulers_and_message_hub(mmengine_run, tmp_path):
    path = mmengine_run["checkpoint"]
    ctx = run_steps(_cfg(mmengine_run, tmp_path, resume=str(path)), last="resume")
    state = ctx["loop_state"]
    assert (state.epoch, state.iter, state.batch_idx) == (STOP_AFTER, 12, 0)
    assert state.rng_state is not None  # reseeded: MMEngine saved no RNG state
    saved = read_checkpoint_file(path)["param_schedulers"]
    for scheduler, expected in zip(ctx["param_schedulers"], saved, strict=True):
        assert scheduler.state_dict() == expected
    milestones = ctx["param_schedulers"][1].state_dict()["milestones"]
    assert type(milestones) is Counter  # MultiStepLR needs a Counter, not a plain dict
    hub = ctx["hooks"].runner.message_hub
    assert hub.get_info("iter") == 11  # MMEngine's runtime info, as its resume leaves it
    assert len(hub.get_scalar("train/loss").data[0]) == 12


@pytest.mark.parametrize(("by_epoch", "epoch", "iteration", "expected"), [
    (True, 1, 9, (1, 9, 3)),     # saved by an iteration interval, mid-epoch 2
    (True, 2, 12, (2, 12, 0)),   # saved when epoch 2 ended
    (False, 0, 14, (2, 14, 2)),  # an iteration loop: MMEngine keeps epoch at 0
])
def test_mmengine_meta_becomes_a_loop_position(by_epoch, epoch, iteration, expected):
    loader = torch.utils.data.DataLoader(list(range(24)), batch_size=4)
    checkpoint = {"meta": {"epoch": epoch, "iter": iteration, "mmengine_version": "0.10.7"},
                  "state_dict": {}, "param_schedulers": []}
    meta = from_mmengine(checkpoint, by_epoch=by_epoch, train_dataloader=loader)["meta"]
    assert (meta["epoch"], meta["iter"], meta["batch_idx"]) == expected


def test_mmengine_meta_that_does_not_fit_the_dataloader_is_refused():
    loader = torch.utils.data.DataLoader(list(range(24)), batch_size=4)
    checkpoint = {"meta": {"epoch": 1, "iter": 40, "mmengine_version": "0.10.7"}}
    with pytest.raises(CheckpointError, match="does not fit 6 batches per epoch"):
        from_mmengine(checkpoint, by_epoch=True, train_dataloader=loader)
