"""Shared pieces for the training-runtime tests: toy components and a step runner.

The tests plan the standard graph (or the part of it up to one step) and run
it with the engine (:func:`run_steps`), so each test exercises the steps the
way ``flexgraph run`` wires them. Toy components are registered in MMEngine's
registries (``force=True``: re-registering on re-import is fine) and are tiny,
so the whole folder runs in well under a minute on two cores.
"""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.registry import DATASETS, HOOKS, MODELS
from torch import nn

from flexgraph import Configure, Executor, StepFailedError, Strategy, get_strategy, make_plan
from flexgraph.training import loop
from flexgraph.training.config import read_settings
from flexgraph.training.graph import ENTRIES, standard_graph, standard_inputs
from flexgraph.training.output import RunContext

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"

# The test machine is small and shared; one intra-op thread avoids OpenMP
# oversubscription, which otherwise makes tiny models 10-50x slower.
torch.set_num_threads(1)


def assert_same(a, b, path="state"):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), path
    elif isinstance(a, dict):
        assert set(a) == set(b), path
        for key in a:
            assert_same(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


def run_steps(cfg: Any, *, last: str | tuple[str, ...] = "train", include: tuple[str, ...] = (),
              env: Any = None, strategy: str | None = None, run_context: Any = None,
              **params: dict[str, Any]) -> dict[str, Any]:
    """Plan the standard graph up to ``last`` (a step, or several) and run it.

    Returns the artifacts.

    ``last='val'`` / ``'test'`` uses that entry point's graph; ``include`` adds
    optional steps (``'compile'``); a given ``env`` stands in for ``setup_env``
    (an input instead of a step); ``strategy`` names one from the registry;
    ``run_context`` is the run's context (default: this process alone);
    ``params`` binds step parameters by step name, e.g.
    ``setup_env={'device': 'cpu'}``. A step's own error is re-raised as is.
    """
    targets = (last,) if isinstance(last, str) else tuple(last)
    entry = next((t for t in targets if t in ENTRIES), "train")
    graph = standard_graph({name: True for name in include}, entry=entry)
    context = standard_inputs(cfg, run_context)
    if env is not None:
        graph = graph.remove("setup_env").with_inputs("env")
        context["env"] = env
    base = get_strategy(strategy) if strategy else Strategy("tests")
    configured = base.then(*(Configure(name, p) for name, p in params.items()))
    try:
        plan = make_plan(graph, configured, targets=targets)
        return Executor().run(plan, context).context
    except StepFailedError as exc:
        raise exc.__cause__ from None



def build_hooks(cfg: Any) -> loop.Hooks:
    """The run's hooks for ``cfg``, its settings read as ``flexgraph run`` reads them, in a
    context of this process alone (no record)."""
    return loop.build_hooks(cfg, read_settings(cfg), RunContext.of_this_process())


# -- toy components ---------------------------------------------------------------


class Payload:
    """Unpickling this runs ``os.mkdir(marker)``: proof that code executed."""

    def __init__(self, marker: Any) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (self.marker,))


@DATASETS.register_module(force=True)
class ToyDataset(torch.utils.data.Dataset):
    """``n`` seeded samples ``(x, y)``: 8 features, 3 classes (a learnable rule)."""

    def __init__(self, n: int = 40, seed: int = 0, as_dict: bool = False) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 8, generator=g)
        self.y = (self.x[:, 0] > 0).long() + (self.x[:, 1] > 0.5).long()
        self.as_dict = as_dict

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> Any:
        if self.as_dict:
            return {"x": self.x[i], "y": self.y[i]}
        return self.x[i], self.y[i]


@DATASETS.register_module(force=True)
class ToyStream(torch.utils.data.IterableDataset):
    """An iterable (length-less) version of :class:`ToyDataset`."""

    def __init__(self, n: int = 40) -> None:
        self.data = ToyDataset(n)

    def __iter__(self):
        return (self.data[i] for i in range(len(self.data)))


@MODELS.register_module(force=True)
class ToyNet(nn.Module):
    """A plain module returning its loss; dropout makes RNG restore matter."""

    def __init__(self, hidden: int = 16, dropout: float = 0.3, dict_loss: bool = False) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Dropout(dropout))
        self.head = nn.Linear(hidden, 3)
        self.dict_loss = dict_loss

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:
        logits = self.head(self.body(x))
        loss = F.cross_entropy(logits, y)
        if self.dict_loss:
            return {"loss_ce": loss, "loss_l2": 1e-3 * logits.pow(2).mean(),
                    "acc": (logits.argmax(1) == y).float().mean()}
        return loss


@MODELS.register_module(force=True)
class NoLossNet(ToyNet):
    """Returns logits only: a model that forgot to compute its loss."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:
        return {"logits": self.head(self.body(x))}


@HOOKS.register_module(force=True)
class CrashHook(Hook):
    """Simulates a crash: raises after iteration index ``at_iter`` finished."""

    def __init__(self, at_iter: int) -> None:
        self.at_iter = at_iter

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        if runner.iter == self.at_iter:
            raise KeyboardInterrupt(f"simulated crash after iteration {runner.iter + 1}")


@HOOKS.register_module(force=True)
class RecordingHook(Hook):
    """Records every hook point it sees, with the runner's counters."""

    calls: list[tuple[Any, ...]] = []

    def __init__(self) -> None:
        self.calls = []
        RecordingHook.calls = self.calls


