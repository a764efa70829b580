"""How much does flexgraph's training loop cost per iteration over a hand-written one?

The workload (``_tiny.py``) is deliberately tiny (an MLP step takes about a
millisecond on one CPU thread) so that any per-iteration overhead of the
runtime shows. Three loops train the same model on the same data for the same
number of iterations, in one process, alternating, several repeats:

* ``hand``: ``for x, y in loader: zero_grad / forward / backward / step`` plus
  ``loss.item()`` for logging, as a real hand-written loop does;
* ``flexgraph``: the real engine, as ``flexgraph run`` drives it: the config,
  ``make_plan(standard_graph(cfg), get_strategy("single", device="cpu"))`` and
  ``Executor().run(plan, {"cfg": cfg})`` (logging every 50 iterations,
  metrics.jsonl, TensorBoard: all on);
* ``mmengine``: MMEngine's ``FlexibleRunner`` (single device) with its default
  hooks, when it can run here.

Only the iteration loop is timed: for the runners, from ``before_train`` to
``after_train`` (a hook records both; it overrides no per-iteration point), so
planning, building the model, dataloaders and sinks is excluded. Checkpointing
is off for all three, and the log level is WARNING for both runners (their log
lines are still composed every 50 iterations, just not printed).

Both wall time and process CPU time are reported; CPU time is less disturbed by
other processes on a shared machine. The "paired" ratio is the median over
repeats of flexgraph/hand measured back to back, which cancels slow drifts of
the machine's speed; it is the number the goal (<= 1.03) is about. Run::

    python benchmarks/loop_overhead.py [--iters N] [--repeats R] [--skip-mmengine]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.registry import DATASETS, HOOKS, MODELS

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _tiny  # noqa: E402 (this folder is sys.path[0] when run as a script)
from _tiny import BATCH, TinyData, TinyMLP  # noqa: E402

from flexgraph import Executor, get_strategy, make_plan  # noqa: E402
from flexgraph.training import standard_graph  # noqa: E402

REPEATS = 17

MODELS.register_module(module=TinyMLP, force=True)
DATASETS.register_module(module=TinyData, force=True)


@MODELS.register_module(force=True)
class TinyBaseModel(BaseModel):
    """The same MLP behind MMEngine's BaseModel contract, for MMEngine's runner."""

    def __init__(self) -> None:
        super().__init__()
        self.net = _tiny.mlp()

    def forward(self, x, y, mode="tensor"):
        logits = self.net(x)
        return {"loss": F.cross_entropy(logits, y)} if mode == "loss" else logits


@HOOKS.register_module(force=True)
class LoopTimer(Hook):
    """Records the wall and CPU time between ``before_train`` and ``after_train``.

    The result goes to a class attribute because runners build their own
    instance from ``custom_hooks=[dict(type='LoopTimer')]``.
    """

    seconds = (float("nan"), float("nan"))

    def before_train(self, runner) -> None:
        self._t0 = _clocks()

    def after_train(self, runner) -> None:
        LoopTimer.seconds = _since(self._t0)


def _clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _since(t0: tuple[float, float]) -> tuple[float, float]:
    """(wall, CPU) seconds since ``t0``. CPU time counts this process's threads only,
    so it is robust to other processes competing for the cores."""
    wall, cpu = _clocks()
    return wall - t0[0], cpu - t0[1]


def hand_written(iters: int) -> tuple[float, float]:
    torch.manual_seed(0)
    model = TinyMLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader = torch.utils.data.DataLoader(TinyData(iters * BATCH), batch_size=BATCH,
                                         shuffle=True)
    logged = []
    t0 = _clocks()
    for x, y in loader:
        optimizer.zero_grad()
        loss = model(x, y)
        loss.backward()
        optimizer.step()
        logged.append(loss.item())
    return _since(t0)


def _cfg(work_dir: str, iters: int, model: str) -> dict:
    return _tiny.config(work_dir, iters, model=model, custom_hooks=[dict(type="LoopTimer")])


def flexgraph_loop(iters: int, work_dir: str) -> tuple[float, float]:
    """What ``flexgraph run`` does with the config, minus the CLI's printing."""
    cfg = Config(_cfg(work_dir, iters, "TinyMLP"))
    # device="cpu": the hand loop trains on the CPU, so flexgraph must too even
    # where CUDA is available (the strategy's default).
    plan = make_plan(standard_graph(cfg), get_strategy("single", device="cpu"))
    Executor().run(plan, {"cfg": cfg})
    return LoopTimer.seconds


