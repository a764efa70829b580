"""Shared pieces of the portable-checkpoint resume tests: configs, runs, comparisons.

Every run trains the quickstart MLP (no dropout, so no random draw in training)
from one fixed initial state, with a learning-rate schedule fixed in
iterations, so that runs of any length follow the same schedule and a chain
of resumes can be compared with one uninterrupted run.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import torch

from flexgraph.training.checkpoint import portable_tensors, read_manifest, read_portable_tensor
from tests.cli.cli_helpers import QUICKSTART, flexgraph_run, write_config

STRATEGIES = {
    "single": "",
    "ddp": "strategy = dict(type='DDPStrategy')\n",
    "fsdp": "strategy = dict(type='FSDPStrategy')\n",
    **{f"zero{stage}": f"strategy = dict(type='DeepSpeedStrategy', "
                       f"zero_optimization=dict(stage={stage}))\n" for stage in range(4)},
}
"""Config lines of every strategy; each writes its default checkpoint format."""

PORTABLE = {
    "single": "strategy = dict(type='SingleDeviceStrategy', checkpoint_format='portable')\n",
    "ddp": "strategy = dict(type='DDPStrategy', checkpoint_format='portable')\n",
}
"""Single device and DDP writing the portable format instead of their ``.pth``."""

PROCESSES = {"single": 1}
"""Processes per strategy (2 unless named here)."""

BY_EPOCH = """
model = dict(dropout=0.0)
param_scheduler = [dict(type='LinearLR', start_factor=0.5, by_epoch=False, begin=0, end=200)]
train_cfg = dict(by_epoch=True, max_epochs={epochs}, val_interval=1000)
default_hooks = dict(checkpoint=dict(type='CheckpointHook', interval={interval},
                                     by_epoch={by_epoch}, max_keep_ckpts=-1,
                                     async_save={async_save}),
                     logger=dict(type='LoggerHook', interval=5))
"""

SAMPLE_IDS = textwrap.dedent(
    '''
    """Test-only: a digits dataset whose samples say their index, and a hook recording them."""
    import json
    import os

    import torch
    from digits import DigitsDataset
    from mmengine.hooks import Hook
    from mmengine.registry import DATASETS, HOOKS


    @DATASETS.register_module(force=True)
    class IndexedDigits(DigitsDataset):
        def __getitem__(self, index):
            return {**super().__getitem__(index), "index": index}


    @HOOKS.register_module(force=True)
    class RecordIds(Hook):
        """Takes the indices out of each batch (the model never sees them) and logs them."""

        def before_train_iter(self, runner, batch_idx, data_batch=None):
            ids = torch.as_tensor(data_batch.pop("index")).tolist()
            path = os.path.join(runner.work_dir, f"ids-rank{runner.rank}.jsonl")
            with open(path, "a") as f:
                f.write(json.dumps({"iter": runner.iter, "world": runner.world_size,
                                    "ids": ids}) + "\\n")
    '''
)


def config(folder: Path, strategy: str, start: str, *, epochs: int, interval: int = 1,
           by_epoch: bool = True, record_ids: bool = False, batch: int | None = None,
           portable: bool = False, async_save: bool = False, **killer) -> Path:
    """A quickstart config for ``strategy``: ``epochs`` epochs, a checkpoint every
    ``interval`` epochs (or iterations), ``batch`` samples per process (default: the
    quickstart's 32), ``killer`` options as for :func:`write_config`."""
    extra = BY_EPOCH.format(epochs=epochs, interval=interval, by_epoch=by_epoch,
                            async_save=async_save)
    extra += (PORTABLE[strategy] if portable else STRATEGIES[strategy]) + start
    if batch is not None:
        extra += f"train_dataloader = dict(batch_size={batch})\n"
    if record_ids:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "sample_ids.py").write_text(SAMPLE_IDS)
        extra += ("custom_imports = dict(imports=['digits', 'killer', 'sample_ids'], "
                  "allow_failed_imports=False)\n"
                  "train_dataloader = dict(dataset=dict(type='IndexedDigits'))\n"
                  "custom_hooks = [" + (f"dict(type='KillAt', **{killer!r}), " if killer else "")
                  + "dict(type='RecordIds')]\n")
        return write_config(folder, extra=extra)
    return write_config(folder, extra=extra, **killer)


def run(config_path: Path, strategy: str, work: str, cwd: Path, *extra: str, ok: bool = True
        ) -> str:
    """``flexgraph run`` with the strategy's process count; its output (stdout + stderr)."""
    procs = PROCESSES.get(strategy, 2)
    launch = ("--nproc-per-node", "2") if procs == 2 else ()
    done = flexgraph_run(str(config_path), "--work-dir", work, *launch, *extra, cwd=cwd)
    out = done.stdout + done.stderr
    assert (done.returncode == 0) == ok, out[-4000:]
    return out


def last_checkpoint(work_dir: Path) -> Path:
    return Path((work_dir / "last_checkpoint").read_text().strip())


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """``|a - b| / |b|`` over the whole tensor (Frobenius norms)."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def assert_same_weights(resumed: dict, reference: dict, *, rel: float = 1e-5) -> None:
    """Weights and Adam moments of two one-file checkpoints agree to ``rel``."""
    assert resumed["meta"]["iter"] == reference["meta"]["iter"]
    assert set(resumed["state_dict"]) == set(reference["state_dict"])
    for key, value in reference["state_dict"].items():
        assert relative_error(resumed["state_dict"][key], value) <= rel, key
    ref_state, state = reference["optimizer"]["state"], resumed["optimizer"]["state"]
    assert set(state) == set(ref_state)
    for pid, moments in ref_state.items():
        for key, value in moments.items():
            assert relative_error(torch.as_tensor(state[pid][key]),
                                  torch.as_tensor(value)) <= rel, (pid, key)


def as_one_file(path: Path) -> dict:
    """A checkpoint's weights and Adam state, laid out as DDP's ``.pth`` holds them.

    A ``.pth`` is read as it is; a portable checkpoint tensor by tensor, its
    parameters numbered in the model's order (as DDP's optimizer numbers them).
    """
    if path.is_file():
        return torch.load(path, weights_only=True)
    held = portable_tensors(path)
    names = [k.removeprefix("model.") for k in held if k.startswith("model.")]
    weights = {n: read_portable_tensor(path, f"model.{n}") for n in names}
    state = {position: {key: read_portable_tensor(path, f"optimizer.{n}.{key}")
                        for key in ("exp_avg", "exp_avg_sq", "step")}
             for position, n in enumerate(names)}
    return {"meta": {"iter": read_manifest(path)["iter"]}, "state_dict": weights,
            "optimizer": {"state": state}}


def recorded_ids(work_dir: Path, world: int, below_iter: int | None = None,
                 from_iter: int = 0) -> list[tuple[int, list[int]]]:
    """``(iter, ids)`` of the batches every rank of a run on ``world`` processes trained on,
    with ``from_iter <= iter < below_iter``."""
    rows = []
    for file in sorted(work_dir.glob("ids-rank*.jsonl")):
        for line in file.read_text().splitlines():
            row = json.loads(line)
            if row["world"] == world and row["iter"] >= from_iter and (
                    below_iter is None or row["iter"] < below_iter):
                rows.append((row["iter"], row["ids"]))
    return rows


__all__ = ["PROCESSES", "QUICKSTART", "STRATEGIES", "as_one_file", "assert_same_weights",
           "config",
           "last_checkpoint", "recorded_ids", "relative_error", "run"]
