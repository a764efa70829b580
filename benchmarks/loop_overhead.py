"""How much does flexgraph's training loop cost per iteration over a hand-written one?

The workload is deliberately tiny (an MLP step takes about a millisecond on
one CPU thread) so that any per-iteration overhead of the runtime shows.
Three loops train the same model on the same data for the same number of
iterations, in one process, alternating, several repeats:

* ``hand``: ``for x, y in loader: zero_grad / forward / backward / step`` plus
  ``loss.item()`` for logging, as a real hand-written loop does;
* ``flexgraph``: the ``train`` step on artifacts built by the step functions
  (logging every 50 iterations, metrics.jsonl, TensorBoard: all on);
* ``mmengine``: MMEngine's own ``Runner`` with its default hooks, when it can
  run here.

Only the iteration loop is timed: for the runners, from ``before_train`` to
``after_train`` (a hook records both; it overrides no per-iteration point), so
building the model, dataloaders and sinks is excluded. Checkpointing is off for
all three. Run: ``python benchmarks/loop_overhead.py [--iters N] [--repeats R]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.registry import DATASETS, HOOKS, MODELS
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flexgraph.training import steps  # noqa: E402 (needs the checkout on sys.path)

BATCH, FEATURES, CLASSES, SAMPLES = 32, 32, 10, 4096


@DATASETS.register_module(force=True)
class BenchData(torch.utils.data.Dataset):
    """Fixed random features and labels (the same for every loop)."""

    def __init__(self, n: int = SAMPLES) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, FEATURES, generator=g)
        self.y = torch.randint(0, CLASSES, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                         nn.Linear(128, CLASSES))


@MODELS.register_module(force=True)
class BenchMLP(nn.Module):
    """The plain model flexgraph trains: ``forward(x, y)`` returns the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.net = mlp()

    def forward(self, x, y):
        return F.cross_entropy(self.net(x), y)


@MODELS.register_module(force=True)
class BenchBaseModel(BaseModel):
    """The same MLP behind MMEngine's BaseModel contract, for MMEngine's Runner."""

    def __init__(self) -> None:
        super().__init__()
        self.net = mlp()

    def forward(self, x, y, mode="tensor"):
        logits = self.net(x)
        return {"loss": F.cross_entropy(logits, y)} if mode == "loss" else logits


@HOOKS.register_module(force=True)
class LoopTimer(Hook):
    """Records the wall time between ``before_train`` and ``after_train``.

    The result goes to a class attribute because runners build their own
    instance from ``custom_hooks=[dict(type='LoopTimer')]``.
    """

    seconds = float("nan")

    def before_train(self, runner) -> None:
        self._t0 = time.perf_counter()

    def after_train(self, runner) -> None:
        LoopTimer.seconds = time.perf_counter() - self._t0


def hand_written(iters: int) -> float:
    model = BenchMLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader = torch.utils.data.DataLoader(BenchData(), batch_size=BATCH, shuffle=True)
    logged = []
    it = 0
    t0 = time.perf_counter()
    while it < iters:
        for x, y in loader:
            optimizer.zero_grad()
            loss = model(x, y)
            loss.backward()
            optimizer.step()
            logged.append(loss.item())
            it += 1
            if it == iters:
                break
    return time.perf_counter() - t0


def _cfg(work_dir: str, iters: int, model: str) -> dict:
    return dict(
        model=dict(type=model),
        train_dataloader=dict(batch_size=BATCH, num_workers=0, dataset=dict(type="BenchData"),
                              sampler=dict(type="DefaultSampler", shuffle=True)),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01, momentum=0.9)),
        train_cfg=dict(by_epoch=False, max_iters=iters),
        default_hooks=dict(checkpoint=None, logger=dict(type="LoggerHook", interval=50)),
        custom_hooks=[dict(type="LoopTimer")],
        randomness=dict(seed=0),
        work_dir=work_dir,
        log_level="WARNING",
    )


def flexgraph_loop(iters: int, work_dir: str) -> float:
    cfg = Config(_cfg(work_dir, iters, "BenchMLP"))
    env = steps.setup_env(cfg, device="cpu")
    model = steps.init_weights(steps.build_model(cfg, env))
    hooks = steps.build_hooks(cfg)
    checkpointer = steps.build_checkpointer(cfg, env)
    model = steps.wrap_model(env, steps.load_checkpoint(cfg, checkpointer, hooks, model))
    loaders = steps.build_dataloaders(cfg, env)
    ow = steps.build_optim_wrapper(cfg, model)
    schedulers = steps.build_param_schedulers(cfg, ow, loaders["train_dataloader"])
    state = steps.resume(cfg, model, ow, schedulers, checkpointer, hooks,
                         loaders["train_dataloader"])
    steps.train(cfg, env, model, ow, schedulers, loaders["train_dataloader"], None,
                checkpointer, hooks, state)
    return LoopTimer.seconds


def mmengine_loop(iters: int, work_dir: str, run: int) -> float:
    from mmengine.runner import Runner

    cfg = _cfg(work_dir, iters, "BenchBaseModel")
    # MMEngine's BaseModel data path: its own default_collate stacks the tensors.
    cfg["train_dataloader"]["collate_fn"] = dict(type="default_collate")
    Runner(**cfg, experiment_name=f"bench_{run}").train()
    return LoopTimer.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    # One thread: on a small shared machine OpenMP threads oversubscribe the
    # cores and per-step time swings 10x; every loop gets the same setting.
    torch.set_num_threads(1)
    loops = {"hand": lambda i, d: hand_written(args.iters),
             "flexgraph": lambda i, d: flexgraph_loop(args.iters, d),
             "mmengine": lambda i, d: mmengine_loop(args.iters, d, i)}
    times: dict[str, list[float]] = {name: [] for name in loops}
    mmengine_error = None
    with tempfile.TemporaryDirectory() as tmp:
        for name, loop in loops.items():  # warm-up (imports, allocator, first-call costs)
            try:
                loop(-1, f"{tmp}/warm_{name}")
            except Exception as exc:  # noqa: BLE001 (report why, keep benchmarking)
                if name != "mmengine":
                    raise
                mmengine_error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        for run in range(args.repeats):
            for name, loop in loops.items():
                if name == "mmengine" and mmengine_error:
                    continue
                seconds = loop(run, f"{tmp}/{name}_{run}")
                times[name].append(seconds / args.iters * 1e3)

    def summary(name: str) -> str:
        ms = times[name]
        return (f"{name:>10}: median {statistics.median(ms):.4f} ms/iter  "
                f"min {min(ms):.4f}  (runs: {', '.join(f'{t:.3f}' for t in ms)})")

    print(f"{args.iters} iterations x {args.repeats} repeats, batch {BATCH}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} thread")
    for name in loops:
        if times[name]:
            print(summary(name))
    hand = statistics.median(times["hand"])
    print(f"ratio flexgraph/hand (median): {statistics.median(times['flexgraph']) / hand:.3f}"
          f"  (min/min: {min(times['flexgraph']) / min(times['hand']):.3f}; goal <= 1.03)")
    if mmengine_error:
        print(f"mmengine Runner could not run here: {mmengine_error}")
    else:
        print(f"ratio mmengine/hand (median): {statistics.median(times['mmengine']) / hand:.3f}"
              f"  (min/min: {min(times['mmengine']) / min(times['hand']):.3f})")


if __name__ == "__main__":
    main()