def _record(point: str):
    def method(self, runner, *args, **kwargs):
        self.calls.append((point, runner.epoch, runner.iter, kwargs.get("batch_idx")))

    method.__name__ = point
    return method


for _point in ("before_run", "after_run", "before_train", "after_train", "before_train_epoch",
               "after_train_epoch", "before_train_iter", "after_train_iter", "before_val",
               "after_val", "before_val_epoch", "after_val_epoch", "before_val_iter",
               "after_val_iter", "before_save_checkpoint", "after_load_checkpoint"):
    setattr(RecordingHook, _point, _record(_point))


def toy_cfg(work_dir: Path, **overrides: Any) -> Config:
    """A small plain-model config: 40 samples, batch 4, 3 epochs (30 iterations)."""
    cfg = dict(
        model=dict(type="ToyNet"),
        train_dataloader=dict(batch_size=4, num_workers=0, dataset=dict(type="ToyDataset"),
                              sampler=dict(type="DefaultSampler", shuffle=True)),
        val_dataloader=dict(batch_size=10, dataset=dict(type="ToyDataset", n=20, seed=1),
                            sampler=dict(type="DefaultSampler", shuffle=False)),
        optim_wrapper=dict(optimizer=dict(type="AdamW", lr=0.01)),
        param_scheduler=[
            dict(type="LinearLR", start_factor=0.5, by_epoch=False, begin=0, end=5),
            dict(type="MultiStepLR", milestones=[1, 2], gamma=0.5, by_epoch=True),
        ],
        train_cfg=dict(by_epoch=True, max_epochs=3, val_interval=1),
        default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=-1),
                           logger=dict(type="LoggerHook", interval=5)),
        randomness=dict(seed=123),
        work_dir=str(work_dir),
    )
    cfg.update(copy.deepcopy(overrides))
    return Config(cfg)




def ddp_worker(rank: int, world_size: int, port: int, work_dir: str, out_dir: str) -> None:
    """One rank of a 2-process gloo run (see test_distributed.py)."""
    import os

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.set_num_threads(1)
    try:
        cfg = toy_cfg(Path(work_dir), randomness=dict(seed=7, diff_rank_seed=True),
                      default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=1)))
        ctx = run_steps(cfg, strategy="ddp", setup_env={"device": "cpu"})
        resumed = run_steps(toy_cfg(Path(work_dir), resume=True), strategy="ddp",
                            last="resume", setup_env={"device": "cpu"})
        torch.save({"model": {k: v.clone() for k, v in ctx["model"].module.state_dict().items()},
                    "wrapped": type(ctx["model"]).__name__,
                    "result": ctx["train_result"],
                    "resumed_rng": resumed["loop_state"].rng_state["torch"]},
                   f"{out_dir}/rank{rank}.pt")
    except BaseException:
        dist.destroy_process_group()
        raise
    # As a launched rank of flexgraph run ends: leave together, skip the
    # interpreter's teardown (where gloo's threads can abort a finished rank).
    from flexgraph.cli.stopping import end_launched_rank
    from flexgraph.training.runtime import leave_process_group

    leave_process_group()
    end_launched_rank(0)


# -- what a run logged: log lines and scalars.json, beside MMEngine's Runner ------------------

#: Keys that are measured, not computed (MMEngine's timings, its ETA, a GPU's memory):
#: never equal between two runs.
TIMING = ("time", "data_time", "eta", "memory")


def logged_values(line: str) -> dict[str, str]:
    """A log line's ``key: value`` pairs as shown (the same digits on both sides),
    without the timing ones; the line's format around them may differ."""
    pairs = dict(re.findall(r"([\w./]+): (\S+)", line.split(" - INFO - ")[-1]))
    return {key: value for key, value in pairs.items() if key not in TIMING}


def scalars_json(folder: Path) -> list[dict[str, Any]]:
    """``vis_data/scalars.json`` in ``folder`` or in a (timestamped) folder of it, or []."""
    found = sorted(folder.glob("vis_data/scalars.json")) + sorted(
        folder.glob("*/vis_data/scalars.json"))
    return [json.loads(line) for line in found[0].read_text().splitlines()] if found else []


def assert_same_logged_values(mm_scalars: list[dict[str, Any]], fg_scalars: list[dict[str, Any]],
                              mm_lines: list[str], fg_lines: list[str]) -> None:
    """Every scalars.json record and every log line's values equal MMEngine's, in order
    (timings aside; lines with nothing else, such as MMEngine's validation iterations'
    lines, are left out on both sides)."""
    assert fg_scalars and len(fg_scalars) == len(mm_scalars)
    for i, (a, b) in enumerate(zip(mm_scalars, fg_scalars, strict=True)):
        expected = {k: v for k, v in a.items() if k not in TIMING}
        assert b == expected, f"scalars.json line {i}: MMEngine {a}, flexgraph {b}"
    mm_lines, fg_lines = ([line for line in lines if logged_values(line)]
                          for lines in (mm_lines, fg_lines))
    assert fg_lines and len(fg_lines) == len(mm_lines)
    for a, b in zip(mm_lines, fg_lines, strict=True):
        assert logged_values(b) == logged_values(a), f"MMEngine: {a}\nflexgraph: {b}"