def mmengine_loop(iters: int, work_dir: str, run: int) -> tuple[float, float]:
    """MMEngine's FlexibleRunner (the runner flexgraph succeeds), single device."""
    from mmengine.runner import FlexibleRunner

    cfg = _cfg(work_dir, iters, "TinyBaseModel")
    # MMEngine's BaseModel data path: its own default_collate stacks the tensors.
    cfg["train_dataloader"]["collate_fn"] = dict(type="default_collate")
    FlexibleRunner(**cfg, strategy=dict(type="SingleDeviceStrategy"),
                   experiment_name=f"bench_{run}").train()
    return LoopTimer.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--skip-mmengine", action="store_true",
                        help="compare flexgraph with the hand-written loop only (faster "
                             "alternation, so less exposed to drifts of machine speed)")
    args = parser.parse_args()
    # One thread: on a small shared machine OpenMP threads oversubscribe the
    # cores and per-step time swings 10x; every loop gets the same setting.
    torch.set_num_threads(1)
    loops = {"hand": lambda i, d: hand_written(args.iters),
             "flexgraph": lambda i, d: flexgraph_loop(args.iters, d),
             "mmengine": lambda i, d: mmengine_loop(args.iters, d, i)}
    if args.skip_mmengine:
        del loops["mmengine"]
    wall: dict[str, list[float]] = {name: [] for name in loops}
    cpu: dict[str, list[float]] = {name: [] for name in loops}
    mmengine_error = None
    with tempfile.TemporaryDirectory() as tmp:
        for name, loop in loops.items():  # warm-up (imports, allocator, first-call costs)
            try:
                loop(-1, f"{tmp}/warm_{name}")
            except Exception as exc:  # noqa: BLE001 (report why, keep benchmarking)
                if name != "mmengine":
                    raise
                mmengine_error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        if mmengine_error:
            del loops["mmengine"]
        for run in range(args.repeats):
            order = list(loops) if run % 2 == 0 else list(reversed(loops))  # alternate
            for name in order:
                gc.collect()  # the previous loop's garbage is not this loop's to collect
                seconds_wall, seconds_cpu = loops[name](run, f"{tmp}/{name}_{run}")
                wall[name].append(seconds_wall / args.iters * 1e3)
                cpu[name].append(seconds_cpu / args.iters * 1e3)

    print(f"{args.iters} iterations x {args.repeats} repeats, batch {BATCH}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} thread, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for name in loops:
        print(f"{name:>10}: median wall {statistics.median(wall[name]):.4f} ms/iter, "
              f"median CPU {statistics.median(cpu[name]):.4f} ms/iter")
        print(textwrap.fill(" ".join(f"{t:.3f}" for t in wall[name]), width=100,
                            initial_indent=f"{'':>12}wall runs: ", subsequent_indent=" " * 23))
    if mmengine_error:
        print(f"mmengine FlexibleRunner could not run here: {mmengine_error}"[:100])
    for name in sorted((n for n in loops if n != "hand"), key="flexgraph".__eq__):  # it last
        paired = [a / b for a, b in zip(cpu[name], cpu["hand"], strict=True)]
        print(f"ratio {name}/hand: wall {_ratio(wall, name)}, CPU {_ratio(cpu, name)}, "
              f"median of paired CPU ratios {statistics.median(paired):.3f}"
              + ("  (goal <= 1.03)" if name == "flexgraph" else ""))


def _ratio(times: dict[str, list[float]], name: str) -> str:
    return f"{statistics.median(times[name]) / statistics.median(times['hand']):.3f}"


if __name__ == "__main__":
    main()
